"""What was cut to fit a bound is counted and exported (here: timeline spans past the per-rank
bound), never silently lost."""

from __future__ import annotations

from pathlib import Path

from rlmon.service.config import Settings
from rlmon.service.export import series
from rlmon.service.service_core import ServiceCore
from tests.support.records import step_record
from tests.support.scrape import exposition, parse_samples


def test_timeline_spans_cut_are_exported(tmp_path: Path) -> None:
    settings = Settings.model_validate({"notifiers": {"console": {"enabled": False}}})
    core = ServiceCore(settings, state_dir=tmp_path)
    try:
        core.publish([step_record(step=n, timelines_cut=cut)
                      for n, cut in enumerate((3, 0, 4))])
        text = exposition(core.metrics)
    finally:
        core.close()
    samples = {lbl: v for (name, lbl), v in parse_samples(text).items()
               if name == series.STATE_REMOVED.name}
    assert samples[(("component", "service"), ("kind", "timeline_spans_cut"))] == 7.0
