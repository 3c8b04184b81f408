"""The page's access rules fail closed (issue 32): a token asked for but empty, blank,
unreadable or holding characters a bearer token cannot is a start-up error naming where it came
from; the browser keeps a key derived from the token (never the token, never in a cookie); the
bearer scheme is matched in any case; the Host header is checked (DNS rebinding); a missing
attempt is a 404."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlmon.service.config import ConfigError, load_config
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.service_core import ServiceCore
from tests.support.web_support import example_records, fed_service, get, serving

TOKEN = "s3cret-Token_1.2~3+4/5=="


@pytest.fixture(scope="module")
def records() -> list[StepRecord]:
    return example_records()[:6]


@pytest.fixture
def guarded(tmp_path: Path, records: list[StepRecord]) -> Iterator[ServiceCore]:
    (tmp_path / "token").write_text(TOKEN + "\n")
    with serving(tmp_path / "state", records, exporter={
            "token_file": str(tmp_path / "token"), "allowed_hosts": ["rlmon.example.com"]}) as core:
        yield core


@pytest.mark.parametrize("content", ["", "\n", "   \n\t\n"])
def test_an_empty_or_blank_token_file_is_an_error_naming_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "page-token"
    path.write_text(content)
    with pytest.raises(ConfigError, match=rf"token_file {path} is empty"):
        load_config(None, exporter={"token_file": str(path)})


def test_an_unreadable_token_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"cannot read {tmp_path / 'missing'}"):
        load_config(None, exporter={"token_file": str(tmp_path / "missing")})
    if os.geteuid() != 0:  # root reads a file whatever its mode
        path = tmp_path / "locked"
        path.write_text(TOKEN)
        path.chmod(0)
        with pytest.raises(ConfigError, match=rf"cannot read {path}"):
            load_config(None, exporter={"token_file": str(path)})


def test_a_blank_token_from_the_environment_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLMON_EXPORTER__TOKEN", "  ")
    with pytest.raises(ConfigError, match="RLMON_EXPORTER__TOKEN is empty"):
        load_config(None)


@pytest.mark.parametrize(("token", "named"), [
    ("abc;def", "';'"), ("caf\u00e9", "U+00E9"), ("\u4e2d\u6587", "U+4E2D"),
    ("two words", "whitespace"), ('a"b', "'\"'")])
def test_odd_characters_in_a_token_are_a_clear_error(tmp_path: Path, token: str,
                                                      named: str) -> None:
    path = tmp_path / "token"
    path.write_text(token, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(None, exporter={"token_file": str(path)})
    message = str(info.value)
    assert f"token_file {path} holds {named}" in message and "RFC 6750" in message
    assert token not in message  # the secret is not printed


def test_the_bearer_scheme_is_matched_in_any_case(guarded: ServiceCore) -> None:
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
        assert get(guarded, "/api/runs", {"Authorization": f"{scheme} {TOKEN}"})[0] == 200
    assert get(guarded, "/api/runs", {"Authorization": f"Basic {TOKEN}"})[0] == 401
    assert get(guarded, "/api/runs", {"Authorization": TOKEN})[0] == 401


def test_the_browser_keeps_a_key_derived_from_the_token(guarded: ServiceCore) -> None:
    assert get(guarded, "/api/key")[0] == 401
    status, body, head = get(guarded, "/api/key", {"Authorization": f"Bearer {TOKEN}"})
    key = body["key"]
    assert status == 200 and TOKEN not in key and len(key) == 64
    assert "Set-Cookie" not in head and head["Cache-Control"] == "no-store"
    assert get(guarded, "/api/runs", {"Authorization": f"Bearer {key}"})[0] == 200
    # the key does not buy a key: only the token does
    assert get(guarded, "/api/key", {"Authorization": f"Bearer {key}"})[0] == 401
    # the page's own files are served without it, and hold no data
    status, body, head = get(guarded, "/")
    assert status == 200 and b"app.js" in body and "Set-Cookie" not in head


def test_a_page_key_is_refused_after_a_restart_and_by_another_service(
        guarded: ServiceCore, tmp_path: Path, records: list[StepRecord]) -> None:
    """Issue 40, E12: the key is drawn anew at each start of the service, so a key collected
    while rlmon was down (by whoever bound its port) or handed out by another service on
    another port, holding the same token, opens nothing."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    first = get(guarded, "/api/key", auth)[1]["key"]
    again = get(guarded, "/api/key", auth)[1]["key"]
    assert first == again  # one key per start: every tab of the page shares it
    other = fed_service(tmp_path / "other", records, exporter={
        "token_file": str(tmp_path / "token")})
    try:
        assert other.port != guarded.port
        theirs = get(other, "/api/key", auth)[1]["key"]
        assert theirs != first
        assert get(other, "/api/runs", {"Authorization": f"Bearer {first}"})[0] == 401
        assert get(guarded, "/api/runs", {"Authorization": f"Bearer {theirs}"})[0] == 401
    finally:
        other.close(0.0)
    state = tmp_path / "state"
    guarded.close(0.0)
    restarted = fed_service(state, [], exporter={"token_file": str(tmp_path / "token")})
    try:
        assert get(restarted, "/api/runs", {"Authorization": f"Bearer {first}"})[0] == 401
        fresh = get(restarted, "/api/key", auth)[1]["key"]
        assert fresh != first
        assert get(restarted, "/api/runs", {"Authorization": f"Bearer {fresh}"})[0] == 200
    finally:
        restarted.close(0.0)


def test_the_host_header_is_checked(guarded: ServiceCore) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    port = guarded.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}",
                 "rlmon.example.com", f"rlmon.example.com.:{port}"):
        assert get(guarded, "/api/runs", {**auth, "Host": host})[0] == 200, host
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io",
                 "rlmon.example.com.attacker.example"):
        status, body, _ = get(guarded, "/", {"Host": host})
        assert status == 421 and b"exporter.allowed_hosts" in body, host
        assert get(guarded, "/api/runs", {**auth, "Host": host})[0] == 421, host
    # every path is checked (issue 40, E14): /metrics and /healthz too, by the same names
    for path in ("/metrics", "/healthz"):
        assert get(guarded, path, {"Host": "attacker.example"})[0] == 421, path
        assert get(guarded, path, {"Host": f"127.0.0.1:{port}"})[0] == 200, path
        assert get(guarded, path, {"Host": "rlmon.example.com:9464"})[0] == 200, path


def test_an_attempt_not_stored_is_a_404(tmp_path: Path, records: list[StepRecord]) -> None:
    core = fed_service(tmp_path, records)
    try:
        status, body, _ = get(core, "/api/curves?run=grpo-demo-0&role=actor&attempt=99")
        assert status == 404 and "attempt 99" in body["error"]
        assert get(core, "/api/curves?run=grpo-demo-0&role=actor&attempt=0")[0] == 200
    finally:
        core.close(0.0)
