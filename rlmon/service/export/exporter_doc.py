"""The list of exported Prometheus families in docs/metrics.md, from the exporter and the catalog."""

from __future__ import annotations

from rlmon.service.artifact import Artifact
from rlmon.service.export.exporter import exported_families
from rlmon.service.metrics import catalog

__all__ = ["artifacts", "exported_metrics_markdown"]


def exported_metrics_markdown() -> str:
    per_metric = {spec.prometheus_name: spec.name for spec in catalog.metrics()}
    families = exported_families()
    catalog_names = [n for n, _ in families if n in per_metric]
    others = [(n, doc) for n, doc in families if n not in per_metric]
    lines = [
        f"Per catalog metric ({len(catalog_names)} gauges, labels `run`, `role`; the value of the "
        "latest finalized step):",
        "",
        ", ".join(f"`{n}`" for n in catalog_names) + ".",
        "",
        "Per (run, role), per run and about the exporter itself:",
        "",
    ]
    lines += [f"- `{name}`: {doc}" for name, doc in others]
    return "\n".join(lines) + "\n"


def artifacts() -> list[Artifact]:
    return [Artifact("docs/metrics.md", exported_metrics_markdown, block="exported-metrics")]
