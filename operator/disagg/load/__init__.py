"""Load generation, shared by the demo, the benchmarks and the e2e tests: workload mixes (:mod:`.workload`) and an
open-loop load generator that measures TTFT, TPOT and goodput per request (:mod:`.loadgen`)."""
