"""The install/ops docs: the seed's production launch checklist is mapped item by item, and what the docs point
at exists."""

from __future__ import annotations

import re

import pytest
from tests.paths import REPO

DOCS = REPO / "docs"

# The seed document's "Production Launch Checklist", verbatim.
SEED_CHECKLIST = [
    "Input token length distribution has been collected.",
    "Output token length distribution has been collected.",
    "Business types (RAG, Chat, Agent, Batch) have been distinguished.",
    "p95/p99 SLOs for TTFT and TPOT have been defined.",
    "Conditions for remote vs. local Prefill have been defined.",
    "Prefix cache hit rate has been considered.",
    "Fallback strategy for Prefill Queue overload has been configured.",
    "Canary support by model, tenant, and endpoint is in place.",
    "KV packing, transfer, and unpacking times are being monitored.",
    "KV layout compatibility across different parallel configurations has been verified.",
    "Transfer timeouts and failure fallbacks have been set.",
    "Network bandwidth and cross-node topology have been evaluated.",
    "Prefill Pool and Decode Pool have been stress-tested independently.",
    "Prefill Queue growth under burst traffic has been verified.",
    "Maximum active sequence limit for the Decode Pool has been configured.",
    "SLO-based scaling rules have been established.",
    "TTFT, TPOT, and E2E latency percentile dashboards have been created.",
    "Each request's prefill/decode worker, routing decision, and transfer time are logged.",
    "Alerts are configured for: transfer timeouts, queue backlogs, TPOT jitter, and cache hit rate drops.",
    "One-click rollback to aggregated serving is supported.",
]


def test_checklist_maps_every_seed_item() -> None:
    rows = {}
    for line in (DOCS / "production-checklist.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2:
            rows[cells[0]] = cells[1]
    for item in SEED_CHECKLIST:
        assert item in rows, f"seed checklist item not mapped: {item}"
        assert len(rows[item]) > 20, f"no mapping for: {item}"


def test_checklist_fields_exist_in_the_crd() -> None:
    """Every `spec.…` path the checklist names is a field of the CRD."""
    import yaml

    crd = yaml.safe_load((REPO / "crds" / "disaggregatedmodels.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    text = "\n".join((DOCS / name).read_text() for name in
                     ("production-checklist.md", "troubleshooting.md", "gitops.md", "observability.md"))
    paths = set(re.findall(r"(?<![\w./])spec\.([a-zA-Z][a-zA-Z0-9.]*[a-zA-Z0-9])", text))
    assert paths
    for path in sorted(paths):
        node = spec
        for part in path.split("."):
            if part in ("<pool>",):
                break
            node = node.get("properties", {}).get(part) or node.get("items", {}).get("properties", {}).get(part)
            assert node is not None, f"spec.{path} (in the docs) is not a CRD field"


@pytest.mark.parametrize("name", ["install.md", "gitops.md", "production-checklist.md", "troubleshooting.md",
                                  "observability.md"])
def test_relative_links_resolve(name: str) -> None:
    text = (DOCS / name).read_text()
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (DOCS / target).exists(), f"{name}: broken link {target}"


# ------------------------------------------------------------------------------ docs that match the code
# The install/ops docs (and the chart's own texts) state facts that the code keeps: each test below checks one
# kind of fact mechanically, so that a change on either side fails here instead of misleading a user.

OPS_DOCS = ("install.md", "gitops.md", "production-checklist.md", "troubleshooting.md", "api.md")
CHART = REPO / "charts" / "disagg-operator"


def _ops_text() -> str:
    return "\n".join((DOCS / name).read_text() for name in OPS_DOCS)


def _chart_texts() -> str:
    return "\n".join(p.read_text() for p in (CHART / "values.yaml", CHART / "templates" / "NOTES.txt"))


def _subcommand_options() -> dict[str, set[str]]:
    """Every `disagg <subcommand>`'s option strings (nested subcommands' included), from the real argparse."""
    import argparse

    from disagg.cli import build_parser

    def options(p: argparse.ArgumentParser) -> set[str]:
        out = set()
        for a in p._actions:
            out |= set(a.option_strings)
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    out |= options(sub)
        return out

    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return {name: options(p) for name, p in sub.choices.items()}


def _commands(text: str) -> list[tuple[str, str]]:
    """(subcommand, rest of the command line) for every `disagg <sub> …` in text, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", text)
    return [(m.group(1), m.group(2)) for m in re.finditer(r"\bdisagg (\w+)((?:[ \t]+[^`\n|;#)]*)?)", text)]


def test_cli_flags_named_in_the_docs_exist() -> None:
    """Every `--flag` written after `disagg <subcommand>` (docs, values.yaml, NOTES.txt) is one of that
    subcommand's argparse options (e.g. `disagg operator --dev` is not)."""
    known = _subcommand_options()
    seen = 0
    for sub, rest in _commands(_ops_text() + "\n" + _chart_texts()):
        if sub not in known:
            continue
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
            seen += 1
            assert flag in known[sub], f"`disagg {sub} {flag}` (in the docs) is not a flag of `disagg {sub}`"
    assert seen >= 5


def _values_paths(node: object, prefix: str = "") -> set[str]:
    out = {prefix} if prefix else set()
    if node == {}:  # a free map (labels, annotations, selectors): any key below it
        out.add(f"{prefix}.*")
    if isinstance(node, dict):
        for k, v in node.items():
            out |= _values_paths(v, f"{prefix}.{k}" if prefix else k)
    return out


def test_values_keys_named_in_the_docs_exist() -> None:
    """Every chart value the docs name (`monitoring.serviceMonitor.enabled`, `--set metrics.enabled=true`, …) is a
    key of values.yaml."""
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    paths = _values_paths(values)
    top = set(values)
    text = _ops_text()
    named = set(re.findall(r"--set '?([\w.]+)=", text))
    named |= {m for m in re.findall(r"`([a-zA-Z][\w]*(?:\.[a-zA-Z][\w]*)+)(?:\.\*)?`", text) if m.split(".")[0] in top}
    named = {n for n in named if not n.startswith(("rbac.authorization", "router.md", "operator.md"))}
    assert {"metrics.enabled", "monitoring.serviceMonitor.enabled", "monitoring.labels"} <= named
    named = {n for n in named if not n.endswith((".yaml", ".yml", ".md", ".json"))}
    missing = sorted(n for n in named if n not in paths and not any(
        n.startswith(p[:-1]) for p in paths if p.endswith(".*")))
    assert not missing, f"values named in the docs but not in values.yaml: {missing}"


def test_servicemonitor_needs_metrics_enabled_as_documented() -> None:
    from tests.chart.render import documents, render

    only_sm = render({"monitoring": {"serviceMonitor": {"enabled": True}}})
    assert not [d for d in documents(only_sm) if d.get("kind") == "ServiceMonitor"]
    notes = next(v for k, v in only_sm.items() if k.endswith("NOTES.txt"))
    assert "metrics.enabled" in notes and "WARNING" in notes
    both = render({"metrics": {"enabled": True}, "monitoring": {"serviceMonitor": {"enabled": True}}})
    assert [d for d in documents(both) if d.get("kind") == "ServiceMonitor"]
    notes = next(v for k, v in both.items() if k.endswith("NOTES.txt"))
    assert "WARNING" not in notes and "ServiceMonitor (operator)" in notes
    install = (DOCS / "install.md").read_text()
    assert re.search(r"ServiceMonitor is rendered \*\*only with both\*\* `metrics.enabled`", install)


def _alert_exprs() -> dict[str, tuple[str, str]]:
    """alert name → (the template's expr text, its `for:` line), read from the PrometheusRule template."""
    text = (CHART / "templates" / "prometheusrule.yaml").read_text()
    out = {}
    for block in re.split(r"\n\s+- alert: ", text)[1:]:
        name = block.split("\n", 1)[0].strip()
        expr = block.split("for:", 1)[0]
        for_line = re.search(r"for: \{\{ \$for\.(\w+) \}\}", block)
        out[name] = (expr, for_line.group(1) if for_line else "")
    return out


def _threshold_comments() -> dict[str, str]:
    """thresholds key → the comment lines above it in values.yaml."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "thresholds:")
    out, comment = {}, []
    for line in lines[start + 1:]:
        s = line.strip()
        if s.startswith("#"):
            comment.append(s.lstrip("#- ").strip())
        elif re.match(r"^\w+:", s) and line.startswith(" " * 6):
            out[s.split(":")[0]] = " ".join(comment)
            comment = []
        else:
            break
    return out


def test_alert_threshold_descriptions_match_the_rules() -> None:
    """Each threshold's description in values.yaml names every alert that uses it, and only metrics those alerts
    read (the descriptions once spoke of the router's queue wait and a 30m/6h window the rules never used)."""
    exprs = _alert_exprs()
    comments = _threshold_comments()
    assert len(comments) >= 10
    for key, comment in comments.items():
        users = sorted(a for a, (expr, _) in exprs.items() if re.search(rf"\$t\.{key}\b", expr))
        assert users, f"threshold {key} is used by no alert"
        for alert in users:
            assert alert in comment, f"values.yaml thresholds.{key}: the description does not name {alert}"
        named_alerts = set(re.findall(r"Disagg\w+", comment))
        assert named_alerts <= set(users), f"thresholds.{key} names alerts that do not use it: {named_alerts}"
        for metric in re.findall(r"(?:vllm:|disagg_)[a-z_]+", comment):
            assert any(metric in exprs[a][0] for a in users), f"thresholds.{key}: {metric} is not in its alerts"
    hit = comments["prefixCacheHitRateDropRatio"]
    expr = exprs["DisaggPrefixCacheHitRateDrop"][0]
    assert "[15m]" in expr and "15-minute" in hit
    assert "[2h] offset 1h" in expr and "2 hours" in hit and "an hour earlier" in hit


def test_alert_for_description_matches_the_rules() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip() == "for:")
    comment = ""
    j = i - 1
    while lines[j].strip().startswith("#"):
        comment = lines[j] + comment
        j -= 1
    for alert, (_, which) in _alert_exprs().items():
        assert which in ("short", "long"), alert
        if which == "long":
            assert alert in comment, f"values.yaml `for` comment does not list {alert} under long"


def test_tenant_priority_says_what_acts_on_it() -> None:
    """tenants[].priority is acted on twice (issue 29): the engines' priority scheduler (the router sends it on every
    leg) and the router's admission queue (released by priority): the CRD says both, and the router's code does it."""
    import yaml

    crd = yaml.safe_load((REPO / "crds" / "disaggregatedmodels.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    tenant = spec["properties"]["routing"]["properties"]["tenants"]["items"]["properties"]
    prio = tenant["priority"]["description"]
    assert "--scheduling-policy priority" in prio and "admission queue" in prio
    assert "Interactive" in tenant["overload"]["description"] or "priority" in tenant["overload"]["description"]
    router_src = "\n".join(p.read_text() for p in (REPO / "operator" / "disagg" / "router").glob("*.py"))
    assert re.search(r"TENANT_PRIORITY\[prio\]", router_src), "the admission queue no longer reads the priority"
    assert re.search(r"ctx\.priority = TENANT_PRIORITY", router_src), "the legs no longer carry the priority"


def test_mode_auto_without_prometheus_is_documented() -> None:
    """api.md says what `mode: Auto` does without spec.autoscaling.prometheus, in the code's own words."""
    import inspect

    from disagg.controller import handlers, status

    assert "when=measured" in inspect.getsource(handlers.register_autoscaler)
    assert handlers._measured({"autoscaling": {}}, has_default=False) is False
    assert handlers._measured({"autoscaling": {}}, has_default=True) is True
    api = " ".join((DOCS / "api.md").read_text().split())
    assert "`PrometheusNotConfigured`" in api and "`prometheus.url`" in api
    assert "### `mode: Auto` needs Prometheus" in (DOCS / "api.md").read_text()
    assert " ".join(status.INITIAL_REASON.split()) in api
    assert "`NotMeasured`" in api


def test_printer_columns_are_the_documented_ones() -> None:
    """install.md's column table lists exactly the CRD's printer columns, and says -o wide adds none; when the
    API gains wide-only columns (priority > 0), this fails until the doc is updated."""
    import yaml

    crd = yaml.safe_load((REPO / "crds" / "disaggregatedmodels.yaml").read_text())
    cols = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    text = (DOCS / "install.md").read_text()
    section = text.split("## `kubectl get dm` columns", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (`[^|]+`) \|", section, re.M)
    documented = {c for row in rows for c in re.findall(r"`([A-Z0-9-]+)`", row)}
    assert documented == {"NAME"} | {c["name"].upper() for c in cols}
    wide = {c["name"].upper() for c in cols if c.get("priority", 0) > 0}
    wide_rows = {c for row in rows if "(wide)" in section.split(row, 1)[1].split("\n", 1)[0]
                 for c in re.findall(r"`([A-Z0-9-]+)`", row)}
    assert wide_rows == wide, "install.md marks exactly the -o wide columns with (wide)"
    for c in cols:
        if c["jsonPath"].startswith((".status.pools", ".metadata", ".status.conditions")):
            continue
        assert c["jsonPath"].lstrip(".") .split(".")[-1] in section, c


def test_router_log_fields_in_the_runbook_exist() -> None:
    """The slow-request runbook's fields and headers are the router's: the log call's keywords, the timing keys,
    the response headers."""
    src = (REPO / "operator" / "disagg" / "router" / "accounting.py").read_text()
    call = src[src.index("self.log("):]
    call = call[:call.index("\n        )")]
    log_fields = set(re.findall(r"(\w+)=", call))
    router_src = "\n".join(p.read_text() for p in (REPO / "operator" / "disagg" / "router").glob("*.py"))
    timing_keys = set(re.findall(r"timings\[\"(\w+)\"\]", router_src))
    text = (DOCS / "install.md").read_text()
    runbook = text.split("## Runbook: one slow request", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^   \| (`[^|]+`) \|", runbook, re.M)
    fields = {f for row in rows for f in re.findall(r"`(\w+)`", row)}
    assert fields and fields <= log_fields, fields - log_fields
    timing_row = runbook[runbook.index("| `timings_ms` |"):].split("\n", 1)[0]
    named_timings = set(re.findall(r"`(\w+)`", timing_row)) - {"timings_ms"}
    assert named_timings == timing_keys, (named_timings ^ timing_keys)
    from disagg.router.request import Ctx, decision_headers

    headers = set(decision_headers(Ctx(request_id="x", endpoint="/v1/completions", stream=False, t0=0.0)))
    for h in re.findall(r"`(X-[\w-]+)`", runbook):
        assert h in headers, h


def test_install_examples_are_valid_models() -> None:
    """Every DisaggregatedModel written out in install.md passes `disagg validate`'s checks."""
    import yaml

    from disagg.api.validate import errors_of

    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / "install.md").read_text(), re.S)
    models = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict)
              and d.get("kind") == "DisaggregatedModel"]
    assert models
    for m in models:
        assert errors_of(m) == [], (m["metadata"], errors_of(m))


def test_scrape_config_gives_the_labels_the_queries_select_on() -> None:
    """The plain-Prometheus scrape job in install.md attaches every label the operator's queries select on, from
    the same pod labels as the chart's PodMonitors."""
    import yaml

    from disagg.autoscaling.queries import QUERIES, selector

    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / "install.md").read_text(), re.S)
    job = next(j for b in blocks if "scrape_configs" in b for j in yaml.safe_load(b)["scrape_configs"])
    targets = {r["target_label"]: r["source_labels"][0] for r in job["relabel_configs"] if "target_label" in r}
    selected = set(re.findall(r"(\w+)=", selector("ns", "m")))
    selected |= {lbl for tpl, _ in QUERIES.values() for lbl in re.findall(r"(role)=", tpl)}
    assert selected <= set(targets), selected - set(targets)
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    for label in ("model", "role", "compat_hash"):
        assert f"[{targets[label]}]\n  targetLabel: {label}" in helpers, label


def test_gitops_names_what_the_operator_writes() -> None:
    """Annotation prefix, finalizer, field managers, conditions and events named in gitops.md are the code's."""
    from disagg.builders.replicas import AUTOSCALER_FIELD_MANAGER
    from disagg.controller.handlers import operator_settings
    from disagg.kube import FIELD_MANAGER

    text = (DOCS / "gitops.md").read_text()
    s = operator_settings()
    assert f"`{s.persistence.finalizer}`" in text
    prefix = s.persistence.progress_storage.prefix  # type: ignore[attr-defined]
    assert f"`{prefix}/{s.persistence.diffbase_storage.key}`" in text  # type: ignore[attr-defined]
    assert f"`{prefix}/touch-dummy`" in text and f"`{prefix}/kopf-managed`" in text
    assert f"`{FIELD_MANAGER}`" in text and f"`{AUTOSCALER_FIELD_MANAGER}`" in text
    annotations = set(re.findall(r"`([\w.-]+\.[a-z]{2,}/[\w<>-]+)`", text))
    assert annotations and all(a.startswith(prefix + "/") for a in annotations), annotations
    controller = "\n".join(p.read_text() for p in (REPO / "operator" / "disagg" / "controller").glob("*.py"))
    for word in ("RolloutPending", "OperatorUpgrade", "ReplicasConflict", "ReplicasReverted"):
        assert word in text and f'"{word}"' in controller, word


def _slug(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _anchors(name: str) -> set[str]:
    return {_slug(line.lstrip("#")) for line in (DOCS / name).read_text().splitlines()
            if re.match(r"#{1,6} ", line)}


@pytest.mark.parametrize("name", OPS_DOCS)
def test_anchors_resolve(name: str) -> None:
    text = (DOCS / name).read_text()
    for target, anchor in re.findall(r"\]\(([\w.-]*\.md|)#([^)]+)\)", text):
        assert anchor in _anchors(target or name), f"{name}: no heading for {target or name}#{anchor}"


def test_image_targets(tmp_path: object) -> None:
    """`make images` / `make push-images` name the registry's images, and stop with a clear error without a
    container engine (the case in CI: nothing is built here)."""
    import os
    import shutil
    import subprocess

    make = shutil.which("make")
    assert make, "make not found: the Makefile is the documented entry point (apt-get install make)"
    dry = subprocess.run([make, "-n", "push-images", "REGISTRY=r.example/ml", "CONTAINER_ENGINE=docker"], cwd=REPO,
                         capture_output=True, text=True, timeout=30)
    assert dry.returncode == 0, dry.stderr
    for image in ("r.example/ml/disagg:", "r.example/ml/disagg-sim:", "r.example/ml/vllm:"):
        assert "docker build --platform linux/amd64 -f images/" in dry.stdout and f"-t {image}" in dry.stdout
        assert f"docker push {image}" in dry.stdout
    bare = subprocess.run([make, "images"], cwd=REPO, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": "/nonexistent", "CONTAINER_ENGINE": ""})
    assert bare.returncode != 0 and "neither docker nor podman" in bare.stderr
    install = (DOCS / "install.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    images = install.split("## 1. Build and push the images", 1)[1].split("\n## ", 1)[0]
    variables = re.findall(r"^\| `([A-Z_]+)` \|", images, re.M)
    assert {"REGISTRY", "VERSION", "VLLM_IMAGE_TAG", "CONTAINER_ENGINE"} <= set(variables)
    for var in variables:
        assert re.search(rf"^{var} \?=", makefile, re.M), var
    assert "make push-images REGISTRY=" in install and "neither docker nor podman" in install


def test_worker_image_check_matches_the_dockerfile() -> None:
    """The documented one-liner asks for the NIXL version the worker Dockerfile installs at least."""
    dockerfile = (REPO / "images" / "vllm" / "Dockerfile").read_text()
    install = (DOCS / "install.md").read_text()
    floor = re.search(r"sys\.exit\(v < \((\d+), (\d+)\)\)", dockerfile)
    assert floor
    assert f">= ({floor.group(1)}, {floor.group(2)})" in install
    assert f"NIXL ≥ {floor.group(1)}.{floor.group(2)}" in install
    assert re.search(r"libibverbs", install) and "ldconfig -p" in install
