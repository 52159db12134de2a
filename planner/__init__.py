"""Parallelism planner: how to split a model over a cluster. Never imports torch."""
__version__ = "0.1.0"
