"""Metric queries (PromQL) and pure scaling / mode policies."""
