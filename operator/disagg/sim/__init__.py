"""The digital twin: a simulated vLLM worker with a roofline performance model."""
