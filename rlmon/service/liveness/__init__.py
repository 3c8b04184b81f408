"""Liveness: whether each (run, role) still makes progress, judged by time (docs/liveness.md)."""
