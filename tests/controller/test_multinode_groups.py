"""The controller's group decisions for multi-node pools (controller/groups.py), pure: which groups restart, which
old objects stay, what status counts."""

from __future__ import annotations

from typing import Any

from disagg.builders import multinode as mn
from disagg.controller.groups import PoolGroups, pod_fingerprint, pool_view


def pod(group: str, rank: int, gen: str = "aaaaa", ready: bool = True, restarts: int = 0,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{group}-n{rank}-0", "uid": f"{group}-{rank}",
                            "creationTimestamp": "2030-01-01T00:00:00Z",
                            "labels": {mn.LABEL_GROUP: group, mn.LABEL_NODE_RANK: str(rank),
                                       mn.LABEL_GENERATION: gen, mn.LABEL_POOL: "decode"}}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:01:00Z"
    return {"metadata": meta, "status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "vllm", "restartCount": restarts,
                               "state": {"running": {"startedAt": "2030-01-01T00:00:10Z"}}}]}}


def test_a_broken_group_restarts_whole_unless_a_pod_of_it_is_being_deleted() -> None:
    pods = [pod("g0", 0), pod("g0", 1), pod("g1", 0, restarts=1, ready=False), pod("g1", 1)]
    pool = PoolGroups("decode", 2, "aaaaa", 2, pods)
    assert pool.restarts() == {"g1": ["g1-n0-0", "g1-n1-0"]}
    # the restart is under way (or a deleted member is about to be recreated): nothing more to delete yet
    pods[3] = pod("g1", 1, deleting=True)
    assert PoolGroups("decode", 2, "aaaaa", 2, pods).restarts() == {}


def test_status_counts_groups_ready_only_when_all_pods_are() -> None:
    pods = [pod("g0", 0), pod("g0", 1), pod("g1", 0), pod("g1", 1, ready=False), pod("g2", 0, gen="bbbbb")]
    view = PoolGroups("decode", 2, "aaaaa", 3, pods).view()
    assert view == pool_view(3, 3, 1, 2)
    assert view["status"]["readyReplicas"] == 1 and view["spec"]["replicas"] == 3


def test_old_groups_stay_until_the_new_generation_is_ready() -> None:
    old_sts = {"metadata": {"labels": {mn.LABEL_POOL: "decode", mn.LABEL_GROUP: "old-g0",
                                       mn.LABEL_GENERATION: "old"}}}
    current = {"metadata": {"labels": {mn.LABEL_POOL: "decode", mn.LABEL_GROUP: "new-g3",
                                       mn.LABEL_GENERATION: "new"}}}
    forming = PoolGroups("decode", 2, "new", 1, [pod("new-g0", 0, gen="new"), pod("new-g0", 1, gen="new", ready=False)])
    assert forming.keep("StatefulSet", old_sts) and forming.keep("Service", old_sts)
    assert not forming.keep("StatefulSet", current)  # a group scaled away goes at once
    assert not forming.keep("Deployment", old_sts)
    ready = PoolGroups("decode", 2, "new", 1, [pod("new-g0", 0, gen="new"), pod("new-g0", 1, gen="new")])
    assert not ready.keep("StatefulSet", old_sts)
    assert not PoolGroups("prefill", 2, "new", 1, []).keep("StatefulSet", old_sts)  # another pool's


def test_pod_fingerprint_changes_only_with_what_the_controller_acts_on() -> None:
    a = pod("g0", 1)
    b = pod("g0", 1)
    b["status"]["podIP"] = "10.0.0.1"
    assert pod_fingerprint(a) == pod_fingerprint(b)
    assert pod_fingerprint(a) != pod_fingerprint(pod("g0", 1, restarts=1))
    assert pod_fingerprint(a) != pod_fingerprint(pod("g0", 1, ready=False))
    assert pod_fingerprint(a) != pod_fingerprint(pod("g0", 1, deleting=True))


def test_a_worker_newer_than_the_leaders_engine_restarts_the_group_only_once_the_leader_is_ready() -> None:
    late = pod("g0", 1)
    late["metadata"]["creationTimestamp"] = "2030-01-01T00:00:20Z"  # after the leader's engine started (00:00:10)
    forming = PoolGroups("decode", 2, "aaaaa", 1, [pod("g0", 0, ready=False), late])
    assert forming.restarts() == {}  # the group is forming: a late worker joins
    running = PoolGroups("decode", 2, "aaaaa", 1, [pod("g0", 0), late])
    assert running.restarts() == {"g0": ["g0-n0-0", "g0-n1-0"]}  # it replaced a member under a running leader
