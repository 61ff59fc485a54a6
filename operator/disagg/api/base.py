"""Shared pydantic base for the DisaggregatedModel API.

Field names are snake_case in Python and camelCase on the wire (Kubernetes API conventions);
acronyms keep their capitals on the wire where Kubernetes does (``onKVTransferTimeout``).
Every field carries a description: it is what ``kubectl explain`` prints.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One CEL rule for ``x-kubernetes-validations``; the message always names the field."""
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


class ApiModel(BaseModel):
    """Base for every API object: camelCase aliases, unknown fields refused, defaults validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        use_attribute_docstrings=False,
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the apiserver would store it (camelCase, no unset optionals)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def with_validations(*rules: dict[str, str], **extra: Any) -> dict[str, Any]:
    """json_schema_extra for a model: its CEL rules plus any other x-kubernetes-* keys."""
    out: dict[str, Any] = dict(extra)
    if rules:
        out["x-kubernetes-validations"] = list(rules)
    return out
