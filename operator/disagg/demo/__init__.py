"""`disagg demo`: prefill/decode disaggregation routing, falling back and scaling, on this machine.

No GPU, no cluster, no Docker. A real control plane (etcd + kube-apiserver + kube-controller-manager built from
Go sources), the operator, a local pod runtime that runs the operator's pods as processes (`vllm serve` →
`disagg sim`, the simulator), Prometheus (Debian) scraping them, and a mixed workload through the router.
Once the model serves with both pools ready:

1. mixed traffic — long RAG prompts, short chats, long streams, three tenants: per-request decisions;
2. a load step of long outputs, then of long prompts → the autoscaler grows decode, then prefill, independently;
3. KV-transfer failures injected into the decode workers → per-request fallbacks (no client errors) → the
   operator flips the model to Aggregated → faults healed → it flips back after the hold.

Every request is traced to a local Jaeger (its query API's URL is printed); the summary links the slowest traced
request's trace and prints its waterfall (docs/demo.md, Traces). Results: a summary in the terminal, PNG plots and
report.html in the results directory. Everything started is stopped at the end, on Ctrl-C, or on error.

Modules: :mod:`.acts` (the three acts, on a :class:`disagg.local.harness.ModelHarness`), :mod:`.report` (the
report), :mod:`.run` (``run_demo``: the stack, the acts, the report).
"""
