"""The claim kinds: importing this package registers each module's scorers (add a module here)."""

from bench.claims.kinds import diff, findings, projection

__all__ = ["diff", "findings", "projection"]
