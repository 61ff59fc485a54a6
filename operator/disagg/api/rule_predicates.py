"""The predicates and CEL fragments of the spec's cross-field rules (api/rules.py's table): a rule's Python condition
and its CEL expression are written from the same constants here, so the two cannot drift apart."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .flags import RESERVED_ARG_PATTERN, RESERVED_FLAGS, RESERVED_SHORT_FLAGS, sets_reserved_flag
from .spec import PoolSpec, TenantPolicy, TracingSpec


def tenant_overrides_ordered(t: TenantPolicy) -> bool:
    rp, lp = t.remote_prefill, t.local_prefill
    if rp is None or rp.min_input_tokens is None or lp is None or lp.max_input_tokens is None:
        return True
    return rp.min_input_tokens > lp.max_input_tokens


def unique(names: Sequence[str]) -> bool:
    return len(names) == len(set(names))


def _extra_args_message() -> str:
    """The extraArgs rule's message: each flag the operator owns and where it comes from (from api/flags.py)."""
    shorts = {long: short for short, long in RESERVED_SHORT_FLAGS.items()}
    owned = [f"{flag}{'/' + shorts[flag] if flag in shorts else ''}: {source.split(' (')[0]}"
             for flag, source in RESERVED_FLAGS.items() if source.startswith("spec.")]
    banned = [flag for flag, source in RESERVED_FLAGS.items() if not source.startswith("spec.")]
    return ("extraArgs must not set a flag the operator owns, in any spelling (--flag=value, underscores, dotted "
            f"sub-keys such as --kv-transfer-config.kv_role): set the spec field instead ({'; '.join(owned)}); "
            f"{', '.join(banned[:-1])} and {banned[-1]} are not allowed")


EXTRA_ARGS_CEL = f"self.extraArgs.all(a, !a.matches('{RESERVED_ARG_PATTERN}'))"
EXTRA_ARGS_MESSAGE = _extra_args_message()


def extra_args_free(args: Sequence[str]) -> bool:
    return not any(sets_reserved_flag(a) for a in args)


def matches(pattern: str, text: str) -> bool:
    """CEL's ``text.matches(pattern)`` (RE2, unanchored search): RE2's ``$`` matches only at the end of the text,
    Python's also before a final newline."""
    return re.search(pattern.removesuffix("$") + r"\Z" if pattern.endswith("$") else pattern, text) is not None


def count_or_percent(v: int | str, percent: str, most: int) -> bool:
    """A count in [0, most], or a string matching ``percent`` (the CEL below, in Python)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return 0 <= v <= most
    return isinstance(v, str) and matches(percent, v)


def zero(v: int | str) -> bool:
    if isinstance(v, int) and not isinstance(v, bool):
        return v == 0
    return isinstance(v, str) and matches(ZERO_PERCENT, v)


SURGE_PERCENT = "^[0-9]{1,3}%$"
UNAVAILABLE_PERCENT = "^(100|[1-9]?[0-9])%$"
ZERO_PERCENT = "^0+%$"
MOST_WORKERS = 1000


def int_or_percent_cel(field: str, percent: str) -> str:
    return (f"type(self.{field}) == int ? (self.{field} >= 0 && self.{field} <= {MOST_WORKERS}) "
            f": self.{field}.matches('{percent}')")


def zero_cel(field: str) -> str:
    return f"(type(self.{field}) == int ? self.{field} == 0 : self.{field}.matches('{ZERO_PERCENT}'))"


LAYOUT_CEL = "(self.parallelism.tensor * self.parallelism.pipeline * self.parallelism.data)"


def layout(p: PoolSpec) -> int:
    """GPUs of one replica: tensor × pipeline × data."""
    return p.parallelism.tensor * p.parallelism.pipeline * p.parallelism.data


# an OTLP endpoint with no path (http(s)://host[:port], a final / at most), and one on OTLP/HTTP's port 4318
OTLP_NO_PATH = "^https?://[^/]+/?$"
OTLP_HTTP_PORT_NO_PATH = "^https?://[^/]+:4318/?$"
# an HTTP field name as multi-tenant stores use them (RFC 9110 token, narrowed to letters, digits and -)
HEADER_NAME = "^[A-Za-z0-9][A-Za-z0-9-]*$"


def otlp_http_has_path(t: TracingSpec) -> bool:
    http = t.protocol == "http/protobuf" if t.protocol is not None else matches(OTLP_HTTP_PORT_NO_PATH, t.endpoint)
    return not http or not matches(OTLP_NO_PATH, t.endpoint)
