"""A small strategic merge for ``spec.<pool>.podTemplate`` overrides (no I/O, no apiserver)."""

from __future__ import annotations

import copy
from typing import Any

# Lists of objects merged by their "name" (as strategic merge patch does for these fields); other lists are
# replaced by the override.
MERGE_BY_NAME = {"containers", "initContainers", "env", "volumes", "volumeMounts", "ports", "imagePullSecrets"}


def strategic_merge(base: Any, override: Any, key: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if (
        key in MERGE_BY_NAME
        and isinstance(base, list)
        and isinstance(override, list)
        and all(isinstance(i, dict) and "name" in i for i in base + override)
    ):
        out_list = [dict(i) for i in base]
        index = {i["name"]: n for n, i in enumerate(out_list)}
        for item in override:
            if item["name"] in index:
                out_list[index[item["name"]]] = strategic_merge(out_list[index[item["name"]]], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(override)
