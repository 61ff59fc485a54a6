"""The local substrate: a real control plane on loopback (controlplane), Prometheus (prometheus), a pod runtime
that runs pods as processes (runtime), all of it plus the operator in one object (stack), one model on it driven
from outside (harness), and the one process harness every test and benchmark uses (procs)."""
