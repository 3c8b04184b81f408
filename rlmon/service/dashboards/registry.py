"""The dashboards rlmon ships, and their rendering to JSON with stable uids and panel ids."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from rlmon.service.dashboards import overview, rollout, selfmon
from rlmon.service.dashboards.common import annotate

__all__ = ["DASHBOARDS", "DIRECTORY", "DashboardDef", "model", "render"]

DIRECTORY = "dashboards"


@dataclass(frozen=True, slots=True)
class DashboardDef:
    """One shipped dashboard: its stable uid (Grafana upserts by it) and its file name."""

    uid: str
    slug: str
    build: Callable[[], db.Dashboard]

    @property
    def path(self) -> str:
        return f"{DIRECTORY}/{self.slug}.json"


DASHBOARDS: tuple[DashboardDef, ...] = (
    DashboardDef(overview.UID, "rlmon-overview", overview.build),
    DashboardDef(rollout.UID, "rlmon-rollout", rollout.build),
    DashboardDef(selfmon.UID, "rlmon-self", selfmon.build),
)


def _number_panels(panels: list[dict[str, Any]], start: int = 1) -> int:
    """Give every panel (rows and their nested panels too) a unique id, in layout order."""
    next_id = start
    for panel in panels:
        panel["id"] = next_id
        next_id += 1
        next_id = _number_panels(panel.get("panels", []), next_id)
    return next_id


def model(dashboard: DashboardDef) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a plain dict)."""
    data: dict[str, Any] = json.loads(json.dumps(dashboard.build().build(), cls=JSONEncoder))
    if data.get("uid") != dashboard.uid:
        raise ValueError(f"dashboard {dashboard.slug}: uid {data.get('uid')!r} != {dashboard.uid!r}")
    _number_panels(data.get("panels", []))
    return annotate(data)


def render(dashboard: DashboardDef) -> str:
    """Deterministic JSON text (sorted keys, two-space indent, trailing newline)."""
    return json.dumps(model(dashboard), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
