"""Which pods a scale-down removes: the idlest, through ``controller.kubernetes.io/pod-deletion-cost``.

A Deployment scaled down lets its ReplicaSet choose the pods to delete. After its own ranks (unscheduled, pending
and not-ready pods go first) the ReplicaSet controller deletes the pods with the lowest deletion cost first
(``controller.kubernetes.io/pod-deletion-cost``, an int32 annotation; beta and on by default since Kubernetes
1.22: https://kubernetes.io/docs/reference/labels-annotations-taints/#pod-deletion-cost). Before each scale-down
the autoscaler sets every pool pod's cost to the requests it holds (running + waiting, the engines' own gauges):
the pods that go are the ones with the least work to drain, and a pod in the middle of long streams stays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
INT32_MAX = 2**31 - 1


def deletion_costs(pods: Iterable[str], load: Mapping[str, float]) -> dict[str, int]:
    """Each pod's cost: its in-flight requests, rounded up (a pod with one request left outranks an idle one). A pod
    with no measurement (not scraped yet: it has just started) costs 0, as an idle pod does."""
    return {pod: min(INT32_MAX, max(0, math.ceil(load.get(pod, 0.0)))) for pod in pods}
