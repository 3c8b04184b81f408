"""The service runs seed 000's sanity layer on every published step: findings are logged, kept and
exported as ``rlmon_sanity_findings_total{kind}`` (no Ray: ServiceCore in-process)."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export.exporter import RlmonCollector
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore

LOSS = catalog.get("actor/loss").name


def test_loss_stuck_at_ln3_is_found_once_and_exported() -> None:
    core = ServiceCore()
    try:
        records = [
            StepRecord("run-a", "actor", step, True, 1, 1, (), {LOSS: math.log(3.0) + 1e-4})
            for step in range(6)
        ]
        core.publish(records)
        kinds = [f.kind.value for f in core.findings]
        assert kinds == ["LossAtLn3"]
        registry = CollectorRegistry()
        registry.register(RlmonCollector(core.metrics))
        text = generate_latest(registry).decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
        }
        assert samples[("rlmon_sanity_findings_total", (("kind", "LossAtLn3"),))] == 1.0
        # a healthy loss in another run finds nothing
        core.publish([StepRecord("run-b", "actor", s, True, 1, 1, (), {LOSS: 0.3}) for s in range(6)])
        assert len(core.findings) == 1
    finally:
        core.close()
