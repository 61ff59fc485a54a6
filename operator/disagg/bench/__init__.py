"""Benchmarks (`disagg bench`): goodput by policy, router overhead, the autoscaler in the twin, operator
convergence. Load generation lives in :mod:`disagg.load`, processes in :mod:`disagg.local.procs`."""
