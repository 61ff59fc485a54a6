"""Prometheus metrics of the operator process (``disagg operator --metrics-port``)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from .reconcile import Reconciler

HELP = {
    "reconciles": "Reconciles run (create, update, resume, status and child events).",
    "applies": "Server-side applies of child objects (each one a real change: missing, changed or drifted).",
    "deletes": "Child objects deleted because the spec no longer wants them.",
    "status_patches": "Status subresource patches of DisaggregatedModels.",
    "scale_handovers": "Deployments whose spec.replicas the operator handed to the autoscaler's field manager.",
    "coalesced": "Event-triggered reconciles folded into one already waiting for the same model.",
    "events_skipped": "Watch events that needed no reconcile (a child as last applied or verified; our own status "
                      "patch).",
}


class ReconcilerCollector(Collector):
    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler

    def collect(self) -> Iterator[CounterMetricFamily]:
        for key, help_text in HELP.items():
            yield CounterMetricFamily(f"disagg_operator_{key}", help_text, value=self.reconciler.counters[key])
