"""Workloads: the model zoo (random weights, synthetic inputs)."""
