"""The frame every rlmon dashboard shares: datasource, run and role variables, alert annotations.

Alerts become annotations from ``rlmon_alert_firing``, so a firing alert marks every chart at the
time it fired, whether or not Alertmanager is deployed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as dm

from rlmon.service.dashboards.panels import DATASOURCE
from rlmon.service.dashboards.promql import select
from rlmon.service.export import series

__all__ = ["TAG", "annotate", "frame"]

TAG = "rlmon"
ALERTS_ANNOTATION = "rlmon alerts"

# Grafana's Prometheus annotation reads these keys beside `expr`; the SDK's typed AnnotationQuery
# models only the built-in annotation target, so they are set on the JSON (see `annotate`).
_ANNOTATION_EXTRAS: dict[str, Any] = {
    "step": "30s",
    "titleFormat": "{{alert}}",
    "textFormat": "{{severity}}: run {{run}}, role {{role}}",
    "tagKeys": "alert,severity,run,role",
    "useValueForTime": False,
}


def _variables() -> list[Builder[dm.VariableModel]]:
    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        db.QueryVariable("run").label("Run").datasource(DATASOURCE)
        .query(f"label_values({series.STEP.name}, run)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".*"),
        db.QueryVariable("role").label("Role").datasource(DATASOURCE)
        .query(f'label_values({series.STEP.name}{{run=~"$run"}}, role)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".*"),
    ]


def frame(uid: str, title: str, description: str,
          extra_variables: Sequence[Builder[dm.VariableModel]] = ()) -> db.Dashboard:
    """A dashboard with the shared variables, alert annotations, links, time and refresh."""
    alerts = (
        db.AnnotationQuery().name(ALERTS_ANNOTATION).datasource(DATASOURCE).enable(True)
        .icon_color("red").expr(select(series.ALERT_FIRING.name) + " == 1")
    )
    return (
        db.Dashboard(title).uid(uid).description(description).tags([TAG])
        .editable().timezone("browser").time("now-6h", "now").refresh("30s")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .variables(_variables() + list(extra_variables))
        .annotation(alerts)
        .link(db.DashboardLink("rlmon").type(dm.DashboardLinkType.DASHBOARDS).tags([TAG])
              .as_dropdown(True).include_vars(True).keep_time(True))
    )


def annotate(model: dict[str, Any]) -> dict[str, Any]:
    """Add the Prometheus annotation keys the typed builder cannot express to the alert annotation."""
    for item in model.get("annotations", {}).get("list", []):
        if item.get("name") == ALERTS_ANNOTATION:
            item.update(_ANNOTATION_EXTRAS)
    return model
