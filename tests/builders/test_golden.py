"""Input CR (docs/examples/*.yaml) → expected manifests (tests/builders/golden/*.yaml).

Regenerate after an intended change with ``DISAGG_UPDATE_GOLDEN=1 pytest tests/builders`` and review the diff; a
new example needs its golden file written the same way (a missing one fails).
"""

from __future__ import annotations

import os

import kubernetes_validate
import yaml

from disagg.builders import BuildSettings, build_children, parse_model

from .conftest import GOLDEN, example_body

SETTINGS = BuildSettings(router_image="ghcr.io/disagg/disagg:0.1.0")


def render(name: str) -> str:
    objs = build_children(parse_model(example_body(name)), SETTINGS)
    return yaml.safe_dump_all(objs, sort_keys=False, width=120)


def test_golden(example: str) -> None:
    text = render(example)
    path = GOLDEN / f"{example}.yaml"
    if os.environ.get("DISAGG_UPDATE_GOLDEN"):
        path.write_text(text)
    # a missing golden file is a failure, not a first run that passes: write it on purpose and review it
    assert path.exists(), f"{path} is missing: create it with DISAGG_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{path} differs; rerun with DISAGG_UPDATE_GOLDEN=1 and review the diff"


def test_rendered_manifests_pass_kubernetes_schemas(example: str) -> None:
    for obj in yaml.safe_load_all(render(example)):
        kubernetes_validate.validate(obj, "1.34", strict=True)


def test_deterministic(example: str) -> None:
    assert render(example) == render(example)
