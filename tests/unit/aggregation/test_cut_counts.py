"""What was cut to fit a bound is counted and exported (here: timeline spans past the per-rank
bound), never silently lost."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlmon.service.config import Settings
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export import series
from rlmon.service.export.http import build_registry
from rlmon.service.service_core import ServiceCore


def test_timeline_spans_cut_are_exported(tmp_path: Path) -> None:
    settings = Settings.model_validate({"notifiers": {"console": {"enabled": False}}})
    core = ServiceCore(settings, state_dir=tmp_path)
    try:
        core.publish([StepRecord("r", "actor", n, True, 1, 1, (), {}, timelines_cut=cut)
                      for n, cut in enumerate((3, 0, 4))])
        text = generate_latest(build_registry(core.metrics, process=False)).decode()
    finally:
        core.close()
    family = series.STATE_REMOVED.family_name
    samples = {tuple(sorted(s.labels.items())): s.value
               for f in text_string_to_metric_families(text) if f.name == family
               for s in f.samples}
    assert samples[(("component", "service"), ("kind", "timeline_spans_cut"))] == 7.0
