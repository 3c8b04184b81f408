"""Renderings of the catalog for people: the table of docs/metrics.md and a JSON dump."""

from __future__ import annotations

from typing import Any

from rlmon.service.metrics import catalog
from rlmon.service.metrics.forms import FORMS
from rlmon.service.metrics.spec import MetricSpec

__all__ = ["catalog_json", "catalog_markdown"]



def _spec_json(spec: MetricSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "help": spec.help,
        "forms": [FORMS[f].describe() for f in spec.forms],
        "unit": spec.unit.value,
        "domain": spec.domain.value,
        "healthy": list(spec.healthy) if spec.healthy else None,
        "prometheus": spec.prometheus_name,
        "what_to_check": spec.what_to_check,
        "alerts": [
            {"name": a.name, "severity": a.severity.value, "for": a.for_steps}
            for a in spec.alerts
        ],
        "panel": {"dashboard": spec.panel.dashboard, "row": spec.panel.row},
    }


def catalog_json() -> list[dict[str, Any]]:
    return [_spec_json(spec) for spec in catalog.metrics()]


def catalog_markdown() -> str:
    lines = [
        "| name | form | unit | domain | healthy | Prometheus | alerts | meaning |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for spec in catalog.metrics():
        healthy = f"{spec.healthy[0]:g} .. {spec.healthy[1]:g}" if spec.healthy else ""
        alerts = ", ".join(f"`{a.name}`" for a in spec.alerts)
        forms = " or ".join(FORMS[f].describe() for f in spec.forms)
        lines.append(
            f"| `{spec.name}` | {forms} | {spec.unit.value} | {spec.domain.value} | {healthy} "
            f"| `{spec.prometheus_name}` | {alerts} | {spec.help} |"
        )
    return "\n".join(lines) + "\n"
