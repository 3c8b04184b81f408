"""The service runs seed 000's sanity layer on every published step: findings are logged, kept and
exported as ``rlmon_sanity_findings_total{kind}`` (no Ray: ServiceCore in-process)."""

from __future__ import annotations

import math

from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sinks import SanitySink
from tests.support.records import step_record
from tests.support.scrape import scrape

LOSS = catalog.get("actor/loss").name


def test_loss_stuck_at_ln3_is_found_once_and_exported() -> None:
    core = ServiceCore()
    try:
        records = [
            step_record(run="run-a", step=step, metrics={LOSS: math.log(3.0) + 1e-4})
            for step in range(6)
        ]
        core.publish(records)
        kinds = [f.kind.value for f in core.spine.sinks[SanitySink].findings]
        assert kinds == ["LossAtLn3"]
        samples = scrape(core.metrics)
        assert samples[("rlmon_sanity_findings_total", (("kind", "LossAtLn3"),))] == 1.0
        # a healthy loss in another run finds nothing
        core.publish([step_record(run="run-b", step=s, metrics={LOSS: 0.3}) for s in range(6)])
        assert len(core.spine.sinks[SanitySink].findings) == 1
    finally:
        core.close()
