"""Structured JSON logs (structlog) for every disagg process."""

from __future__ import annotations

import json as _json
import logging
import sys
from collections.abc import Callable
from typing import Any

import orjson
import structlog
from structlog.typing import Processor

_ORJSON_OPTS = orjson.OPT_NON_STR_KEYS


def _dumps(obj: Any, default: Callable[[Any], Any] | None = None, **kw: Any) -> str:
    """structlog's serializer: orjson (several times cheaper than json.dumps), str out for the text loggers.

    Same keys and values as the stdlib serializer; what orjson refuses (an int beyond 64 bits) goes to json.dumps.
    """
    try:
        return orjson.dumps(obj, default=default, option=_ORJSON_OPTS).decode()
    except TypeError:
        return _json.dumps(obj, default=default, **kw)


class LineLogger(structlog.PrintLogger):
    """structlog's PrintLogger, but each line goes out in ONE write (message and newline together). ``print`` writes
    them separately, so with an unbuffered stream (PYTHONUNBUFFERED, as our images set) processes that share it —
    the workers of ``disagg router --workers N`` — interleave their lines into invalid JSON."""

    def msg(self, message: str) -> None:
        with self._lock:
            self._file.write(message + "\n")
            self._file.flush()

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class LineLoggerFactory(structlog.PrintLoggerFactory):
    def __call__(self, *_args: Any) -> LineLogger:  # structlog passes the logger's name; one stream serves all
        return LineLogger(self._file)


def configure(level: str = "INFO", json: bool = True) -> None:
    """One JSON object per line on stderr; stdlib logging (kopf, aiohttp) routed through the same renderer."""
    renderer = (structlog.processors.JSONRenderer(serializer=_dumps) if json
                else structlog.dev.ConsoleRenderer(colors=False))
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=LineLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer])
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def get(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
