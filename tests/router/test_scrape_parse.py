"""What the router reads from a worker's /metrics (router/load.py): families summed over their labels, and the one
read per label value — the waiting requests split by reason, where only those waiting for room are a queue."""

from __future__ import annotations

from disagg.router.load import WAITING_FOR_CAPACITY, Worker, parse_prometheus

TEXT = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:something_else 7
"""


def test_waiting_by_reason_is_read_per_reason_and_the_rest_summed() -> None:
    got = parse_prometheus(TEXT)
    assert got["vllm:num_requests_waiting"] == 5.0
    assert got[WAITING_FOR_CAPACITY] == 2.0
    assert got['vllm:num_requests_waiting_by_reason{reason="deferred"}'] == 3.0
    assert "vllm:num_requests_waiting_by_reason" not in got
    assert got["vllm:num_requests_running"] == 5.0
    assert "vllm:something_else" not in got


def test_queued_counts_only_requests_waiting_for_room() -> None:
    w = Worker(url="http://w", role="decode")
    w.update_scrape(parse_prometheus(TEXT))
    assert w.queued == 2.0  # the 3 waiting for their remote KV are no queue
    old = Worker(url="http://o", role="decode")  # a release without the split (vLLM < 0.20): every waiting one
    old.update_scrape(parse_prometheus("vllm:num_requests_waiting 5\n"))
    assert old.queued == 5.0
