"""Invalid DisaggregatedModel specs, each with the field its error must name.

Used twice: against the real apiserver (schema + CEL) and against the Python mirror (pydantic).
"""

from __future__ import annotations

import copy
from typing import Any

BASE: dict[str, Any] = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}}


def spec(**overrides: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out.update(overrides)
    return out


PROM = {"url": "http://prometheus:9090"}

# (id, spec, field the message must name)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("missing-model", {"prefill": {"replicas": 1}}, "spec.model"),
    ("empty-model-name", {"model": {"name": ""}}, "spec.model.name"),
    ("model-len-too-small", {"model": {"name": "m", "maxModelLen": 8}}, "spec.model.maxModelLen"),
    ("source-hub-and-pvc", spec(model={"name": "m", "source": {"hub": {}, "pvc": {"claimName": "w"}}}),
     "spec.model.source"),
    ("pvc-relative-path", spec(model={"name": "m", "source": {"pvc": {"claimName": "w", "path": "models/x"}}}),
     "spec.model.source.pvc.path"),
    ("replicas-negative", spec(prefill={"replicas": -1}), "spec.prefill.replicas"),
    ("replicas-wrong-type", spec(decode={"replicas": "two"}), "spec.decode.replicas"),
    ("min-over-max", spec(prefill={"minReplicas": 3, "maxReplicas": 2, "replicas": 2}), "spec.prefill.minReplicas"),
    ("replicas-over-max", spec(decode={"replicas": 9, "maxReplicas": 4}), "spec.decode.replicas"),
    ("gpu-not-multiple-of-tp-pp", spec(prefill={"gpu": {"count": 6}, "parallelism": {"tensor": 4}}),
     "spec.prefill.gpu.count"),
    ("tensor-zero", spec(decode={"parallelism": {"tensor": 0}}), "spec.decode.parallelism.tensor"),
    ("gpu-resource-name", spec(prefill={"gpu": {"resourceName": "nvidia gpu"}}), "spec.prefill.gpu.resourceName"),
    ("mode-unknown", spec(mode="Hybrid"), "spec.mode"),
    ("transport-unknown", spec(kvTransfer={"transport": "infiniband"}), "spec.kvTransfer.transport"),
    ("rdma-without-rdma-transport", spec(kvTransfer={"transport": "tcp", "rdma": {"resourceName": "rdma/ib"}}),
     "spec.kvTransfer.rdma"),
    ("side-channel-port-privileged", spec(kvTransfer={"sideChannelPort": 80}), "spec.kvTransfer.sideChannelPort"),
    ("load-failure-policy", spec(kvTransfer={"loadFailurePolicy": "retry"}), "spec.kvTransfer.loadFailurePolicy"),
    ("remote-min-not-above-local-max",
     spec(routing={"remotePrefill": {"minInputTokens": 1000}, "localPrefill": {"maxInputTokens": 1000}}),
     "spec.routing.remotePrefill.minInputTokens"),
    ("fallback-unknown", spec(routing={"fallback": {"onKVTransferTimeout": "Retry"}}),
     "spec.routing.fallback.onKVTransferTimeout"),
    ("tenant-without-match", spec(routing={"tenants": [{"name": "chat"}]}), "spec.routing.tenants[0].match"),
    ("tenant-bad-name", spec(routing={"tenants": [{"name": "Bad_Name", "match": {"values": ["a"]}}]}),
     "spec.routing.tenants[0].name"),
    ("tenant-duplicate", spec(routing={"tenants": [{"name": "a", "match": {"values": ["x"]}},
                                                   {"name": "a", "match": {"values": ["y"]}}]}),
     "spec.routing.tenants"),
    ("tenant-override-inverted",
     spec(routing={"tenants": [{"name": "a", "match": {"values": ["x"]},
                                "remotePrefill": {"minInputTokens": 100}, "localPrefill": {"maxInputTokens": 200}}]}),
     "spec.routing.tenants[0].remotePrefill.minInputTokens"),
    ("bucket-inverted", spec(routing={"buckets": [{"name": "b", "minInputTokens": 4096, "maxInputTokens": 1024}]}),
     "spec.routing.buckets[0].maxInputTokens"),
    ("bucket-decision-unknown", spec(routing={"buckets": [{"name": "b", "prefill": "Maybe"}]}),
     "spec.routing.buckets[0].prefill"),
    ("canary-over-100", spec(rollout={"canary": {"trafficPercent": 150}}), "spec.rollout.canary.trafficPercent"),
    ("canary-negative", spec(rollout={"canary": {"trafficPercent": -5}}), "spec.rollout.canary.trafficPercent"),
    ("canary-endpoint-unknown", spec(rollout={"canary": {"endpoints": ["/v1/embeddings"]}}),
     "spec.rollout.canary.endpoints[0]"),
    ("slo-ttft-zero", spec(slo={"ttftP95Ms": 0}), "spec.slo.ttftP95Ms"),
    ("slo-error-rate-over-1", spec(slo={"maxErrorRate": 2}), "spec.slo.maxErrorRate"),
    ("autoscaling-without-prometheus", spec(autoscaling={"enabled": True}), "spec.autoscaling.prometheus"),
    ("prometheus-url-scheme", spec(autoscaling={"enabled": True, "prometheus": {"url": "ftp://prom:9090"}}),
     "spec.autoscaling.prometheus.url"),
    ("ratio-inverted", spec(autoscaling={"prefillDecodeRatio": {"min": 3, "max": 1}}),
     "spec.autoscaling.prefillDecodeRatio.min"),
    ("max-step-zero", spec(autoscaling={"maxStep": 0, "prometheus": PROM}), "spec.autoscaling.maxStep"),
    ("mode-policy-rate-over-1", spec(modePolicy={"kvTransferFailureRate": 1.5}),
     "spec.modePolicy.kvTransferFailureRate"),
    # issue 13: what `disagg validate` used to accept (pydantic coerced, or populated by the Python name)
    ("replicas-numeric-string", spec(prefill={"replicas": "2"}), "spec.prefill.replicas"),
    ("replicas-boolean", spec(decode={"replicas": True}), "spec.decode.replicas"),
    ("snake-case-pool-field", spec(prefill={"max_num_seqs": 64}), "spec.prefill.max_num_seqs"),
    ("snake-case-engine-field", spec(engine={"max_num_seqs": 64}), "spec.engine.max_num_seqs"),
    ("snake-case-section", spec(kv_transfer={"transport": "tcp"}), "spec.kv_transfer"),
    ("extra-args-not-strings", spec(engine={"extraArgs": ["--max-num-seqs", 8]}), "spec.engine.extraArgs[1]"),
    ("tenant-header-trailing-newline", spec(routing={"tenants": [{"name": "a", "match": {"header": "x-tenant\n",
                                                                                       "values": ["x"]}}]}),
     "spec.routing.tenants[0].match.header"),
    ("node-selector-value-not-string", spec(prefill={"nodeSelector": {"gpu": 1}}), "spec.prefill.nodeSelector.gpu"),
]

# Whole documents the apiserver refuses (metadata, top level), with the field its error must name.
INVALID_OBJECTS: list[tuple[str, dict[str, Any], str]] = [
    ("name-not-dns-subdomain", {"metadata": {"name": "Bad_Name"}, "spec": BASE}, "metadata.name"),
    ("name-with-space", {"metadata": {"name": "my model"}, "spec": BASE}, "metadata.name"),
    ("unknown-metadata-field", {"metadata": {"name": "m", "lables": {"a": "b"}}, "spec": BASE}, "metadata.lables"),
    ("unknown-top-level-field", {"metadata": {"name": "m"}, "spec": BASE, "specs": {}}, "specs"),
]

# Specs the apiserver accepts and the operator refuses (BuildError, semantics.semantic_errors): `disagg validate`
# refuses them as the operator's, naming the field.
OPERATOR_ONLY: list[tuple[str, dict[str, Any], str]] = [
    ("extra-args-dotted-kv-role",
     spec(prefill={"extraArgs": ["--enforce-eager", "--max-num-seqs=8", "--kv-transfer-config.kv_role=kv_consumer"]}),
     "spec.prefill.extraArgs[2]"),
    ("extra-args-underscore-tp", spec(decode={"extraArgs": ["--tensor_parallel_size", "4"]}),
     "spec.decode.extraArgs[0]"),
    ("extra-args-short-tp", spec(engine={"extraArgs": ["-tp=4"]}), "spec.engine.extraArgs[0]"),
    ("extra-args-port", spec(aggregated={"extraArgs": ["--port=9000"]}), "spec.aggregated.extraArgs[0]"),
    ("rdma-transport-without-rdma-block", spec(kvTransfer={"transport": "rdma"}), "spec.kvTransfer.rdma"),
    ("side-channel-port-is-the-http-port", spec(kvTransfer={"sideChannelPort": 8000}),
     "spec.kvTransfer.sideChannelPort"),
]

# Specs both accept, though they look odd: null is an absent field (pruned, then defaulted); `rdma: {}` takes the
# RDMA defaults explicitly; a free-form object keeps its unknown fields.
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("null-is-absent", spec(prefill={"replicas": None, "gpu": None}, autoscaling=None)),
    ("rdma-defaults-explicit", spec(kvTransfer={"transport": "rdma", "rdma": {}})),
    ("free-form-resources", spec(prefill={"resources": {"limits": {"cpu": "4"}, "anything": {"x": 1}}})),
]

# Every cross-field rule of disagg.api.rules.RULES, by name: a spec (valid for the schema) that breaks it, and the
# path of the node carrying the rule there. A rule without a case fails tests/api/test_rules.py.
RULE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    # min > max cannot leave replicas in range: the apiserver reports both rules, and so does spec_errors
    "pool-min-le-max": (spec(prefill={"minReplicas": 3, "maxReplicas": 2, "replicas": 2}), "spec.prefill"),
    "pool-replicas-in-range": (spec(decode={"replicas": 9, "maxReplicas": 4}), "spec.decode"),
    "pool-gpu-count-multiple": (spec(aggregated={"gpu": {"count": 6}, "parallelism": {"tensor": 2, "pipeline": 2}}),
                                "spec.aggregated"),
    "source-hub-or-pvc": (spec(model={"name": "m", "source": {"hub": {}, "pvc": {"claimName": "w"}}}),
                          "spec.model.source"),
    "rdma-needs-rdma-transport": (spec(kvTransfer={"transport": "nvlink", "rdma": {}}), "spec.kvTransfer"),
    "tenant-remote-above-local": (
        spec(routing={"tenants": [{"name": "a", "match": {"values": ["x"]}},
                                  {"name": "b", "match": {"values": ["y"]}, "remotePrefill": {"minInputTokens": 512},
                                   "localPrefill": {"maxInputTokens": 512}}]}),
        "spec.routing.tenants[1]"),
    "bucket-max-above-min": (
        spec(routing={"buckets": [{"name": "short", "maxInputTokens": 1024},
                                  {"name": "long", "minInputTokens": 8192, "maxInputTokens": 8192}]}),
        "spec.routing.buckets[1]"),
    "routing-remote-above-local": (
        spec(routing={"remotePrefill": {"minInputTokens": 256}, "localPrefill": {"maxInputTokens": 4096}}),
        "spec.routing"),
    "routing-tenant-names-unique": (spec(routing={"tenants": [{"name": "a", "match": {"values": ["x"]}},
                                                              {"name": "a", "match": {"values": ["y"]}}]}),
                                    "spec.routing"),
    "routing-bucket-names-unique": (spec(routing={"buckets": [{"name": "b"}, {"name": "b", "minInputTokens": 10}]}),
                                    "spec.routing"),
    "ratio-min-le-max": (spec(autoscaling={"prefillDecodeRatio": {"min": 2, "max": 0.5}}),
                         "spec.autoscaling.prefillDecodeRatio"),
    "autoscaling-needs-prometheus": (spec(autoscaling={"enabled": True}), "spec.autoscaling"),
}

# One spec breaking every rule at once, and the (rule, node path) pairs both the apiserver and spec_errors report.
ALL_RULES_BROKEN: dict[str, Any] = spec(
    model={"name": "m", "source": {"hub": {}, "pvc": {"claimName": "w"}}},
    prefill={"minReplicas": 3, "maxReplicas": 2, "replicas": 2},
    decode={"gpu": {"count": 3}, "parallelism": {"tensor": 2}},
    kvTransfer={"transport": "tcp", "rdma": {}},
    routing={
        "remotePrefill": {"minInputTokens": 100},
        "localPrefill": {"maxInputTokens": 200},
        "tenants": [{"name": "t", "match": {"values": ["x"]},
                     "remotePrefill": {"minInputTokens": 1}, "localPrefill": {"maxInputTokens": 2}},
                    {"name": "t", "match": {"values": ["y"]}}],
        "buckets": [{"name": "b", "minInputTokens": 10, "maxInputTokens": 5}, {"name": "b"}],
    },
    autoscaling={"enabled": True, "prefillDecodeRatio": {"min": 5, "max": 1}},
)
ALL_RULES_BROKEN_AT: list[tuple[str, str]] = [
    ("source-hub-or-pvc", "spec.model.source"),
    ("pool-min-le-max", "spec.prefill"),
    ("pool-replicas-in-range", "spec.prefill"),
    ("pool-gpu-count-multiple", "spec.decode"),
    ("rdma-needs-rdma-transport", "spec.kvTransfer"),
    ("routing-remote-above-local", "spec.routing"),
    ("routing-tenant-names-unique", "spec.routing"),
    ("routing-bucket-names-unique", "spec.routing"),
    ("tenant-remote-above-local", "spec.routing.tenants[0]"),
    ("bucket-max-above-min", "spec.routing.buckets[0]"),
    ("autoscaling-needs-prometheus", "spec.autoscaling"),
    ("ratio-min-le-max", "spec.autoscaling.prefillDecodeRatio"),
]
