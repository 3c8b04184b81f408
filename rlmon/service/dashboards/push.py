"""Upload the dashboards to a running Grafana through its HTTP API (grafana-client).

Each dashboard keeps its uid, so a push is an upsert: the first creates, the next overwrite and
Grafana keeps the version history. The folder has a stable uid too, created when missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException

from rlmon.service.dashboards.registry import DASHBOARDS, DashboardDef, model

__all__ = ["MIN_GRAFANA_MAJOR", "PushError", "PushResult", "connect", "push"]

MIN_GRAFANA_MAJOR = 11  # the JSON is built with the SDK's Grafana 11.6 schema (schemaVersion 41)


class PushError(RuntimeError):
    """Grafana refused the upload or is too old for the dashboards; the message says which."""


@dataclass(frozen=True, slots=True)
class PushResult:
    uid: str
    title: str
    url: str
    version: int


class _Folders(Protocol):
    def get_folder(self, uid: str) -> dict[str, Any]: ...
    def create_folder(self, title: str, uid: str | None = None) -> dict[str, Any]: ...


class _Dashboards(Protocol):
    def update_dashboard(self, dashboard: dict[str, Any]) -> dict[str, Any]: ...


class Grafana(Protocol):
    """The part of ``grafana_client.GrafanaApi`` a push uses."""

    @property
    def version(self) -> str: ...
    @property
    def folder(self) -> _Folders: ...
    @property
    def dashboard(self) -> _Dashboards: ...


def connect(url: str, token: str, timeout: float = 10.0) -> GrafanaApi:
    """A client for ``url`` authenticating with a service-account token (sent as a Bearer token)."""
    return GrafanaApi.from_url(url, credential=token, timeout=timeout)


def _check_version(api: Grafana) -> str:
    try:
        version = str(api.version or "")
    except GrafanaException as exc:  # 401 for a bad token lands here first
        raise PushError(f"cannot read the Grafana version: {exc}") from None
    try:
        major = int(version.split(".", 1)[0])
    except ValueError:
        raise PushError(f"Grafana reported an unreadable version {version!r}") from None
    if major < MIN_GRAFANA_MAJOR:
        raise PushError(
            f"Grafana {version} is too old: the dashboards target Grafana "
            f"{MIN_GRAFANA_MAJOR}.x or newer (schemaVersion 41)"
        )
    return version


def _ensure_folder(api: Grafana, uid: str, title: str) -> str:
    try:
        return str(api.folder.get_folder(uid)["uid"])
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise PushError(f"folder {uid!r}: {exc}") from None
    try:
        return str(api.folder.create_folder(title, uid=uid)["uid"])
    except GrafanaClientError as exc:
        raise PushError(f"cannot create folder {title!r} (uid {uid!r}): {exc}") from None


def push(api: Grafana, *, folder: str = "rlmon", folder_uid: str = "rlmon",
         dashboards: Sequence[DashboardDef] = DASHBOARDS, message: str = "rlmon dashboards push",
         ) -> list[PushResult]:
    """Upsert ``dashboards`` into ``folder``; returns what Grafana answered for each."""
    _check_version(api)
    target = _ensure_folder(api, folder_uid, folder)
    results = []
    for dash in dashboards:
        content = model(dash)
        body = {"dashboard": content, "folderUid": target, "overwrite": True, "message": message}
        try:
            answer = api.dashboard.update_dashboard(body)
        except GrafanaClientError as exc:
            raise PushError(f"dashboard {dash.uid!r}: {exc}") from None
        except GrafanaException as exc:
            raise PushError(f"dashboard {dash.uid!r}: Grafana failed: {exc}") from None
        results.append(PushResult(str(answer.get("uid", dash.uid)), str(content["title"]),
                                  str(answer.get("url", "")), int(answer.get("version", 0))))
    return results
