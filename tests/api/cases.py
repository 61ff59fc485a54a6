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
    # transport rdma needs its block: the device plugin's resource name is the user's to say
    ("rdma-transport-without-rdma-block", spec(kvTransfer={"transport": "rdma"}), "spec.kvTransfer.rdma"),
    # issue 14: flags the operator owns, in the spellings CEL reads (the abbreviations are OPERATOR_ONLY)
    ("extra-args-dotted-kv-role",
     spec(prefill={"extraArgs": ["--enforce-eager", "--max-num-seqs=8", "--kv-transfer-config.kv_role=kv_consumer"]}),
     "spec.prefill.extraArgs"),
    ("extra-args-underscore-tp", spec(decode={"extraArgs": ["--tensor_parallel_size", "4"]}), "spec.decode.extraArgs"),
    ("extra-args-short-tp", spec(engine={"extraArgs": ["-tp=4"]}), "spec.engine.extraArgs"),
    ("extra-args-port", spec(aggregated={"extraArgs": ["--port=9000"]}), "spec.aggregated.extraArgs"),
    ("extra-args-shutdown-timeout", spec(engine={"extraArgs": ["--shutdown_timeout", "5"]}), "spec.engine.extraArgs"),
    ("extra-arg-too-long", spec(engine={"extraArgs": ["--chat-template=" + "x" * 2048]}), "spec.engine.extraArgs[0]"),
    # issue 13: rollouts that fit the cluster
    ("rolling-update-both-zero", spec(prefill={"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}),
     "spec.prefill.rollingUpdate.maxUnavailable"),
    ("rolling-update-surge-not-percent", spec(decode={"rollingUpdate": {"maxSurge": "2"}}),
     "spec.decode.rollingUpdate.maxSurge"),
    ("rolling-update-unavailable-over-100", spec(decode={"rollingUpdate": {"maxUnavailable": "150%"}}),
     "spec.decode.rollingUpdate.maxUnavailable"),
    ("rolling-update-negative", spec(decode={"rollingUpdate": {"maxSurge": -1}}), "spec.decode.rollingUpdate.maxSurge"),
    ("rolling-update-wrong-type", spec(decode={"rollingUpdate": {"maxSurge": True}}),
     "spec.decode.rollingUpdate.maxSurge"),
    # issue 13: the model cache
    ("model-cache-empty", spec(model={"name": "m", "cache": {}}), "spec.model.cache"),
    ("model-cache-both", spec(model={"name": "m", "cache": {"hostPath": "/var/cache/m", "pvc": {"claimName": "c"}}}),
     "spec.model.cache"),
    ("model-cache-relative-host-path", spec(model={"name": "m", "cache": {"hostPath": "cache"}}),
     "spec.model.cache.hostPath"),
    # issue 31: tracing endpoints
    ("tracing-endpoint-without-scheme", spec(observability={"tracing": {"endpoint": "otel-collector:4317"}}),
     "spec.observability.tracing.endpoint"),
    ("tracing-protocol-unknown", spec(observability={"tracing": {"endpoint": "http://c:4317", "protocol": "thrift"}}),
     "spec.observability.tracing.protocol"),
    ("tracing-grpc-with-path", spec(observability={"tracing": {"endpoint": "http://c:4317/v1/traces",
                                                               "protocol": "grpc"}}),
     "spec.observability.tracing.endpoint"),
    ("tracing-http-without-path", spec(observability={"tracing": {"endpoint": "http://c:4318",
                                                                  "protocol": "http/protobuf"}}),
     "spec.observability.tracing.endpoint"),
]

# Whole documents the apiserver refuses (metadata, top level), with the field its error must name.
INVALID_OBJECTS: list[tuple[str, dict[str, Any], str]] = [
    ("name-not-dns-subdomain", {"metadata": {"name": "Bad_Name"}, "spec": BASE}, "metadata.name"),
    ("name-with-space", {"metadata": {"name": "my model"}, "spec": BASE}, "metadata.name"),
    ("unknown-metadata-field", {"metadata": {"name": "m", "lables": {"a": "b"}}, "spec": BASE}, "metadata.lables"),
    ("unknown-top-level-field", {"metadata": {"name": "m"}, "spec": BASE, "specs": {}}, "specs"),
]

# Specs the apiserver accepts and the operator refuses (api/semantics.py model_errors): `disagg validate` refuses
# them as the operator's, naming the field.
OPERATOR_ONLY: list[tuple[str, dict[str, Any], str]] = [
    # argparse's abbreviations of owned flags: beyond the CEL rule's pattern, refused by the operator
    ("extra-args-abbreviated-tp", spec(decode={"extraArgs": ["--enforce-eager", "--tensor-parallel", "4"]}),
     "spec.decode.extraArgs[1]"),
    ("extra-args-abbreviated-short-tp", spec(engine={"extraArgs": ["-t=4"]}), "spec.engine.extraArgs[0]"),
    ("extra-args-abbreviated-kv-config", spec(prefill={"extraArgs": ["--kv-transfer.kv_role=kv_consumer"]}),
     "spec.prefill.extraArgs[0]"),
    # a free-form podTemplate, which CEL cannot read, overriding what carries the owned flags
    ("pod-template-vllm-args", spec(prefill={"podTemplate": {"spec": {"containers": [
        {"name": "vllm", "args": ["m", "--tensor-parallel-size", "4"]}]}}}),
     "spec.prefill.podTemplate.spec.containers[0].args"),
    ("pod-template-vllm-command", spec(decode={"podTemplate": {"spec": {"containers": [
        {"name": "sidecar", "image": "busybox"}, {"name": "vllm", "command": ["sh", "-c", "vllm serve m"]}]}}}),
     "spec.decode.podTemplate.spec.containers[1].command"),
    ("side-channel-port-is-the-http-port", spec(kvTransfer={"sideChannelPort": 8000}),
     "spec.kvTransfer.sideChannelPort"),
]

# Specs both accept, though they look odd: null is an absent field (pruned, then defaulted); `rdma: {}` takes the
# RDMA defaults explicitly; a free-form object keeps its unknown fields.
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("null-is-absent", spec(prefill={"replicas": None, "gpu": None}, autoscaling=None)),
    ("rdma-defaults-explicit", spec(kvTransfer={"transport": "rdma", "rdma": {}})),
    ("extra-args-that-only-look-owned", spec(engine={"extraArgs": ["--portx", "--config-format", "hf", "--model-impl",
                                                                   "vllm", "-tpx"]})),
    ("rolling-update-percentages", spec(prefill={"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "100%"}},
                                        decode={"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})),
    ("pod-template-sidecar-args", spec(prefill={"podTemplate": {"spec": {"containers": [
        {"name": "vllm", "env": [{"name": "X", "value": "1"}]},
        {"name": "log", "image": "busybox", "args": ["-v"]}]}}})),
    ("model-cache-pvc", spec(model={"name": "m", "cache": {"pvc": {"claimName": "hf-cache"}}})),
    ("free-form-resources", spec(prefill={"resources": {"limits": {"cpu": "4"}, "anything": {"x": 1}}})),
    # issue 31: an OTLP/gRPC collector as users have it (no path), gRPC over TLS, OTLP/HTTP with its path, and a
    # gRPC collector on the HTTP port when the protocol says so
    ("tracing-grpc-collector", spec(observability={"tracing": {"endpoint": "http://otel-collector:4317"}})),
    ("tracing-grpc-tls", spec(observability={"tracing": {"endpoint": "https://otel.example.com:443/",
                                                         "protocol": "grpc"}})),
    ("tracing-http-collector", spec(observability={"tracing": {"endpoint": "http://jaeger:4318/v1/traces",
                                                               "protocol": "http/protobuf"}})),
    ("tracing-grpc-on-4318", spec(observability={"tracing": {"endpoint": "http://c:4318", "protocol": "grpc"}})),
]

# Every cross-field rule of disagg.api.rules.RULES, by name: a spec (valid for the schema) that breaks it, and the
# path of the node carrying the rule there. A rule without a case fails tests/api/test_rules.py.
RULE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    # 3 successes at 6 probes a minute cannot happen within a 15 s window
    "mode-probes-reachable": (spec(modePolicy={"windowSeconds": 15, "probe": {"ratePerMinute": 6,
                                                                                "successesToReturn": 3}}),
                              "spec.modePolicy"),
    # min > max cannot leave replicas in range: the apiserver reports both rules, and so does spec_errors
    "pool-min-le-max": (spec(prefill={"minReplicas": 3, "maxReplicas": 2, "replicas": 2}), "spec.prefill"),
    "pool-replicas-in-range": (spec(decode={"replicas": 9, "maxReplicas": 4}), "spec.decode"),
    "pool-gpu-count-multiple": (spec(aggregated={"gpu": {"count": 6}, "parallelism": {"tensor": 2, "pipeline": 2}}),
                                "spec.aggregated"),
    "source-hub-or-pvc": (spec(model={"name": "m", "source": {"hub": {}, "pvc": {"claimName": "w"}}}),
                          "spec.model.source"),
    "rdma-needs-rdma-transport": (spec(kvTransfer={"transport": "nvlink", "rdma": {}}), "spec.kvTransfer"),
    "rdma-transport-needs-rdma": (spec(kvTransfer={"transport": "rdma"}), "spec.kvTransfer"),
    "engine-extra-args-not-reserved": (spec(engine={"extraArgs": ["--enforce-eager", "--served_model_name=x"]}),
                                       "spec.engine"),
    "pool-extra-args-not-reserved": (spec(aggregated={"extraArgs": ["--kv-transfer-config.kv_role", "kv_both"]}),
                                     "spec.aggregated"),
    "rolling-update-max-surge-format": (spec(prefill={"rollingUpdate": {"maxSurge": "1000%"}}),
                                        "spec.prefill.rollingUpdate"),
    "rolling-update-max-unavailable-format": (spec(decode={"rollingUpdate": {"maxUnavailable": 1001}}),
                                              "spec.decode.rollingUpdate"),
    "rolling-update-not-both-zero": (spec(decode={"rollingUpdate": {"maxSurge": "00%", "maxUnavailable": 0}}),
                                     "spec.decode.rollingUpdate"),
    "model-cache-one-kind": (spec(model={"name": "m", "cache": {}}), "spec.model.cache"),
    "tenant-remote-above-local": (
        spec(routing={"tenants": [{"name": "a", "match": {"values": ["x"]}},
                                  {"name": "b", "match": {"values": ["y"]}, "remotePrefill": {"minInputTokens": 512},
                                   "localPrefill": {"maxInputTokens": 512}}]}),
        "spec.routing.tenants[1]"),
    "tenant-max-queued-needs-queue": (
        spec(routing={"tenants": [{"name": "a", "match": {"values": ["x"]}, "overload": "Queue", "maxQueued": 8},
                                  {"name": "b", "match": {"values": ["y"]}, "overload": "Shed", "maxQueued": 8}]}),
        "spec.routing.tenants[1]"),
    "tenant-max-queue-time-needs-queue": (
        spec(routing={"tenants": [{"name": "a", "match": {"values": ["x"]}, "maxQueueTimeMs": 500}]}),
        "spec.routing.tenants[0]"),
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
    # issue 31: Prometheus as clusters run it (auth proxies, multi-tenant stores, private CAs)
    "prometheus-one-auth": (spec(autoscaling={"prometheus": {**PROM, "authSecretRef": {"name": "t"},
                                                             "basicAuthSecretRef": {"name": "b"}}}),
                            "spec.autoscaling.prometheus"),
    "prometheus-header-names": (spec(autoscaling={"prometheus": {**PROM, "headers": {"X Scope": "a"}}}),
                                "spec.autoscaling.prometheus"),
    "prometheus-headers-no-credentials": (
        spec(autoscaling={"prometheus": {**PROM, "headers": {"authorization": "Bearer x"}}}),
        "spec.autoscaling.prometheus"),
    "prometheus-tls-ca-or-insecure": (
        spec(autoscaling={"prometheus": {**PROM, "tls": {"caSecretRef": {"name": "ca"}, "insecureSkipVerify": True}}}),
        "spec.autoscaling.prometheus.tls"),
    # issue 31: OTLP endpoints as collectors have them (gRPC host:port, or an OTLP/HTTP URL with its path)
    "tracing-grpc-no-path": (spec(observability={"tracing": {"endpoint": "http://otel-collector:4317/v1/traces",
                                                             "protocol": "grpc"}}), "spec.observability.tracing"),
    "tracing-http-needs-path": (spec(observability={"tracing": {"endpoint": "http://jaeger:4318"}}),
                                "spec.observability.tracing"),
}

# One spec breaking every rule at once, and the (rule, node path) pairs both the apiserver and spec_errors report.
# Rules that no spec can break together with another rule of the table (they test the same fields the other way).
MUTUALLY_EXCLUSIVE = {"rdma-transport-needs-rdma": "rdma-needs-rdma-transport",
                      "tracing-http-needs-path": "tracing-grpc-no-path"}
ALL_RULES_BROKEN: dict[str, Any] = spec(
    model={"name": "m", "source": {"hub": {}, "pvc": {"claimName": "w"}}, "cache": {}},
    engine={"extraArgs": ["-dp", "2"]},
    prefill={"minReplicas": 3, "maxReplicas": 2, "replicas": 2, "extraArgs": ["--enforce-eager", "--port=1"],
             "rollingUpdate": {"maxSurge": "x", "maxUnavailable": "101%"}},
    decode={"gpu": {"count": 3}, "parallelism": {"tensor": 2}, "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}},
    kvTransfer={"transport": "tcp", "rdma": {}},
    routing={
        "remotePrefill": {"minInputTokens": 100},
        "localPrefill": {"maxInputTokens": 200},
        "tenants": [{"name": "t", "match": {"values": ["x"]}, "maxQueued": 1, "maxQueueTimeMs": 1,
                     "remotePrefill": {"minInputTokens": 1}, "localPrefill": {"maxInputTokens": 2}},
                    {"name": "t", "match": {"values": ["y"]}}],
        "buckets": [{"name": "b", "minInputTokens": 10, "maxInputTokens": 5}, {"name": "b"}],
    },
    autoscaling={"enabled": True, "prefillDecodeRatio": {"min": 5, "max": 1},
                 "prometheus": {**PROM, "authSecretRef": {"name": "t"}, "basicAuthSecretRef": {"name": "b"},
                                "headers": {"Authorization": "x", "bad name": "y"},
                                "tls": {"caSecretRef": {"name": "ca"}, "insecureSkipVerify": True}}},
    modePolicy={"windowSeconds": 10, "probe": {"ratePerMinute": 1, "successesToReturn": 1}},
    observability={"tracing": {"endpoint": "https://otel-collector:4317/traces", "protocol": "grpc"}},
)
ALL_RULES_BROKEN_AT: list[tuple[str, str]] = [
    ("model-cache-one-kind", "spec.model.cache"),
    ("source-hub-or-pvc", "spec.model.source"),
    ("engine-extra-args-not-reserved", "spec.engine"),
    ("pool-min-le-max", "spec.prefill"),
    ("pool-replicas-in-range", "spec.prefill"),
    ("pool-extra-args-not-reserved", "spec.prefill"),
    ("rolling-update-max-surge-format", "spec.prefill.rollingUpdate"),
    ("rolling-update-max-unavailable-format", "spec.prefill.rollingUpdate"),
    ("pool-gpu-count-multiple", "spec.decode"),
    ("rolling-update-not-both-zero", "spec.decode.rollingUpdate"),
    ("rdma-needs-rdma-transport", "spec.kvTransfer"),
    ("routing-remote-above-local", "spec.routing"),
    ("routing-tenant-names-unique", "spec.routing"),
    ("routing-bucket-names-unique", "spec.routing"),
    ("tenant-remote-above-local", "spec.routing.tenants[0]"),
    ("tenant-max-queued-needs-queue", "spec.routing.tenants[0]"),
    ("tenant-max-queue-time-needs-queue", "spec.routing.tenants[0]"),
    ("bucket-max-above-min", "spec.routing.buckets[0]"),
    ("ratio-min-le-max", "spec.autoscaling.prefillDecodeRatio"),
    ("prometheus-one-auth", "spec.autoscaling.prometheus"),
    ("prometheus-header-names", "spec.autoscaling.prometheus"),
    ("prometheus-headers-no-credentials", "spec.autoscaling.prometheus"),
    ("prometheus-tls-ca-or-insecure", "spec.autoscaling.prometheus.tls"),
    ("mode-probes-reachable", "spec.modePolicy"),
    ("tracing-grpc-no-path", "spec.observability.tracing"),
]

# issue 19: the multi-node rules (their cases live with their admission tests)
from tests.api.test_multinode_admission import (  # noqa: E402 - after the tables they extend
    MULTINODE_BROKEN,
    MULTINODE_BROKEN_AT,
    MULTINODE_RULE_CASES,
)

RULE_CASES.update(MULTINODE_RULE_CASES)
ALL_RULES_BROKEN["aggregated"] = MULTINODE_BROKEN["aggregated"]
ALL_RULES_BROKEN["prefill"]["parallelism"] = MULTINODE_BROKEN["prefill"]["parallelism"]
ALL_RULES_BROKEN_AT += MULTINODE_BROKEN_AT
