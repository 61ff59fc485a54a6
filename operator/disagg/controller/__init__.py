"""Thin kopf handlers: apply the builders' output, keep status, emit events."""
