"""Benchmarks and load generation (workload mixes, open-loop client, goodput)."""
