"""Local substrate: a real control plane on loopback (and, later, a local pod runtime)."""
