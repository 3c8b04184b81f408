"""One vocabulary of settings (rlmon.service.config): the liveness defaults defined once, in
LivenessParams; the short environment names as aliases of the settings they name; the Reporter's
heartbeat period read by the service's name."""

from __future__ import annotations

import dataclasses

import pytest

from rlmon.service.config import (
    ENV_ALIASES,
    ConfigError,
    LivenessConfig,
    ReporterSettings,
    load_config,
)
from rlmon.service.liveness.thresholds import BOUNDS, LivenessParams


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*ENV_ALIASES, "RLMON_EXPORTER__PORT", "RLMON_EXPORTER__HOST",
                 "RLMON_LIVENESS__HEARTBEAT_SECONDS"]:
        monkeypatch.delenv(name, raising=False)


def test_the_config_s_liveness_defaults_are_liveness_params_defaults() -> None:
    assert LivenessConfig().params() == LivenessParams()
    defaults = {f.name: f.default for f in dataclasses.fields(LivenessParams)}
    for name, field in LivenessConfig.model_fields.items():
        made = field.get_default(call_default_factory=True)
        assert made == defaults[name] or tuple(made) == defaults[name], name


@pytest.mark.parametrize(("name", "bad", "edge"), [
    ("slow_factor", 1.0, 1.01), ("heartbeat_seconds", 0.0, 0.01), ("slow_steps", 0, 1),
    ("gpus_per_rank", -1.0, 0.0), ("dead_after_seconds", float("nan"), 30.0)])
def test_a_liveness_setting_s_bound_is_liveness_params_and_its_error_names_field_and_value(
        name: str, bad: float, edge: float) -> None:
    with pytest.raises(ValueError, match=rf"liveness\.{name} must be"):
        LivenessParams(**{name: bad})
    with pytest.raises(ConfigError, match=rf"liveness\.{name}: .*, got {bad!r}"):
        load_config(liveness={name: bad})
    assert getattr(load_config(liveness={name: edge}).liveness.params(), name) == edge


def test_the_config_s_liveness_bounds_are_liveness_params_bounds() -> None:
    for name, field in LivenessConfig.model_fields.items():
        low, allowed = BOUNDS.get(name, (None, False))
        stated = {(k, getattr(m, k)) for m in field.metadata for k in ("gt", "ge")
                  if hasattr(m, k)}
        assert stated == (set() if low is None else {("ge" if allowed else "gt", low)}), name
    with pytest.raises(ConfigError, match=r"liveness: .*cold_span_words must be a list of "
                                          r"words, got \['!!'\]"):
        load_config(liveness={"cold_span_words": ["!!"]})


def test_the_short_names_are_aliases_of_the_exporter_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert (load_config().exporter.port, load_config().exporter.host) == (9464, "127.0.0.1")
    monkeypatch.setenv("RLMON_EXPORTER__PORT", "9000")
    monkeypatch.setenv("RLMON_PORT", "0")
    monkeypatch.setenv("RLMON_HOST", "0.0.0.0")
    exporter = load_config().exporter
    assert (exporter.port, exporter.host) == (0, "0.0.0.0")  # the alias wins, as it always did
    assert "port" in exporter.model_fields_set  # asked for: a taken port is an error
    monkeypatch.setenv("RLMON_PORT", "")  # empty: unset
    assert load_config().exporter.port == 9000


def test_a_bad_alias_is_an_error_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLMON_PORT", "eighty")
    with pytest.raises(ConfigError, match=r"exporter\.port"):
        load_config()


def test_the_reporter_reads_its_heartbeat_by_the_service_s_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert ReporterSettings().heartbeat_seconds is None  # unset: the service tells its own
    monkeypatch.setenv("RLMON_LIVENESS__HEARTBEAT_SECONDS", "0.5")
    monkeypatch.setenv("RLMON_LIVENESS__STALL_FACTOR", "not read by a Reporter")
    assert ReporterSettings().heartbeat_seconds == 0.5
    monkeypatch.setenv("RLMON_LIVENESS__HEARTBEAT_SECONDS", "0")  # no heartbeat
    assert ReporterSettings().heartbeat_seconds == 0.0
    monkeypatch.setenv("RLMON_LIVENESS__HEARTBEAT_SECONDS", "often")
    with pytest.raises(ValueError, match="heartbeat_seconds"):
        ReporterSettings()
