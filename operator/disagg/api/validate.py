"""Offline validation of DisaggregatedModel documents: what the apiserver does on create, then what the operator does.

``problems(doc)`` reports every error of one document in one pass, each naming its field, in three stages:

1. **The object** (the apiserver's ObjectMeta validation): ``apiVersion``/``kind``; ``metadata.name`` required and
   a DNS-1123 subdomain (≤ 253 characters), ``metadata.namespace`` a DNS-1123 label; unknown metadata fields.
2. **The CRD's structural schema**, walked from the ``openAPIV3Schema`` that ``crd.build_crd`` generates (so the
   same source as the installed CRD): types, enums, bounds, lengths, patterns, item counts, required fields.
   *Unknown fields are errors*, with the nearest known name suggested (``spec.prefill.max_num_seqs: unknown field;
   did you mean maxNumSeqs?``): the apiserver prunes them silently unless the client asks for strict field
   validation, which ``kubectl apply``/``create`` do by default (``--validate=strict``, ``fieldValidation=Strict``),
   and a dropped field is a setting the user believes applied. ``null`` is an absent field (the apiserver prunes
   nulls of non-nullable fields), ``status`` is ignored (the status subresource drops it on create), and absent
   fields take the schema's defaults, as the apiserver defaults before it validates.
3. **Every CEL rule** (``x-kubernetes-validations``) of the schema, evaluated with its row's Python predicate in
   ``rules.RULES`` on the defaulted node, worded as the apiserver words it. The apiserver skips every rule when the
   object has a "blocking" error (a wrong type, a missing required field, a value outside an enum, a string or list
   too long) and says "some validation rules were not checked"; here a rule is skipped only on a node whose own
   subtree has a type error (or when it reads a missing required field), so one pass also reports what the
   apiserver would say once those are fixed.

Then, **the operator's checks** (semantics.py), which the apiserver does not make: every ``extraArgs`` list against
the flags the operator owns (``flags.extra_args_errors``: the items the CRD's CEL rule does not already refuse, i.e.
argparse's abbreviations and items vLLM cannot read as one option), and, when the spec passed the schema and the
rules, the rest of ``semantics.model_errors`` (podTemplate overrides, ports, the vLLM release, multi-node pools, the
children's names): what the operator reports as ``Ready=False`` reason ``InvalidSpec``, before it builds anything.
The cluster is not known offline: a LeaderWorkerSet back end is checked as on a cluster without its CRD (as
``disagg render`` renders). These carry ``OPERATOR_NOTE``: ``kubectl apply`` succeeds and the model then reports
InvalidSpec.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from .base import nested_model
from .rules import RULES, Rule

Source = Literal["apiserver", "operator"]

OPERATOR_NOTE = "[operator: the apiserver accepts this; the operator refuses it with Ready=False reason InvalidSpec]"

# k8s.io/apimachinery/pkg/util/validation: IsDNS1123Subdomain, IsDNS1123Label.
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*\Z")
DNS1123_LABEL = re.compile(rf"^{_DNS1123_LABEL}\Z")
OBJECT_META_FIELDS = (
    "name", "generateName", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences", "finalizers",
    "managedFields", "selfLink",
)
_JSON_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


@dataclass(frozen=True)
class Problem:
    """One error: the field it names, what is wrong, and who refuses it (the apiserver, or only the operator)."""

    field: str
    message: str
    source: Source = "apiserver"

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        return f"{text} {OPERATOR_NOTE}" if self.source == "operator" else text


@functools.cache
def _schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema (read only) and the index of its spec's field names."""
    from .crd import build_crd  # crd.py imports models.py, which imports this package's modules

    root: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


@functools.cache
def _spec_fields() -> dict[str, list[str]]:
    return _field_index(_schema()["properties"]["spec"], "spec", {})


# ------------------------------------------------------------------------------------------- the object


def _object_problems(doc: dict[str, Any]) -> list[Problem]:
    from .models import API_VERSION, KIND

    out: list[Problem] = []
    if doc.get("apiVersion") != API_VERSION:
        out.append(Problem("apiVersion", f"must be {API_VERSION}, not {doc.get('apiVersion')!r}"))
    if doc.get("kind") != KIND:
        out.append(Problem("kind", f"must be {KIND}, not {doc.get('kind')!r}"))
    meta = doc.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        return [*out, Problem("metadata", f"must be of type object, not {_type_name(meta)}")]
    for key in meta:
        if key not in OBJECT_META_FIELDS:
            out.append(Problem(f"metadata.{key}", _unknown(key, OBJECT_META_FIELDS)))
    name = meta.get("name")
    if name is None or name == "":
        if not meta.get("generateName"):
            out.append(Problem("metadata.name", "Required value: name or generateName is required"))
    elif not isinstance(name, str):
        out.append(Problem("metadata.name", f"must be of type string, not {_type_name(name)}"))
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        out.append(Problem("metadata.name", f"Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of "
                                            "lower case alphanumeric characters, '-' or '.', must start and end with "
                                            "an alphanumeric character, and be at most 253 characters"))
    namespace = meta.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or len(namespace) > 63
                                  or not DNS1123_LABEL.match(namespace)):
        out.append(Problem("metadata.namespace", f"Invalid value: {namespace!r}: a lowercase RFC 1123 label (at most "
                                                 "63 lower case alphanumeric characters or '-')"))
    for key in ("labels", "annotations"):
        values = meta.get(key)
        if values is None:
            continue
        if not isinstance(values, dict):
            out.append(Problem(f"metadata.{key}", f"must be of type object, not {_type_name(values)}"))
            continue
        for k, v in values.items():
            if not isinstance(v, str):
                out.append(Problem(f"metadata.{key}.{k}", f"must be of type string, not {_type_name(v)}"))
    return out


# ----------------------------------------------------------------------------------------------- schema


def _type_name(value: Any) -> str:
    return "null" if value is None else _JSON_TYPE.get(type(value), type(value).__name__)


def _has_type(value: Any, want: str) -> bool:
    if want == "integer":
        # 2.0 is an integer: kubectl sends YAML as JSON written by Go's encoding/json, which writes 2.0 as 2 (a client
        # that sends 2.0 itself passes the schema, kube-openapi's isIntFloat, but fails CEL evaluation on that node)
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if want == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return _type_name(value) == want


def _suggest(name: str, known: list[str] | tuple[str, ...]) -> str | None:
    """The known field the user most likely meant: the camelCase of a snake_case or kebab-case name, the same name
    in other case, else the closest spelling."""
    camel = to_camel(name.replace("-", "_"))
    for candidate in (name, camel):
        for k in known:
            if k.lower() == candidate.lower():
                return k
    folded = {k.lower(): k for k in known}
    close = difflib.get_close_matches(camel.lower(), list(folded), n=1, cutoff=0.6)
    return folded[close[0]] if close else None


def _unknown(name: str, known: list[str] | tuple[str, ...]) -> str:
    hint = _suggest(name, known)
    return f"unknown field; did you mean {hint}?" if hint else "unknown field"


def _pattern(pattern: str) -> re.Pattern[str]:
    # RE2's $ (no multiline) matches only at the end of the text; Python's also before a final newline.
    return re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern)


def _field_index(schema: dict[str, Any], path: str, into: dict[str, list[str]]) -> dict[str, list[str]]:
    """Every field name of the schema → the paths of the objects that have it (``spec.routing.tenants[]``)."""
    for name, sub in schema.get("properties", {}).items():
        into.setdefault(name.lower(), []).append(path)
        _field_index(sub, f"{path}.{name}", into)
    if isinstance(schema.get("items"), dict):
        _field_index(schema["items"], f"{path}[]", into)
    return into


class _Walk:
    """One pass over a document's data along the schema: the errors, and the pruned and defaulted data."""

    def __init__(self, index: dict[str, list[str]] | None = None) -> None:
        self.problems: list[Problem] = []
        self.type_errors: list[str] = []
        self.index = index or {}

    def unknown(self, path: str, name: str, known: list[str]) -> None:
        message = _unknown(name, known)
        if message == "unknown field":  # not a misspelling here: maybe a field of another object
            elsewhere = self.index.get(to_camel(name.replace("-", "_")).lower(), [])
            if elsewhere:
                camel = to_camel(name.replace("-", "_"))
                message += f"; {camel} is a field of {', '.join(elsewhere)}"
        self.error(path, message)

    def error(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def node(self, value: Any, schema: dict[str, Any], path: str) -> Any:
        """``value`` checked against ``schema``; returns it pruned of unknown fields and nulls, with defaults."""
        want = schema.get("type")
        if schema.get("x-kubernetes-int-or-string") and not (_has_type(value, "integer") or isinstance(value, str)):
            self.type_errors.append(path)
            self.error(path, f"Invalid value: must be of type integer or string, not {_type_name(value)}")
            return value
        if schema.get("x-kubernetes-int-or-string") and isinstance(value, float):
            return int(value)
        if want and not _has_type(value, want):
            self.type_errors.append(path)
            shown = f" ({value!r})" if isinstance(value, str | int | float) else ""
            self.error(path, f"Invalid value: must be of type {want}, not {_type_name(value)}{shown}")
            return value
        if want == "integer" and isinstance(value, float):
            value = int(value)
        if "enum" in schema and value not in schema["enum"]:
            supported = ", ".join(f'"{v}"' for v in schema["enum"])
            self.error(path, f"Unsupported value: {value!r}: supported values: {supported}")
        if want in ("integer", "number"):
            self._bounds(value, schema, path)
        elif want == "string":
            self._string(value, schema, path)
        elif want == "array":
            return self._array(value, schema, path)
        elif want == "object":
            return self._object(value, schema, path)
        return value

    def _bounds(self, value: float, schema: dict[str, Any], path: str) -> None:
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None:
            if schema.get("exclusiveMinimum") is True and not value > low:
                self.error(path, f"Invalid value: {value}: should be greater than {low}")
            elif value < low:
                self.error(path, f"Invalid value: {value}: should be greater than or equal to {low}")
        if high is not None:
            if schema.get("exclusiveMaximum") is True and not value < high:
                self.error(path, f"Invalid value: {value}: should be less than {high}")
            elif value > high:
                self.error(path, f"Invalid value: {value}: should be less than or equal to {high}")

    def _string(self, value: str, schema: dict[str, Any], path: str) -> None:
        if "minLength" in schema and len(value) < schema["minLength"]:
            self.error(path, f"Invalid value: {value!r}: should be at least {schema['minLength']} chars long")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            self.error(path, f"Too long: may not be more than {schema['maxLength']} chars")
        if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
            self.error(path, f"Invalid value: {value!r}: should match '{schema['pattern']}'")

    def _array(self, value: list[Any], schema: dict[str, Any], path: str) -> list[Any]:
        if "minItems" in schema and len(value) < schema["minItems"]:
            self.error(path, f"Invalid value: {len(value)}: should have at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.error(path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items")
        items = schema.get("items")
        if not isinstance(items, dict):
            return value
        return [self.node(item, items, f"{path}[{i}]") for i, item in enumerate(value)]

    def _object(self, value: dict[str, Any], schema: dict[str, Any], path: str) -> dict[str, Any]:
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return value
        props: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out: dict[str, Any] = {}
        for key, sub in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in props:
                if sub is not None:  # null: pruned, then defaulted like an absent field
                    out[key] = self.node(sub, props[key], where)
            elif isinstance(extra, dict):
                out[key] = self.node(sub, extra, where)
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                self.unknown(where, str(key), list(props))
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = self.node(copy.deepcopy(sub["default"]), sub, f"{path}.{key}" if path else key)
        for key in schema.get("required", []):
            if key not in out:
                self.error(f"{path}.{key}" if path else key, "Required value")
        return out


# -------------------------------------------------------------------------------------------------- CEL


def _rule_of(validation: dict[str, str]) -> Rule:
    for r in RULES:
        if r.validation() == validation:
            return r
    raise LookupError(f"CEL rule in the CRD that rules.RULES does not have: {validation}")


def _construct(model: type[BaseModel], raw: dict[str, Any]) -> BaseModel:
    """An object of ``model`` from schema-checked, defaulted data, without pydantic's checks (the apiserver runs CEL
    on a node that breaks a bound or a pattern, too)."""
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if raw.get(key) is None:
            continue
        value = raw[key]
        inner, is_list = nested_model(field.annotation)
        if inner is not None:
            value = [_construct(inner, v) for v in value] if is_list else _construct(inner, value)
        values[name] = value
    return model.model_construct(**values)


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith((parent + ".", parent + "["))


def _cel(value: Any, schema: dict[str, Any], path: str, type_errors: list[str]) -> Iterator[Problem]:
    """Every CEL rule of the schema that the (pruned, defaulted) data breaks, node by node, outermost first."""
    if isinstance(value, dict) and schema.get("type") == "object":
        validations = schema.get("x-kubernetes-validations", [])
        if validations and not any(_under(p, path) for p in type_errors):
            for validation in validations:
                rule = _rule_of(validation)
                try:
                    holds = rule.check(_construct(rule.on, value))
                except AttributeError:  # a required field is missing: reported already, as the schema's error
                    continue
                if not holds:
                    yield Problem(f"{path}{rule.field_path}", rule.message)
        props = schema.get("properties", {})
        for key, sub in value.items():
            if key in props:
                yield from _cel(sub, props[key], f"{path}.{key}", type_errors)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _cel(item, schema["items"], f"{path}[{i}]", type_errors)


# --------------------------------------------------------------------------------------------- operator


def _operator_problems(doc: dict[str, Any], spec: Any, build: bool) -> list[Problem]:
    """The operator's checks of ``spec`` (pruned and defaulted): extraArgs wherever they are lists of strings; the
    rest (semantics.py) only on a spec that passed the schema and the rules (``build``)."""
    from .flags import extra_args_item_errors, sets_reserved_flag
    from .models import parse_model
    from .semantics import model_errors

    out: list[Problem] = []
    if isinstance(spec, dict):
        for where in ("engine", "prefill", "decode", "aggregated"):
            args = (spec.get(where) or {}).get("extraArgs") if isinstance(spec.get(where), dict) else None
            if isinstance(args, list) and all(isinstance(a, str) for a in args):
                # the items the CRD's CEL rule refuses are the apiserver's errors already (rules.py)
                out += [_split(e, "operator") for i, e in extra_args_item_errors(f"spec.{where}.extraArgs", args)
                        if not sets_reserved_flag(args[i])]
    if not build:
        return out
    # what the operator reads: the object as the apiserver stores it (pruned, defaulted)
    body: dict[str, Any] = {k: doc[k] for k in ("apiVersion", "kind", "metadata") if k in doc}
    body["spec"] = spec
    try:
        dm = parse_model(body)
    except ValidationError as exc:  # the schema walk should have caught it: report pydantic's words
        return [*out, *(_split(e) for e in _pydantic_errors(exc))]
    reported = {(p.field, p.message) for p in out}  # the extraArgs above, found again
    for error in model_errors(dm.metadata, dm.spec, lws_installed=False):
        problem = _split(error, "operator")
        if (problem.field, problem.message) not in reported:
            out.append(problem)
    return out


def _split(error: str, source: Source = "apiserver") -> Problem:
    field, sep, message = error.partition(": ")
    return Problem(field, message, source) if sep and " " not in field else Problem("", error, source)


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _pydantic_errors(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        where = _loc(tuple(p for p in err["loc"] if not str(p).startswith("function-after")))
        msg = err["msg"].removeprefix("Value error, ")
        out.append(msg if msg.startswith("spec.") else f"{where}: {msg}")
    return out


# ------------------------------------------------------------------------------------------------- entry


def problems(doc: Any) -> list[Problem]:
    """Every problem with one document: the apiserver's (object, schema, CEL), then the operator's."""
    if not isinstance(doc, dict):
        return [Problem("", f"a DisaggregatedModel must be a YAML mapping, not {_type_name(doc)}")]
    root = _schema()
    out = _object_problems(doc)
    walk = _Walk(_spec_fields())
    for key in doc:
        if key not in root["properties"]:
            walk.error(str(key), _unknown(str(key), list(root["properties"])))
    spec = doc.get("spec")
    pruned: Any = None
    if spec is None:
        walk.error("spec", "Required value")
    else:
        pruned = walk.node(spec, root["properties"]["spec"], "spec")
    out += walk.problems
    if pruned is not None:
        out += _cel(pruned, root["properties"]["spec"], "spec", walk.type_errors)
    out += _operator_problems(doc, pruned, build=not out)
    return out


def errors_of(doc: dict[str, Any]) -> list[str]:
    """Every problem with one document, each naming its field (e.g. ``spec.prefill.minReplicas: …``); the operator's
    own refusals end with ``OPERATOR_NOTE``."""
    return [str(p) for p in problems(doc)]


def validate_documents(path: Path) -> Iterator[tuple[str, list[str]]]:
    for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
        if doc is None:
            continue
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        name = meta.get("name", f"#{i}") if isinstance(meta, dict) else f"#{i}"
        yield f"{path}:{name}", errors_of(doc)
