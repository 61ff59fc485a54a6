"""The router's config: RouterConfig (api/contract.py) from a YAML file, reloaded when it changes.

The file is what the operator writes into the router's ConfigMap (key ``router.yaml``); in a pod it is the
mounted ConfigMap (the kubelet swaps a symlink, so the router polls the file's content, not only its mtime).
A bad file keeps the last good config (and counts a failed reload). Requests read the config once, at
decision time: a reload never affects a request in flight.

In cluster mode the router also watches its ConfigMap through the API (configwatch.py) and hands each new
``router.yaml`` to :meth:`ConfigWatcher.apply_text`, the same validation path. While that watch is live
(``api_active``) the file is only tracked, not applied: the kubelet refreshes the mount up to about a minute
late, and a stale file must not undo a newer config. When the watch is down the file poll applies changes again.
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
        self._digest: str | None = None  # the file's content, as last read
        self._applied: str | None = None  # the content behind self.config (or the last rejected one), any source
        self.api_active = False  # the ConfigMap watch is live: it, not the file, is the source
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
        self._applied = self._digest

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
        self._digest = digest
        if self.api_active:
            return False  # the API watch is the source; the mount lags behind it
        return self._apply(data, digest, str(self.path))

    def apply_text(self, text: str, source: str = "api") -> bool:
        """Apply a ``router.yaml`` from another source (the ConfigMap watch); True when a new config took effect.
        The same content twice is applied once; a bad one keeps the last good config and counts a failed reload."""
        data = text.encode()
        return self._apply(data, hashlib.sha256(data).hexdigest(), source)

    def _apply(self, data: bytes, digest: str, source: str) -> bool:
        if digest == self._applied:
            return False
        self._applied = digest
        try:
            cfg = parse_config(data.decode())
        except Exception as e:  # noqa: BLE001 - keep the last good config on any error
            log.error("config_reload_failed", source=source, error=str(e))
            if self.on_reload:
                self.on_reload(False)
            return False
        self.config = cfg
        self.generation += 1
        log.info("config_reloaded", source=source, generation=self.generation, mode=cfg.effective_mode().value)
        if self.on_reload:
            self.on_reload(True)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()
