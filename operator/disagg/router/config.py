"""The router's config: RouterConfig (api/contract.py) from a YAML file, reloaded when it changes.

The file is what the operator writes into the router's ConfigMap (key ``router.yaml``); in a pod it is the
mounted ConfigMap (the kubelet swaps a symlink, so the router polls the file's content, not only its mtime).
A bad file keeps the last good config (and counts a failed reload). Requests read the config once, at
decision time: a reload never affects a request in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import yaml

from .. import logs
from ..api.contract import RouterConfig

log = logs.get("disagg.router.config")


def parse_config(text: str) -> RouterConfig:
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError("router config must be a YAML mapping")
    return RouterConfig.model_validate(data)


def load_config(path: str | os.PathLike[str]) -> RouterConfig:
    return parse_config(Path(path).read_text())


class ConfigWatcher:
    """Holds the current RouterConfig; polls ``path`` every ``interval`` seconds and swaps it atomically."""

    def __init__(self, path: str | os.PathLike[str] | None, initial: RouterConfig | None = None,
                 interval: float = 1.0, on_reload: Callable[[bool], None] | None = None) -> None:
        self.path = Path(path) if path else None
        self.interval = interval
        self.on_reload = on_reload
        self._stamp: tuple[int, int] | None = None
        self._digest: str | None = None
        self.config = initial or RouterConfig()
        self.generation = 0
        if self.path is not None:
            self.config = load_config(self.path)  # a bad file at start is an error (fail fast)
            self._remember()

    def _remember(self) -> None:
        assert self.path is not None
        st = self.path.stat()
        self._stamp = (st.st_mtime_ns, st.st_size)
        self._digest = hashlib.sha256(self.path.read_bytes()).hexdigest()

    def check(self) -> bool:
        """Reload if the file changed; True when a new config took effect."""
        if self.path is None:
            return False
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            data = self.path.read_bytes() if stamp != self._stamp or os.path.islink(self.path) else None
        except OSError as e:
            log.warning("config_unreadable", path=str(self.path), error=str(e))
            return False
        if data is None:
            return False
        digest = hashlib.sha256(data).hexdigest()
        self._stamp = stamp
        if digest == self._digest:
            return False
        try:
            cfg = parse_config(data.decode())
        except Exception as e:  # noqa: BLE001 - keep the last good config on any error
            self._digest = digest
            log.error("config_reload_failed", path=str(self.path), error=str(e))
            if self.on_reload:
                self.on_reload(False)
            return False
        self._digest = digest
        self.config = cfg
        self.generation += 1
        log.info("config_reloaded", path=str(self.path), generation=self.generation,
                 mode=cfg.effective_mode().value)
        if self.on_reload:
            self.on_reload(True)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()
