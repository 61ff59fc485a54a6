"""A real Prometheus (Debian's package) on loopback, scraping targets listed in a file_sd file.

Targets can be changed while it runs (:meth:`LocalPrometheus.set_targets`); Prometheus re-reads the file on
change. Used by tests and the demo; stopped (process group killed, temp dir removed) by :meth:`stop`.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..poll import WaitTimeoutError
from .controlplane import REPO_ROOT
from .procs import free_ports, stop_group, tail_lines, wait_http

ENSURE_SCRIPT = REPO_ROOT / "hack" / "ensure-prometheus.sh"


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    proc = subprocess.run(["bash", str(ENSURE_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{ENSURE_SCRIPT} failed ({proc.returncode}); install Debian's prometheus package")
    return proc.stdout.strip().splitlines()[-1]


@dataclass
class Target:
    address: str  # host:port
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class LocalPrometheus:
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    rule_files: list[Path] = field(default_factory=list)
    # Prometheus' own web configuration (--web.config.file: tls_server_config, basic_auth_users), for tests of
    # clients that reach a secured Prometheus; with TLS the URL is https:// and ``ca_file`` verifies it, and
    # ``ready_headers`` (credentials) go with the readiness polls.
    web_config: dict[str, Any] | None = None
    ca_file: Path | None = None
    ready_headers: dict[str, str] | None = None
    url: str = ""
    _proc: subprocess.Popen[bytes] | None = None
    _tmp: Path | None = None

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def targets_file(self) -> Path:
        assert self._tmp is not None
        return self._tmp / "targets.json"

    def start(self, targets: list[Target] | None = None, timeout: float = 60.0) -> None:
        prometheus_binary()  # installed (hack/ensure-prometheus.sh) before anything else
        self._tmp = Path(tempfile.mkdtemp(prefix="disagg-prom-"))
        atexit.register(self.stop)
        self.set_targets(targets or [])
        config = {
            "global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                       "evaluation_interval": self.evaluation_interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{
                "job_name": "disagg",
                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}],
            }],
        }
        (self._tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        (port,) = free_ports(1)
        tls = bool(self.web_config and self.web_config.get("tls_server_config"))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        if self.web_config is not None:
            (self._tmp / "web.yml").write_text(yaml.safe_dump(self.web_config))
        self._launch(timeout)

    def _launch(self, timeout: float) -> None:
        assert self._tmp is not None
        port = self.url.rsplit(":", 1)[1]
        with open(self._tmp / "prometheus.log", "ab") as log:
            self._proc = subprocess.Popen(
                [prometheus_binary(), f"--config.file={self._tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self._tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                 "--web.enable-lifecycle", "--log.level=warn", "--storage.tsdb.retention.time=2h",
                 *([f"--web.config.file={self._tmp / 'web.yml'}"] if self.web_config is not None else [])],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        try:
            wait_http(f"{self.url}/-/ready", timeout, self._proc, interval=0.2, context=context,
                      headers=self.ready_headers)
        except RuntimeError as e:
            raise RuntimeError(f"prometheus exited {self._proc.returncode}: {self.log_tail()}") from e
        except WaitTimeoutError as e:
            raise RuntimeError(f"prometheus not ready after {timeout}s: {self.log_tail()}") from e

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def pause(self) -> None:
        """Stop the server (an outage), keeping its URL, config and data: :meth:`resume` starts it again."""
        stop_group(self._proc, grace=10)
        self._proc = None

    def resume(self, timeout: float = 60.0) -> None:
        """Start the server again after :meth:`pause`, on the same address and with the same data."""
        assert self._tmp is not None and self.url, "start() first"
        self._launch(timeout)

    def set_targets(self, targets: list[Target]) -> None:
        groups = [{"targets": [t.address], "labels": t.labels} for t in targets]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.targets_file)  # atomic: Prometheus never reads a half-written file

    def log_tail(self, lines: int = 20) -> str:
        return tail_lines(self._tmp / "prometheus.log" if self._tmp else None, lines)

    def stop(self) -> None:
        stop_group(self._proc, grace=10)
        self._proc = None
        if self._tmp and self._tmp.exists():
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None
