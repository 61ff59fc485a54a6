"""The simulator: a simulated vLLM worker with a roofline performance model."""
