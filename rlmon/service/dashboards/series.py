"""Names of the exporter's structural series (step, ranks, alerts, self-metrics) for the dashboards.

The catalog names the metric families; the exporter names the rest. This module is the one place
the dashboards learn those names, so a rename in the exporter shows up here and nowhere else.
"""

from __future__ import annotations

__all__ = ["ALERT_FIRING", "RANKS_EXPECTED", "RANKS_REPORTING", "STEP", "STEP_COMPLETE"]

# Placeholder until the exporter module lands; replaced by imports from it.
STEP = "rlmon_step"
STEP_COMPLETE = "rlmon_step_complete"
RANKS_REPORTING = "rlmon_ranks_reporting"
RANKS_EXPECTED = "rlmon_ranks_expected"
ALERT_FIRING = "rlmon_alert_firing"
