"""Log lines stay whole when several processes share one unbuffered stream (the router's --workers N)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WRITER = """
import sys
from disagg import logs
logs.configure("INFO")
log = logs.get("t")
for i in range(400):
    log.info("line", n=i, who=sys.argv[1], pad="x" * 900)
"""


def test_concurrent_processes_never_interleave_a_json_line(tmp_path: Path) -> None:
    out = tmp_path / "shared.log"
    with out.open("w") as f:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(k)], stderr=f, env=env) for k in range(3)]
        assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    lines = out.read_text().splitlines()
    assert len(lines) == 1200
    parsed = [json.loads(line) for line in lines]  # a torn or merged line fails here
    assert sorted((p["who"], p["n"]) for p in parsed) == sorted((str(k), i) for k in range(3) for i in range(400))
