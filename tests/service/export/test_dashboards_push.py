"""``rlmon dashboards push`` through grafana-client against a loopback Grafana API receiver.

No Grafana server can run here (no package, binary or container engine; see docs/deploy.md), so this
is the one mock in the suite: a small http.server on 127.0.0.1 that implements the parts of
Grafana's HTTP API a push uses, with Grafana's request and response shapes
(``GET /api/frontend/settings`` version probe, ``GET /api/folders/:uid`` with 404 for a missing
folder, ``POST /api/folders``, ``POST /api/dashboards/db`` with ``{dashboard, folderUid,
overwrite}``), Bearer-token auth, and Grafana's upsert-by-uid versioning. It checks each request's
shape and keeps what was stored. What only a real Grafana can tell (that it renders the panels and
runs the queries) is not tested.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rlmon.cli import main
from rlmon.service.dashboards import DASHBOARDS, model
from rlmon.service.dashboards.push import PushError, connect, push

TOKEN = "glsa_test_token_0123456789"


class FakeGrafana:
    """Grafana's dashboard and folder API, in memory, on 127.0.0.1."""

    def __init__(self, version: str = "11.6.0") -> None:
        self.version = version
        self.folders: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.errors: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._reply(401, {"message": "Unauthorized"})
                    return False
                return True

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path))
                if not self._authorized():
                    return
                if self.path == "/api/frontend/settings":
                    self._reply(200, {"buildInfo": {"version": outer.version,
                                                    "edition": "Open Source"}})
                elif self.path.startswith("/api/folders/"):
                    uid = self.path.rsplit("/", 1)[1]
                    if uid in outer.folders:
                        self._reply(200, outer.folders[uid])
                    else:
                        self._reply(404, {"message": "folder not found", "status": "not-found"})
                else:
                    self._reply(404, {"message": "Not found"})

            def do_POST(self) -> None:
                outer.requests.append(("POST", self.path))
                if not self._authorized():
                    return
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.headers.get_content_type() != "application/json":
                    outer.errors.append("content type")
                if self.path == "/api/folders":
                    self._reply(*outer.create_folder(body))
                elif self.path == "/api/dashboards/db":
                    self._reply(*outer.save_dashboard(body))
                else:
                    self._reply(404, {"message": "Not found"})

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def create_folder(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not isinstance(body.get("title"), str) or not body["title"]:
            self.errors.append(f"folder without title: {body}")
            return 400, {"message": "folder title cannot be empty"}
        uid = body.get("uid") or f"auto{len(self.folders)}"
        if uid in self.folders:
            return 409, {"message": "a folder with the same uid already exists"}
        folder = {"id": len(self.folders) + 1, "uid": uid, "title": body["title"],
                  "url": f"/dashboards/f/{uid}/", "version": 1}
        self.folders[uid] = folder
        return 200, folder

    def save_dashboard(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        allowed = {"dashboard", "folderUid", "folderId", "overwrite", "message"}
        if set(body) - allowed or "dashboard" not in body:
            self.errors.append(f"unexpected keys {sorted(body)}")
            return 400, {"message": "bad request data"}
        dash = body["dashboard"]
        if not dash.get("title") or not dash.get("uid") or dash.get("id") is not None:
            self.errors.append("dashboard needs a title and a uid, and no id for an upsert")
            return 400, {"message": "bad request data"}
        if body.get("folderUid") not in self.folders:
            return 400, {"message": "folder not found"}
        stored = self.dashboards.get(dash["uid"])
        if stored is not None and not body.get("overwrite"):
            return 412, {"message": "A dashboard with the same uid already exists",
                         "status": "name-exists"}
        version = (stored["version"] + 1) if stored else 1
        self.dashboards[dash["uid"]] = {"dashboard": dash, "folderUid": body["folderUid"],
                                        "version": version}
        slug = dash["title"].lower().replace(" ", "-").replace("/", "")
        return 200, {"id": list(self.dashboards).index(dash["uid"]) + 1, "uid": dash["uid"],
                     "url": f"/d/{dash['uid']}/{slug}", "status": "success",
                     "version": version, "slug": slug}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    g = FakeGrafana()
    yield g
    g.close()


def test_push_creates_folder_then_upserts_by_uid(grafana: FakeGrafana) -> None:
    api = connect(grafana.url, TOKEN)
    first = push(api, folder="RLHF", folder_uid="rlmon")
    assert [r.uid for r in first] == [d.uid for d in DASHBOARDS]
    assert all(r.version == 1 and r.url.startswith(f"/d/{r.uid}/") for r in first)
    assert grafana.folders["rlmon"]["title"] == "RLHF"
    for dash in DASHBOARDS:
        stored = grafana.dashboards[dash.uid]
        assert stored["folderUid"] == "rlmon"
        assert stored["dashboard"] == model(dash)  # exactly the generated JSON
        assert stored["dashboard"]["schemaVersion"] == 41
    second = push(connect(grafana.url, TOKEN), folder="RLHF", folder_uid="rlmon")
    assert [r.version for r in second] == [2] * len(DASHBOARDS)  # overwritten, same uids
    assert len(grafana.folders) == 1
    assert len(grafana.dashboards) == len(DASHBOARDS)
    assert ("POST", "/api/folders") in grafana.requests
    assert grafana.requests.count(("POST", "/api/folders")) == 1
    assert grafana.requests[0] == ("GET", "/api/frontend/settings")
    assert not grafana.errors


def test_cli_push(grafana: FakeGrafana, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "push", "--url", grafana.url, "--token", TOKEN]) == 0
    out = capsys.readouterr().out
    assert out.count("pushed ") == len(DASHBOARDS)
    assert f"{grafana.url}/d/rlmon-overview/" in out
    assert set(grafana.dashboards) == {d.uid for d in DASHBOARDS}
    assert not grafana.errors


def test_wrong_token_and_old_grafana_are_errors(grafana: FakeGrafana,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "push", "--url", grafana.url, "--token", "wrong"]) == 1
    assert "Unauthorized" in capsys.readouterr().err
    assert not grafana.dashboards
    grafana.version = "10.4.2"
    with pytest.raises(PushError, match="too old"):
        push(connect(grafana.url, TOKEN))
    assert not grafana.dashboards
    assert not grafana.folders


def test_unreachable_grafana(capsys: pytest.CaptureFixture[str]) -> None:
    g = FakeGrafana()
    url = g.url
    g.close()  # nothing listens there any more
    assert main(["dashboards", "push", "--url", url, "--token", TOKEN, "--timeout", "2"]) == 1
    assert "rlmon dashboards push" in capsys.readouterr().err
