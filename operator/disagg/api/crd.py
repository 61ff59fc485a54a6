"""Generate the DisaggregatedModel CRD from the pydantic models.

pydantic emits JSON Schema (2020-12); Kubernetes wants a *structural* OpenAPI v3 schema. This module
inlines ``$ref``s, turns ``Optional[X]`` into plain ``X`` (absent means unset), maps JSON-Schema-only
keywords to their OpenAPI v3.0 forms, and turns nested-object defaults into ``default: {}`` so the
apiserver fills in every child default (what ``kubectl get -o yaml`` then shows). The cross-field rules of
rules.py become the ``x-kubernetes-validations`` of their models' nodes.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from . import models as m
from .base import nested_model
from .rules import rules_for

_DROP = {"title", "$defs", "discriminator"}


def _resolve(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, list):
        return [_resolve(s, defs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target = copy.deepcopy(defs[schema["$ref"].split("/")[-1]])
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        target.update(siblings)  # a field's own description wins over the model's docstring
        return _resolve(target, defs)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP:
            continue
        if key in ("properties",):
            out[key] = {name: _resolve(sub, defs) for name, sub in value.items()}
        elif key == "default":
            out[key] = value  # literal value: never rewrite
        else:
            out[key] = _resolve(value, defs)
    return out


def _structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one (already inlined) node and its children into a structural OpenAPI v3 schema."""
    if schema.get("x-kubernetes-int-or-string"):
        return dict(schema)  # no type: the extension says integer or string
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf {schema['anyOf']} structurally")
        merged = {k: v for k, v in schema.items() if k != "anyOf"}
        merged = {**branches[0], **merged}
        if merged.get("default", ...) is None:
            merged.pop("default")
        return _structural(merged)
    out = dict(schema)
    if "const" in out:
        out["enum"] = [out.pop("const")]
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if bound in out and not isinstance(out[bound], bool):
            out["minimum" if bound == "exclusiveMinimum" else "maximum"] = out[bound]
            out[bound] = True
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("additionalProperties", None)
        out["type"] = out.get("type", "object")
        return out
    if out.get("type") == "object":
        if out.get("additionalProperties") is False or (
            "properties" in out and "additionalProperties" in out
        ):
            out.pop("additionalProperties")  # the apiserver prunes unknown fields; kubectl rejects them (strict)
        if "properties" in out:
            out["properties"] = {k: _structural(v) for k, v in out["properties"].items()}
        if isinstance(out.get("additionalProperties"), dict):
            out["additionalProperties"] = _structural(out["additionalProperties"])
        elif out.get("additionalProperties") is True:
            out.pop("additionalProperties")
            out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "array" and "items" in out:
        out["items"] = _structural(out["items"])
    if out.get("type") == "string" and "enum" in out and "maxLength" in out:
        out.pop("maxLength")
    return out


def _object_defaults(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Give every field with a default factory its materialized default (recursively).

    The apiserver evaluates CEL rules against a default value as written (it does not default the
    default's children first), so sub-object defaults are the full pydantic default, not ``{}``.
    """
    props = schema.get("properties", {})
    for name, field in model.model_fields.items():
        sub = props.get(field.alias or name)
        if sub is None:
            continue
        if field.default_factory is not None and "default" not in sub:
            value = field.get_default(call_default_factory=True)
            sub["default"] = (
                value.model_dump(by_alias=True, exclude_none=True, mode="json")
                if isinstance(value, BaseModel)
                else value
            )
        inner, is_list = nested_model(field.annotation)
        if inner is not None and not is_list:
            _object_defaults(inner, sub)
        elif inner is not None and sub.get("type") == "array" and isinstance(sub.get("items"), dict):
            _object_defaults(inner, sub["items"])


class _WithCelRules(GenerateJsonSchema):
    """pydantic's JSON Schema, plus each model's cross-field rules (rules.py) as ``x-kubernetes-validations``."""

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        out = super().model_schema(schema)
        rules = rules_for(schema["cls"])
        if rules:
            out["x-kubernetes-validations"] = [r.validation() for r in rules]
        return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_WithCelRules)
    resolved = _resolve(raw, raw.get("$defs", {}))
    structural = _structural(resolved)
    _object_defaults(model, structural)
    return structural


_READY = '.status.conditions[?(@.type=="Ready")]'
# What an on-call engineer reads first; priority 1 columns show with `kubectl get dm -o wide`.
PRINTER_COLUMNS = [
    {"name": "Mode", "type": "string", "jsonPath": ".status.activeMode", "description": "Active serving mode."},
    {"name": "Ready", "type": "string", "jsonPath": f"{_READY}.status", "description": "The Ready condition."},
    {
        "name": "Prefill",
        "type": "string",
        "jsonPath": ".status.pools.prefill.summary",
        "description": "Prefill pool ready/desired replicas.",
    },
    {
        "name": "Decode",
        "type": "string",
        "jsonPath": ".status.pools.decode.summary",
        "description": "Decode pool ready/desired replicas.",
    },
    {
        "name": "TTFT-P95",
        "type": "number",
        "jsonPath": ".status.observed.ttftP95Ms",
        "description": "Observed p95 time to first token (ms).",
    },
    {
        "name": "TPOT-P95",
        "type": "number",
        "jsonPath": ".status.observed.tpotP95Ms",
        "description": "Observed p95 time per output token (ms).",
    },
    {
        "name": "Goodput",
        "type": "number",
        "jsonPath": ".status.observed.goodput",
        "description": "Share of requests meeting both SLOs.",
    },
    {"name": "Reason", "type": "string", "priority": 1, "jsonPath": f"{_READY}.reason",
     "description": "Why Ready is what it is."},
    {"name": "Spec-Mode", "type": "string", "priority": 1, "jsonPath": ".spec.mode",
     "description": "The requested mode (Mode is the one in force)."},
    {"name": "Transport", "type": "string", "priority": 1, "jsonPath": ".spec.kvTransfer.transport",
     "description": "KV-cache transport."},
    {"name": "Prefill-Scaled", "type": "date", "priority": 1, "jsonPath": ".status.pools.prefill.lastScale.time",
     "description": "When the prefill pool was last scaled."},
    {"name": "Decode-Scaled", "type": "date", "priority": 1, "jsonPath": ".status.pools.decode.lastScale.time",
     "description": "When the decode pool was last scaled."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    spec_schema = openapi_schema(m.DisaggregatedModelSpec)
    spec_schema["description"] = "Desired state of a model served with prefill/decode disaggregation."
    status_schema = openapi_schema(m.DisaggregatedModelStatus)
    status_schema["description"] = "Observed state, written by the operator."
    status_schema["properties"]["conditions"]["x-kubernetes-list-type"] = "map"
    status_schema["properties"]["conditions"]["x-kubernetes-list-map-keys"] = ["type"]
    status_schema["properties"]["conditions"]["items"]["required"] = ["type", "status"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{m.PLURAL}.{m.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "disagg"},
        },
        "spec": {
            "group": m.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": m.KIND,
                "listKind": f"{m.KIND}List",
                "plural": m.PLURAL,
                "singular": m.SINGULAR,
                "shortNames": m.SHORT_NAMES,
                "categories": ["all", "disagg"],
            },
            "versions": [
                {
                    "name": m.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A large language model served by vLLM with prefill/decode "
                            "disaggregation: a prefill pool, a decode pool, KV-cache transfer between them, "
                            "and a router that decides per request between remote and local prefill.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version of this object."},
                                "kind": {"type": "string", "description": "Kind of this object."},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


HEADER = "# Generated by `disagg crds` from the models in operator/disagg/api/. Do not edit by hand.\n"


def render_crd_yaml() -> str:
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=120, allow_unicode=True)
