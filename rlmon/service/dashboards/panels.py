"""Panel builders shared by the dashboards: catalog metric panels, stats and tables.

A catalog metric ``N`` is drawn together with its extremes ``N_min`` / ``N_max`` when the catalog
has them (the IS ratio's mean, min and max on one chart), with the union of their alert levels as
threshold bands, so the chart shows what the alert engine judges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from rlmon.service.dashboards.promql import select
from rlmon.service.dashboards.thresholds import Band, alert_bands, healthy_bands
from rlmon.service.metrics import catalog
from rlmon.service.metrics.spec import Form, MetricSpec, Unit

__all__ = [
    "DATASOURCE",
    "MetricGroup",
    "catalog_rows",
    "metric_groups",
    "metric_panel",
    "query",
    "stat_panel",
    "table_panel",
    "timeseries_panel",
]

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
LEGEND = "{{run}} {{role}}"

# Grafana unit ids; the catalog's unit becomes the axis label where Grafana has no id for it.
_GRAFANA_UNIT: dict[Unit, str] = {
    Unit.NONE: "none",
    Unit.RATIO: "percentunit",
    Unit.NATS: "none",
    Unit.TOKENS: "short",
    Unit.SECONDS: "s",
    Unit.BYTES: "bytes",
    Unit.STEPS: "short",
    Unit.REQUESTS: "short",
    Unit.TOKENS_PER_SECOND: "short",
    Unit.WATTS: "watt",
}
_AXIS_LABEL: dict[Unit, str] = {
    Unit.NATS: "nats",
    Unit.TOKENS: "tokens",
    Unit.STEPS: "steps",
    Unit.REQUESTS: "requests",
    Unit.TOKENS_PER_SECOND: "tokens/s",
}
_EXTREMES = ("_min", "_max")


@dataclass(frozen=True, slots=True)
class MetricGroup:
    """One chart: a catalog metric and the extremes drawn with it."""

    main: MetricSpec
    extremes: tuple[MetricSpec, ...] = ()

    @property
    def specs(self) -> tuple[MetricSpec, ...]:
        return (self.main, *self.extremes)

    @property
    def title(self) -> str:
        title = self.main.panel.title or self.main.name
        if self.extremes:
            first = "mean" if Form.MEAN in self.main.forms else "value"
            title += " (" + ", ".join([first] + [s.name.rsplit("_", 1)[1] for s in self.extremes]) + ")"
        return title


def metric_groups(specs: Iterable[MetricSpec]) -> list[MetricGroup]:
    """Fold ``N_min`` / ``N_max`` into the group of ``N`` when ``N`` is among ``specs``."""
    specs = list(specs)
    names = {s.name for s in specs}
    folded = {s.name for s in specs
              if s.name.endswith(_EXTREMES) and s.name[:-4] in names}
    groups = []
    for spec in specs:
        if spec.name in folded:
            continue
        extremes = tuple(s for s in specs if s.name in folded and s.name[:-4] == spec.name)
        groups.append(MetricGroup(spec, extremes))
    return groups


def query(expr: str, legend: str = LEGEND, ref: str = "A", *, instant: bool = False,
          table_format: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    q = q.instant() if instant else q.range()
    if table_format:
        q = q.format(pm.PromQueryFormat.TABLE)
    return q


def _thresholds(bands: Sequence[Band]) -> db.ThresholdsConfig:
    steps = [dm.Threshold(value=b.start, color=b.color) for b in bands]
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def timeseries_panel(title: str, description: str, targets: Sequence[prometheus.Dataquery], *,
                     unit: str = "none", axis_label: str = "", bands: Sequence[Band] = (),
                     dashed: bool = False, span: int = 8, height: int = 8,
                     ) -> timeseries.Panel:
    panel = (
        timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
        .targets(list(targets)).unit(unit).span(span).height(height)
        .line_width(1).fill_opacity(10).show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(cb.VizLegendOptions().show_legend(True)
                .display_mode(cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM))
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                 .sort(cm.SortOrder.DESCENDING))
    )
    if axis_label:
        panel = panel.axis_label(axis_label)
    if bands:
        mode = cm.GraphThresholdsStyleMode.DASHED if dashed else (
            cm.GraphThresholdsStyleMode.LINE_AND_AREA)
        panel = panel.thresholds(_thresholds(bands)).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(mode))
    return panel


def _description(group: MetricGroup) -> str:
    main = group.main
    parts = [main.help]
    if main.healthy is not None:
        parts.append(f"Healthy range: {main.healthy[0]:g} .. {main.healthy[1]:g}.")
    alerts = [a for s in group.specs for a in s.alerts]
    if alerts:
        parts.append("Alerts: " + ", ".join(f"{a.name} ({a.severity})" for a in alerts) + ".")
    if main.what_to_check:
        parts.append(main.what_to_check)
    parts.append("Series: " + ", ".join(f"`{s.prometheus_name}`" for s in group.specs) + ".")
    return " ".join(parts)


def metric_panel(group: MetricGroup, *, span: int = 8) -> timeseries.Panel:
    """A time series of one catalog metric (and its extremes) with the catalog's levels drawn."""
    main = group.main
    refs = "ABCDEFGH"
    targets = [query(select(main.prometheus_name), LEGEND, refs[0])]
    for i, spec in enumerate(group.extremes, start=1):
        suffix = spec.name.rsplit("_", 1)[1]
        targets.append(query(select(spec.prometheus_name), f"{LEGEND} {suffix}", refs[i]))
    bands = alert_bands(a for s in group.specs for a in s.alerts)
    dashed = False
    if not bands and main.healthy is not None:
        bands, dashed = healthy_bands(main.healthy), True
    return timeseries_panel(
        group.title, _description(group), targets,
        unit=_GRAFANA_UNIT[main.unit], axis_label=_AXIS_LABEL.get(main.unit, ""),
        bands=bands, dashed=dashed, span=span,
    )


def stat_panel(title: str, description: str, expr: str, *, unit: str = "none",
               bands: Sequence[Band] = (), span: int = 6, height: int = 4,
               legend: str = LEGEND) -> stat.Panel:
    panel = (
        stat.Panel().title(title).description(description).datasource(DATASOURCE)
        .with_target(query(expr, legend, instant=True)).unit(unit).span(span).height(height)
        .color_mode(cm.BigValueColorMode.BACKGROUND).graph_mode(cm.BigValueGraphMode.NONE)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if bands:
        panel = panel.thresholds(_thresholds(bands))
    return panel


def table_panel(title: str, description: str, expr: str, *, span: int = 24,
                height: int = 6) -> table.Panel:
    """An instant table of the series ``expr`` returns, one row per label set."""
    return (
        table.Panel().title(title).description(description).datasource(DATASOURCE)
        .with_target(query(expr, "", instant=True, table_format=True))
        .span(span).height(height).no_value("none")
        .with_transformation(dm.DataTransformerConfig(
            id_val="organize",
            options={"excludeByName": {"Time": True, "Value": True, "__name__": True}},
        ))
    )


def catalog_rows(dashboard: str) -> dict[str, list[MetricSpec]]:
    """The catalog metrics drawn on ``dashboard``, by row (in catalog order), in panel order."""
    rows: dict[str, list[MetricSpec]] = {}
    for spec in catalog.metrics():
        if spec.panel.dashboard == dashboard:
            rows.setdefault(spec.panel.row, []).append(spec)
    return {row: sorted(specs, key=lambda s: s.panel.order) for row, specs in rows.items()}
