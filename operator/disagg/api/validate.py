"""Offline validation of DisaggregatedModel documents with the same rules the apiserver enforces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .models import DisaggregatedModel


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def errors_of(doc: dict[str, Any]) -> list[str]:
    """Every problem with one document, each naming its field (e.g. ``spec.prefill.minReplicas: …``)."""
    try:
        DisaggregatedModel.model_validate(doc)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            where = _loc(tuple(p for p in err["loc"] if not str(p).startswith("function-after")))
            msg = err["msg"].removeprefix("Value error, ")
            out.append(msg if msg.startswith("spec.") else f"{where}: {msg}")
        return out
    return []


def validate_documents(path: Path) -> Iterator[tuple[str, list[str]]]:
    for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
        if doc is None:
            continue
        name = (doc.get("metadata") or {}).get("name", f"#{i}")
        yield f"{path}:{name}", errors_of(doc)
