"""disagg: a Kubernetes operator for vLLM prefill/decode disaggregation."""

__version__ = "0.1.0"
