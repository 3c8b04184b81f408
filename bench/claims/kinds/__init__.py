"""The claim kinds: importing this package registers each module's scorers (add a module here)."""

from bench.claims.kinds import alerts, diff, findings, projection, run_state

__all__ = ["alerts", "diff", "findings", "projection", "run_state"]
