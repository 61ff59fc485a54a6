"""What the targeted vLLM build understands, read from the image tag.

vLLM adds flags between releases, and ``vllm serve`` refuses flags it does not know, so the operator only
renders a version-dependent flag when the image tag says the build has it:

- ``--shutdown-timeout`` (drain in-flight requests on SIGTERM): vLLM 0.18.0 and later
  (vllm-project/vllm#34730, re-landed as #36666). Without it vLLM aborts in-flight requests on SIGTERM.
- ``kv_load_failure_policy`` in ``--kv-transfer-config``: added by vllm-project/vllm#26813 (after 0.11.2).
  Older builds parse ``--kv-transfer-config`` into a pydantic dataclass that ignores unknown keys, so the key
  is always rendered (harmless before, effective after).

An image whose tag is not a version (``latest``, a digest, a custom build) is treated as unknown: no
version-dependent flags; add them through ``spec.engine.extraArgs``.
"""

from __future__ import annotations

import re

SHUTDOWN_TIMEOUT_SINCE = (0, 18, 0)

_TAG = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def image_version(image: str) -> tuple[int, int, int] | None:
    """``vllm/vllm-openai:v0.11.2`` → (0, 11, 2); None when the tag is not a version."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    tag = last.split(":", 1)[1]
    m = _TAG.match(tag)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def supports_shutdown_timeout(image: str) -> bool:
    v = image_version(image)
    return v is not None and v >= SHUTDOWN_TIMEOUT_SINCE
