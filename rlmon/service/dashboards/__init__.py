"""Grafana dashboards as typed code (grafana-foundation-sdk, the Grafana 11.6 build).

``DASHBOARDS`` lists them; ``render`` turns one into the JSON that ``rlmon dashboards build``
writes to ``dashboards/`` and ``rlmon dashboards push`` uploads.
"""

from rlmon.service.dashboards.registry import DASHBOARDS, DashboardDef, model, render

__all__ = ["DASHBOARDS", "DashboardDef", "model", "render"]
