"""Pure functions: DisaggregatedModel → Kubernetes manifests (plain dicts, no I/O)."""
