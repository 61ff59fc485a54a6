"""Where a profile comes from besides a YAML file: the router's request log (``--from-log``) or Prometheus
(``--from-prometheus``). Both give the ``traffic`` section; the model, the SLO and the GPUs on offer come from a
small base profile (``--base``) and/or flags, flags winning. Whatever is still missing is named with the flag or
field that supplies it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .profile import Profile, ProfileError, parse_profile


@dataclass(frozen=True)
class Overrides:
    """Profile parts from the command line (None: not given)."""

    name: str | None = None
    model: str | None = None
    ttft_ms: int | None = None
    tpot_ms: int | None = None
    goodput_target: float | None = None
    gpus: tuple[str, ...] = ()  # TYPE=COUNT[:COST]
    max_gpus: int | None = None


def parse_gpu_flag(text: str) -> dict[str, Any]:
    """``H100-SXM=16`` or ``H100-SXM=16:1.0`` → a ``gpus[]`` entry (the preset name is checked with the profile)."""
    typ, sep, rest = text.partition("=")
    count, _, cost = rest.partition(":")
    try:
        if not sep or not typ:
            raise ValueError
        out: dict[str, Any] = {"type": typ, "count": int(count)}
        if cost:
            out["cost"] = float(cost)
    except ValueError:
        raise ProfileError([f"--gpu {text!r}: write TYPE=COUNT[:COST], e.g. --gpu H100-SXM=16:1.0"]) from None
    return out


def load_base(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ProfileError([f"--base {path}: {e.strerror or e}"]) from None
    except yaml.YAMLError as e:
        raise ProfileError([f"--base {path}: not YAML: {e}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError([f"--base {path}: a profile must be a YAML mapping, not {type(data).__name__}"])
    return data


def assemble(traffic: dict[str, Any], base: dict[str, Any], o: Overrides, source: str) -> Profile:
    """The profile: ``base`` with its ``traffic`` section taken from the source (a base's ``traffic`` is ignored
    except its ``tenants`` names are not reused), then the flags."""
    doc: dict[str, Any] = {k: v for k, v in base.items() if k != "traffic"}
    doc["traffic"] = traffic
    if o.name:
        doc["name"] = o.name
    doc.setdefault("name", "planned")
    if o.model:
        doc["model"] = {**{k: v for k, v in (doc.get("model") or {}).items() if k not in ("preset", "config")},
                        "preset": o.model}
    slo = dict(doc.get("slo") or {})
    for key, val in (("ttftP95Ms", o.ttft_ms), ("tpotP95Ms", o.tpot_ms), ("goodputTarget", o.goodput_target)):
        if val is not None:
            slo[key] = val
    if slo:
        doc["slo"] = slo
    if o.gpus:
        doc["gpus"] = [parse_gpu_flag(g) for g in o.gpus]
    if o.max_gpus is not None:
        doc["search"] = {**(doc.get("search") or {}), "maxGpus": o.max_gpus}
    missing = []
    if "model" not in doc:
        missing.append(f"model: {source} does not say which model: pass --model PRESET (e.g. Llama-3.1-8B) or "
                       "--base BASE.yaml with a model section")
    if not {"ttftP95Ms", "tpotP95Ms"} <= slo.keys():
        missing.append(f"slo: {source} has no SLO: pass --ttft-ms and --tpot-ms (and optionally "
                       "--goodput-target), or --base BASE.yaml with an slo section")
    if not doc.get("gpus"):
        missing.append(f"gpus: {source} does not say which GPUs are on offer: pass --gpu TYPE=COUNT[:COST] "
                       "(repeatable), or --base BASE.yaml with a gpus list")
    if missing:
        raise ProfileError(missing)
    return parse_profile(doc)


def to_yaml(p: Profile) -> str:
    return yaml.safe_dump(p.model_dump(by_alias=True, exclude_none=True, exclude_defaults=False),
                          sort_keys=False)
