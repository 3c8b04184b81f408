"""``rlmon diff``: where two runs part ways beyond their own noise, and the settings that differ."""

from rlmon.service.diff.divergence import DiffParams, DiffResult, MetricDivergence, diff_runs
from rlmon.service.diff.runs import RunSeries

__all__ = ["DiffParams", "DiffResult", "MetricDivergence", "RunSeries", "diff_runs"]
