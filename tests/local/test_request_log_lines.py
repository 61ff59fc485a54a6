"""The harnesses read the router's request log from a container log the router is still writing
(local/harness.py ``request_log_lines``): a line being written when the file is read is not read yet."""

from __future__ import annotations

from pathlib import Path

import orjson

from disagg.local.harness import request_log_lines


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    first = {"event": "request", "request_id": "a", "decode_worker": "http://127.0.0.1:8000"}
    second = {"event": "request", "request_id": "b", "decode_worker": "http://127.0.0.2:8000"}
    log = tmp_path / "container.log"
    whole = orjson.dumps(second) + b"\n"
    log.write_bytes(b"router starting\n" + orjson.dumps(first) + b"\n" + whole[:40])  # the router mid-write
    assert request_log_lines([log, tmp_path / "gone.log"]) == {"a": first}
    log.write_bytes(b"router starting\n" + orjson.dumps(first) + b"\n" + whole)
    assert request_log_lines([log]) == {"a": first, "b": second}
