"""Config: YAML + environment, secrets only from env or files and redacted everywhere."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlmon.service.config import ConfigError, Settings, load_config
from rlmon.service.redact import RedactingFilter

HOOK = "https://hooks.slack.com/services/T0AAAA/B0BBBB/abcdefSECRETxyz"
KEY = "0123456789abcdef0123456789abcdef"

CONFIG = """
dashboard_url: "https://grafana.example.com/d/rlmon-overview?var-run={run}&var-role={role}"
notifiers:
  slack: {username: rlmon-bot}
  pagerduty: {group: rlhf-cluster-a}
  webhook: {timeout_seconds: 5}
routing:
  critical: [pagerduty, slack]
  warning: [slack]
  runs:
    - {run: "debug-*", critical: [slack], warning: []}
silences:
  - {run: "sweep-*", alert: RewardStuck, comment: "reward is zero by design"}
  - {alert: GradNormHigh, until: "2000-01-01T00:00:00Z"}
outbox: {path: /var/lib/rlmon/outbox.sqlite, backoff_max_seconds: 60}
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "rlmon.yaml"
    path.write_text(CONFIG)
    return path


def test_yaml_and_env_with_env_winning(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLMON_SLACK_WEBHOOK_URL", HOOK)
    monkeypatch.setenv("RLMON_PAGERDUTY_ROUTING_KEY", KEY)
    monkeypatch.setenv("RLMON_OUTBOX__BACKOFF_MAX_SECONDS", "30")
    settings = load_config(config_file)
    assert settings.notifiers.slack.username == "rlmon-bot"
    assert settings.notifiers.pagerduty.group == "rlhf-cluster-a"
    assert settings.outbox.backoff_max_seconds == 30  # env over file
    assert str(settings.outbox.path) == "/var/lib/rlmon/outbox.sqlite"
    assert settings.notifiers.slack.ready
    assert settings.notifiers.pagerduty.ready
    assert settings.notifiers.slack.webhook_url is not None
    assert settings.notifiers.slack.webhook_url.get_secret_value() == HOOK


def test_secrets_are_redacted_in_repr_and_dumps(config_file: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLMON_SLACK_WEBHOOK_URL", HOOK)
    monkeypatch.setenv("RLMON_PAGERDUTY_ROUTING_KEY", KEY)
    settings = load_config(config_file)
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert HOOK not in text
        assert KEY not in text
        assert "SECRET" not in text


def test_secret_in_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"notifiers:\n  pagerduty:\n    routing_key: {KEY}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "notifiers.pagerduty.routing_key" in message
    assert "RLMON_PAGERDUTY_ROUTING_KEY" in message
    assert KEY not in message


def test_secret_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLMON_PAGERDUTY_ROUTING_KEY", raising=False)
    key_file = tmp_path / "pd-key"
    key_file.write_text(KEY + "\n")
    path = tmp_path / "c.yaml"
    path.write_text(f"notifiers:\n  pagerduty:\n    routing_key_file: {key_file}\n")
    settings = load_config(path)
    assert settings.notifiers.pagerduty.routing_key is not None
    assert settings.notifiers.pagerduty.routing_key.get_secret_value() == KEY


def test_bad_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("routing:\n  critical: [pager]\nexporter: {port: 70000}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "routing.critical.0" in str(info.value)
    assert "exporter.port" in str(info.value)


def test_routing_overrides_and_silences(config_file: Path) -> None:
    settings = load_config(config_file)
    assert settings.routing.destinations("grpo-7b", "critical") == ["pagerduty", "slack"]
    assert settings.routing.destinations("grpo-7b", "warning") == ["slack"]
    assert settings.routing.destinations("debug-3", "critical") == ["slack"]
    assert settings.routing.destinations("debug-3", "warning") == []
    assert settings.silenced("sweep-1", "rollout", "RewardStuck")
    assert not settings.silenced("grpo-7b", "rollout", "RewardStuck")
    assert not settings.silenced("grpo-7b", "actor", "GradNormHigh")  # that silence expired
    link = settings.dashboard_link("grpo 7b", "actor")
    assert link == "https://grafana.example.com/d/rlmon-overview?var-run=grpo%207b&var-role=actor"


def test_log_filter_redacts(monkeypatch: pytest.MonkeyPatch,
                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("RLMON_SLACK_WEBHOOK_URL", HOOK)
    settings = Settings()
    logger = logging.getLogger("rlmon.test.redact")
    logger.addFilter(RedactingFilter(settings.redactor()))
    with caplog.at_level(logging.INFO, logger="rlmon.test.redact"):
        logger.info("posting to %s failed", HOOK)
        logger.info("error: <urlopen error for /services/T0AAAA/B0BBBB/abcdefSECRETxyz>")
    text = caplog.text
    assert "SECRET" not in text
    assert text.count("***") == 2


def test_webhook_url_is_read_like_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "https://hooks.example.com/rlmon?api_key=wh0123456789sEcReT"
    inline = tmp_path / "inline.yaml"
    inline.write_text(f"notifiers:\n  webhook: {{url: '{url}'}}\n")
    with pytest.raises(ConfigError, match="RLMON_WEBHOOK_URL") as err:
        load_config(inline)
    assert "sEcReT" not in str(err.value)
    mounted = tmp_path / "webhook-url"
    mounted.write_text(url + "\n")
    from_file = tmp_path / "file.yaml"
    from_file.write_text(f"notifiers:\n  webhook: {{url_file: {mounted}}}\n")
    settings = load_config(from_file)
    assert settings.notifiers.webhook.ready
    assert "sEcReT" not in repr(settings) and "sEcReT" not in settings.model_dump_json()
    assert settings.redactor()(f"POST {url} failed; query {url.split('?')[1]}") == (
        "POST *** failed; query ***")
    monkeypatch.setenv("RLMON_WEBHOOK_URL", "ftp://nope")
    with pytest.raises(ConfigError, match="must be an http"):
        load_config(None)
