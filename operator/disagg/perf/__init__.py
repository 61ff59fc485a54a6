"""The performance model every part shares: GPU, model and transport presets (presets.py), the roofline of one
engine step (roofline.py), and the router's per-worker cost prior derived from it (costs.py).

Pure (no I/O, no clock): the simulator's engines, the planner, the twin and the router's placement all read the
same numbers, so a decision the router makes is priced the way the twin that benchmarks it prices it.
"""
