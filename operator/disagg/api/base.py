"""Shared pydantic base for the DisaggregatedModel API.

Field names are snake_case in Python and camelCase on the wire (Kubernetes API conventions);
acronyms keep their capitals on the wire where Kubernetes does (``onKVTransferTimeout``).
Every field carries a description: it is what ``kubectl explain`` prints.
"""

from __future__ import annotations

from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


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



DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of a Secret in the model's namespace.")
    key: str = Field(default="token", min_length=1, max_length=253, description="Key within the Secret.")


def nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """``(Model, is_list)`` for a field typed ``Model``, ``Model | None`` or ``list[Model]``; ``(None, False)``
    for any other type (scalars, dicts, free-form objects)."""
    if get_origin(annotation) in (Union, UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else None
    is_list = get_origin(annotation) is list
    if is_list:
        annotation = get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, is_list
    return None, False
