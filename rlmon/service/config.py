"""The service configuration: one pydantic-settings model, from a YAML file and the environment.

Precedence: environment (``RLMON_`` prefix, ``__`` between nested keys) over the YAML file over
defaults. Secrets (the Slack webhook URL, the PagerDuty routing key, the generic webhook's URL and
token) are read
only from the environment or from a file named in the config (``*_file``, e.g. a Kubernetes secret
mount); a secret written into the YAML file is an error, so it never lands in a ConfigMap or in git.
Importing this module never imports Ray.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from rlmon.service.liveness.thresholds import BOUNDS as LIVENESS_BOUNDS
from rlmon.service.liveness.thresholds import LivenessParams
from rlmon.service.redact import Redactor

__all__ = [
    "DESTINATIONS",
    "ConfigError",
    "ExporterConfig",
    "ForwardConfig",
    "GoodputConfig",
    "GroupingConfig",
    "LivenessConfig",
    "NotifiersConfig",
    "OutboxConfig",
    "PagerDutyConfig",
    "ReporterSettings",
    "RetentionConfig",
    "RouteTable",
    "RoutingConfig",
    "Settings",
    "Silence",
    "SlackConfig",
    "StopConfig",
    "StopRuns",
    "WebhookConfig",
    "load_config",
]

Destination = Literal["slack", "pagerduty", "webhook", "console"]
PdSeverity = Literal["critical", "error", "warning", "info"]
DESTINATIONS: tuple[str, ...] = ("slack", "pagerduty", "webhook", "console")

# Short, documented environment names for the secrets (the nested RLMON_NOTIFIERS__SLACK__... form
# works too).
SECRET_ENV = {
    ("slack", "webhook_url"): "RLMON_SLACK_WEBHOOK_URL",
    ("slack", "bot_token"): "RLMON_SLACK_BOT_TOKEN",
    ("pagerduty", "routing_key"): "RLMON_PAGERDUTY_ROUTING_KEY",
    ("webhook", "url"): "RLMON_WEBHOOK_URL",
    ("webhook", "token"): "RLMON_WEBHOOK_TOKEN",
}


# Short environment names kept as aliases of settings (the first names rlmon read, and what
# docs/configuration.md lists); each wins over the setting's RLMON_<SECTION>__<KEY> form.
ENV_ALIASES = {
    "RLMON_PORT": ("exporter", "port"),
    "RLMON_HOST": ("exporter", "host"),
}


class ConfigError(ValueError):
    """The configuration is invalid; the message names the field (and never a secret's value)."""


def _default_severity_map() -> dict[str, PdSeverity]:
    return {"critical": "critical", "warning": "warning"}


def _dests(*names: Destination) -> list[Destination]:
    return list(names)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _secret_from(field: str, section: str, explicit: Any, file: Path | None) -> SecretStr | None:
    """A secret from (in order) the nested env/explicit value, the short env name, or a file."""
    if explicit:
        return explicit if isinstance(explicit, SecretStr) else SecretStr(str(explicit))
    value = os.environ.get(SECRET_ENV[(section, field)], "")
    if not value and file is not None:
        try:
            value = Path(file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"{field}_file: cannot read {file}: {exc.strerror}") from None
    return SecretStr(value) if value else None


def _check_url(secret: SecretStr | None, section: str, field: str) -> None:
    # caught here, not by a day of retries; the value itself is never quoted
    if secret is not None and not secret.get_secret_value().startswith(("https://", "http://")):
        env = SECRET_ENV[(section, field)]
        raise ValueError(f"notifiers.{section}.{field} must be an http(s) URL (from {env} or "
                         f"{field}_file; the value is not shown)")


class SlackConfig(_Section):
    """Slack incoming webhook, or a bot token and a channel (then a run's follow-ups are
    replies in its first message's thread). The webhook URL and the token are credentials: env
    or file only."""

    enabled: bool = True
    webhook_url: SecretStr | None = None
    webhook_url_file: Path | None = None
    bot_token: SecretStr | None = None  # xoxb-...: chat.postMessage, threads
    bot_token_file: Path | None = None
    channel: str | None = None  # the bot's channel (an id, or #name)
    api_url: str = Field(default="https://slack.com/api/", pattern=r"^https?://")
    username: str = "rlmon"
    min_interval_seconds: float = Field(default=1.0, ge=0.0)  # Slack: ~1 message/s per webhook
    timeout_seconds: float = Field(default=10.0, gt=0.0)

    @model_validator(mode="after")
    def _resolve(self) -> SlackConfig:
        secret = _secret_from("webhook_url", "slack", self.webhook_url, self.webhook_url_file)
        _check_url(secret, "slack", "webhook_url")
        object.__setattr__(self, "webhook_url", secret)
        token = _secret_from("bot_token", "slack", self.bot_token, self.bot_token_file)
        object.__setattr__(self, "bot_token", token)
        if token is not None and not self.channel:
            raise ValueError("notifiers.slack.channel: a bot token needs the channel to post in")
        return self

    @property
    def bot(self) -> bool:
        """Whether Slack is reached through the bot token (chat.postMessage, threads)."""
        return self.bot_token is not None and bool(self.channel)

    @property
    def ready(self) -> bool:
        return self.enabled and (self.webhook_url is not None or self.bot)


class PagerDutyConfig(_Section):
    """PagerDuty Events API v2. The routing (integration) key comes from env or a file only."""

    enabled: bool = True
    routing_key: SecretStr | None = None
    routing_key_file: Path | None = None
    base_url: str = Field(default="https://events.pagerduty.com", pattern=r"^https://")
    group: str = "rlmon"
    severity_map: dict[str, PdSeverity] = Field(default_factory=_default_severity_map)
    min_interval_seconds: float = Field(default=0.5, ge=0.0)  # 120 events/min per routing key
    timeout_seconds: float = Field(default=10.0, gt=0.0)

    @model_validator(mode="after")
    def _resolve(self) -> PagerDutyConfig:
        secret = _secret_from("routing_key", "pagerduty", self.routing_key, self.routing_key_file)
        object.__setattr__(self, "routing_key", secret)
        return self

    @property
    def ready(self) -> bool:
        return self.enabled and self.routing_key is not None


class WebhookConfig(_Section):
    """A generic JSON webhook. Its URL may carry a credential (``?api_key=...``), so it is a
    secret like the optional bearer token: both come from env or a file only."""

    enabled: bool = True
    url: SecretStr | None = None
    url_file: Path | None = None
    token: SecretStr | None = None
    token_file: Path | None = None
    min_interval_seconds: float = Field(default=0.0, ge=0.0)
    timeout_seconds: float = Field(default=10.0, gt=0.0)

    @model_validator(mode="after")
    def _resolve(self) -> WebhookConfig:
        url = _secret_from("url", "webhook", self.url, self.url_file)
        _check_url(url, "webhook", "url")
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "token", _secret_from("token", "webhook", self.token,
                                                       self.token_file))
        return self

    @property
    def ready(self) -> bool:
        return self.enabled and self.url is not None


class ConsoleConfig(_Section):
    enabled: bool = True
    stream: Literal["stderr", "stdout"] = "stderr"


class GroupingConfig(_Section):
    """Slack and webhook notifications grouped per run, as Alertmanager groups them: a run's
    first alerts wait ``group_wait_seconds`` for the rest (a run's end on every role, three
    alerts at once: one message), later ones (resolves, new warnings) go as updates of the
    group at most every ``group_interval_seconds``; a critical one (an escalation, a new
    critical alert) goes after the group wait alone. PagerDuty is never grouped (one incident
    per alert, by its dedup key), nor is the console. On by default, with a wait of seconds (a
    run's roles end within a second of each other; a page must not wait long) and an interval
    of a minute; disabled, each step's alerts are one message, at once."""

    enabled: bool = True
    group_wait_seconds: float = Field(default=3.0, ge=0.0)
    group_interval_seconds: float = Field(default=60.0, ge=0.0)
    # a group whose last message is older than this starts afresh (waits group_wait again,
    # opens a new Slack thread)
    group_ttl_seconds: float = Field(default=86_400.0, gt=0.0)


class NotifiersConfig(_Section):
    grouping: GroupingConfig = Field(default_factory=GroupingConfig)
    slack: SlackConfig = Field(default_factory=SlackConfig)
    pagerduty: PagerDutyConfig = Field(default_factory=PagerDutyConfig)
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)


class RouteTable(_Section):
    """Destinations per severity."""

    critical: list[Destination] = Field(default_factory=lambda: _dests("pagerduty", "slack"))
    warning: list[Destination] = Field(default_factory=lambda: _dests("slack"))

    def for_severity(self, severity: str) -> list[str]:
        return list(self.critical if severity == "critical" else self.warning)


class RunRoute(_Section):
    """A per-run override: runs whose id matches the glob ``run`` use these routes."""

    run: str
    critical: list[Destination] | None = None
    warning: list[Destination] | None = None


class RoutingConfig(RouteTable):
    runs: list[RunRoute] = Field(default_factory=list)

    def destinations(self, run: str, severity: str) -> list[str]:
        """The destinations of an alert: the first matching run override, else the defaults."""
        for override in self.runs:
            if fnmatch.fnmatchcase(run, override.run):
                chosen = override.critical if severity == "critical" else override.warning
                if chosen is not None:
                    return list(chosen)
        return self.for_severity(severity)


class Silence(_Section):
    """Mute the alerts matching ``run`` and ``alert`` (globs) until ``until`` (forever if unset)."""

    run: str = "*"
    alert: str = "*"
    role: str = "*"
    until: datetime | None = None
    comment: str = ""

    def matches(self, run: str, role: str, alert: str, now: datetime | None = None) -> bool:
        if self.until is not None:
            until = self.until if self.until.tzinfo else self.until.replace(tzinfo=UTC)
            if (now or datetime.now(UTC)) >= until:
                return False
        return (
            fnmatch.fnmatchcase(run, self.run)
            and fnmatch.fnmatchcase(role, self.role)
            and fnmatch.fnmatchcase(alert, self.alert)
        )


class OutboxConfig(_Section):
    # None: <state_dir>/outbox.sqlite; a relative path lies under the state directory
    path: Path | None = None
    backoff_initial_seconds: float = Field(default=1.0, gt=0.0)
    backoff_max_seconds: float = Field(default=300.0, gt=0.0)
    backoff_jitter: float = Field(default=0.2, ge=0.0, le=1.0)  # +-20 % of the delay
    give_up_after_seconds: float = Field(default=86_400.0, gt=0.0)  # then moved to `failed`
    sent_memory: int = Field(default=10_000, ge=0)  # delivered keys kept for dedup


class ExporterConfig(_Section):
    # loopback by default: a training node's /metrics is not for the whole network unless asked
    host: str = "127.0.0.1"
    port: int = Field(default=9464, ge=0, le=65_535)  # 0: any free port
    max_series: int = Field(default=10_000, ge=1)
    run_ttl_seconds: float = Field(default=900.0, gt=0.0)  # no step for this long: dead
    finished_run_ttl_seconds: float = Field(default=120.0, ge=0.0)
    # the run page and its /api/ (not /metrics, /healthz) answer only requests carrying this
    # token (docs/page.md); from RLMON_EXPORTER__TOKEN or a file, never the YAML file itself
    token: SecretStr | None = None
    token_file: Path | None = None
    # the names the page may be reached by besides an IP address and localhost (the Host header
    # is checked: DNS rebinding); public_url's host is added by the service
    allowed_hosts: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _resolve_token(self) -> ExporterConfig:
        # fail closed: a token asked for but empty would leave the page open (issue 32)
        value, source = None, "RLMON_EXPORTER__TOKEN"
        if self.token is not None:
            value = self.token.get_secret_value().strip()
        elif self.token_file is not None:
            source = f"token_file {self.token_file}"
            try:
                value = Path(self.token_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"token_file: cannot read {self.token_file}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
        if value is not None:
            _check_page_token(value, source)
        object.__setattr__(self, "token", SecretStr(value) if value else None)
        return self


# a bearer token's characters (RFC 6750 b64token): it travels in an Authorization header
_PAGE_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def _check_page_token(value: str, source: str) -> None:
    if not value:
        raise ValueError(f"token: {source} is empty: the run page would be open to anyone; "
                         "write a token in it (e.g. openssl rand -hex 32) or unset it")
    if not _PAGE_TOKEN.fullmatch(value):
        bad = next((c for c in value if not re.fullmatch(r"[A-Za-z0-9._~+/=-]", c)), "=")
        what = "whitespace" if bad.isspace() else (
            f"U+{ord(bad):04X}" if not bad.isascii() or not bad.isprintable() else repr(bad))
        raise ValueError(f"token: {source} holds {what}: a page token may hold only letters, "
                         "digits and -._~+/ (then =), as a bearer token (RFC 6750)")


class RetentionConfig(_Section):
    """How much the service keeps: history on disk, per-run state in memory."""

    # the history store keeps the newest steps of each (run, role) (a step is ~1-5 kB on disk)
    history_steps: int = Field(default=100_000, ge=1)
    # ... and drops a run whose last step is older than this, whole
    history_days: float = Field(default=30.0, gt=0.0)
    # the ranks' step timelines (spans, for `rlmon trace`) of the newest steps of each (run,
    # role); a step of 64 ranks with 20 spans each is ~100 kB
    timeline_steps: int = Field(default=2_000, ge=0)
    # the worst samples (`rlmon samples`) of the newest steps of each (run, role), and the
    # payload text kept per sample metric and step (64 items of 2 kB would be 128 kB)
    sample_steps: int = Field(default=2_000, ge=0)
    sample_payload_bytes: int = Field(default=32_768, ge=0)
    # in memory: a (run, role) without a step for this long leaves (its alert state stays in
    # the history store and comes back with its next step)
    stream_ttl_seconds: float = Field(default=3_600.0, gt=0.0)
    finished_ttl_seconds: float = Field(default=600.0, ge=0.0)  # after the run said it finished
    max_streams: int = Field(default=10_000, ge=1)  # (run, role) in memory; least recent leave
    every_seconds: float = Field(default=60.0, gt=0.0)  # how often retention runs


class StopRuns(_Section):
    """Runs matching the glob ``run`` may be stopped by the rules named in ``rules`` (globs;
    ``"*"``: every rule that carries the stop action)."""

    run: str = Field(min_length=1)
    rules: list[str] = Field(min_length=1)


class StopConfig(_Section):
    """Which runs rules with the stop action may stop (none unless listed here): the rule must
    carry ``actions: [stop]`` and a glob here must name the run and the rule."""

    runs: list[StopRuns] = Field(default_factory=list)

    def allowed_by(self, run: str, rule: str) -> str | None:
        """The first run glob that lets ``rule`` stop ``run``, or None."""
        for entry in self.runs:
            if fnmatch.fnmatchcase(run, entry.run) and any(
                    fnmatch.fnmatchcase(rule, name) for name in entry.rules):
                return entry.run
        return None


class WandbForward(_Section):
    """Forwarding to Weights & Biases (the ``wandb`` package, a dependency)."""

    enabled: bool = False
    project: str = Field(default="rlmon", min_length=1)
    entity: str | None = None
    mode: Literal["online", "offline"] = "online"  # offline: run files only (`wandb sync` later)
    dir: Path | None = None  # where W&B keeps its run files (None: its own default)


class MlflowForward(_Section):
    """Forwarding to MLflow (the ``forward`` extra: mlflow-skinny)."""

    enabled: bool = False
    tracking_uri: str | None = None  # None: MLflow's own default (MLFLOW_TRACKING_URI)
    experiment: str = Field(default="rlmon", min_length=1)


class TensorBoardForward(_Section):
    """Forwarding to TensorBoard event files (the ``tensorboard`` package, a dependency)."""

    enabled: bool = False
    log_dir: Path = Path("rlmon-tensorboard")  # one subdirectory per run


class ForwardConfig(_Section):
    """Finalized steps, alerts and run ends forwarded to trackers (docs/configuration.md)."""

    # "catalog": rlmon's names (actor/kl); "framework": the run's framework's own key for a
    # catalog metric where the key map has one (OpenRLHF's policy_kl ...), else the catalog's
    names: Literal["catalog", "framework"] = "catalog"
    wandb: WandbForward = Field(default_factory=WandbForward)
    mlflow: MlflowForward = Field(default_factory=MlflowForward)
    tensorboard: TensorBoardForward = Field(default_factory=TensorBoardForward)
    # per tracker: steps waiting to be sent; past it the oldest wait no longer (counted)
    queue_steps: int = Field(default=100_000, ge=1)
    queue_events: int = Field(default=10_000, ge=1)  # alerts, settings and ends waiting
    batch_steps: int = Field(default=500, ge=1)  # steps per call to the tracker
    flush_seconds: float = Field(default=5.0, gt=0.0)  # a partial batch leaves after this
    retry_initial_seconds: float = Field(default=1.0, gt=0.0)  # a tracker down: backoff
    retry_max_seconds: float = Field(default=300.0, gt=0.0)
    max_runs: int = Field(default=64, ge=1)  # tracker runs open at once; the oldest is closed

    @property
    def enabled(self) -> bool:
        return self.wandb.enabled or self.mlflow.enabled or self.tensorboard.enabled


class OtlpConfig(_Section):
    """OpenTelemetry export of the step timelines' spans (OTLP over HTTP, protobuf); off by
    default, needs the ``otlp`` extra (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)."""

    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318/v1/traces"  # a collector's OTLP/HTTP traces path
    service_name: str = "rlmon"  # the resource's service.name
    timeout_seconds: float = Field(default=10.0, gt=0.0)


class GoodputConfig(_Section):
    """Goodput accounting and alert cost (docs/goodput.md)."""

    # span name -> activity, added to (or overriding) the default map: generate, train,
    # inference, weight_sync, checkpoint, evaluation, logging, step (a container), other
    spans: dict[str, str] = Field(default_factory=dict)
    # where time in a span the map does not know goes
    unmapped_bucket: Literal["productive", "overhead"] = "productive"
    # GPUs per rank by role ("*": every other role); without an entry, 1 (the hardware probe
    # says whether a rank has a GPU; it cannot count a tensor-parallel engine's)
    gpus_per_rank: dict[str, float] = Field(default_factory=dict)
    price_per_gpu_hour: float | None = Field(default=None, ge=0.0, le=1e6)  # money in alert costs
    currency: str = "USD"
    # MFU: the model's FLOPs per token (e.g. 6 x parameters for a training step) and one GPU's
    # peak FLOP/s; the tokens are the step's rollout/tokens
    model_flops_per_token: float | None = Field(default=None, gt=0.0)
    peak_flops_per_gpu: float | None = Field(default=None, gt=0.0)
    # a step is accounted once the run is this many steps past it (every role has reported it
    # and its neighbours by then), or when the run finishes
    hold_steps: int = Field(default=2, ge=0, le=64)

    @model_validator(mode="after")
    def _check(self) -> GoodputConfig:
        from rlmon.service.goodput.buckets import Activity

        known = {a.value for a in Activity}
        for name, activity in self.spans.items():
            if activity not in known:
                raise ValueError(f"spans.{name}: unknown activity {activity!r} (one of "
                                 f"{', '.join(sorted(known))})")
        for role, gpus in self.gpus_per_rank.items():
            if not gpus >= 0:
                raise ValueError(f"gpus_per_rank.{role}: must be >= 0, got {gpus!r}")
        return self


_LIVENESS = LivenessParams()  # the liveness defaults: defined once, in LivenessParams


def _liveness(name: str) -> Any:
    """A liveness setting as LivenessParams defines it: its default and its bound."""
    low, allowed = LIVENESS_BOUNDS[name]
    default = getattr(_LIVENESS, name)
    return Field(default=default, ge=low) if allowed else Field(default=default, gt=low)


class LivenessConfig(_Section):
    """When a run that stops making progress pages (docs/liveness.md for the defaults' why)."""

    # The settable part of LivenessParams, the one definition of the liveness settings: its
    # defaults and bounds are these (a bad value's error names the field in the config's words),
    # its comments say what each means, and building it checks the rest (the span words).

    heartbeat_seconds: float = _liveness("heartbeat_seconds")
    stall_factor: float = _liveness("stall_factor")
    stall_floor_seconds: float = _liveness("stall_floor_seconds")
    first_step_seconds: float = _liveness("first_step_seconds")
    cold_span_seconds: float = _liveness("cold_span_seconds")
    sync_span_seconds: float = _liveness("sync_span_seconds")
    save_span_seconds: float = _liveness("save_span_seconds")
    final_seconds: float = _liveness("final_seconds")
    cold_span_words: list[str] = Field(default_factory=lambda: list(_LIVENESS.cold_span_words))
    sync_span_words: list[str] = Field(default_factory=lambda: list(_LIVENESS.sync_span_words))
    save_span_words: list[str] = Field(default_factory=lambda: list(_LIVENESS.save_span_words))
    dead_after_seconds: float = _liveness("dead_after_seconds")
    slow_factor: float = _liveness("slow_factor")
    slow_steps: int = _liveness("slow_steps")
    stuck_factor: float = _liveness("stuck_factor")
    stuck_floor_seconds: float = _liveness("stuck_floor_seconds")
    evaluate_seconds: float = _liveness("evaluate_seconds")
    gpus_per_rank: float = _liveness("gpus_per_rank")

    @model_validator(mode="after")
    def _bounded(self) -> LivenessConfig:
        self.params()  # LivenessParams' ValueError names a field and its value
        return self

    def params(self) -> LivenessParams:
        return LivenessParams(**self.model_dump())


class PrometheusRulesConfig(_Section):
    step_period_seconds: float = Field(default=60.0, gt=0.0)  # a trainer step, roughly
    evaluation_interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$")


class Settings(BaseSettings):
    """Everything ``rlmon serve`` and ``rlmon replay --alerts-to`` need to route alerts."""

    model_config = SettingsConfigDict(
        env_prefix="RLMON_", env_nested_delimiter="__", extra="forbid", frozen=False
    )

    dashboard_url: str | None = Field(
        default=None, description="link template; {run} and {role} are filled in"
    )
    public_url: str | None = Field(
        default=None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        description="the address people open the service's run page at (https://rlmon.example.com); "
        "every notification links to the alert's page there")
    notifiers: NotifiersConfig = Field(default_factory=NotifiersConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    silences: list[Silence] = Field(default_factory=list)
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)
    exporter: ExporterConfig = Field(default_factory=ExporterConfig)
    prometheus_rules: PrometheusRulesConfig = Field(default_factory=PrometheusRulesConfig)
    liveness: LivenessConfig = Field(default_factory=LivenessConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    otlp: OtlpConfig = Field(default_factory=OtlpConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    goodput: GoodputConfig = Field(default_factory=GoodputConfig)
    forward: ForwardConfig = Field(default_factory=ForwardConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # environment first: it overrides the YAML file, which arrives as init values
        return _AliasSource(settings_cls), env_settings, init_settings

    def secret_values(self) -> list[str]:
        n = self.notifiers
        found = [n.slack.webhook_url, n.slack.bot_token, n.pagerduty.routing_key, n.webhook.url,
                 n.webhook.token, self.exporter.token]
        return [s.get_secret_value() for s in found if s is not None]

    def redactor(self) -> Redactor:
        return Redactor(self.secret_values())

    def dashboard_link(self, run: str, role: str) -> str | None:
        if not self.dashboard_url:
            return None
        from urllib.parse import quote

        return self.dashboard_url.replace("{run}", quote(run, safe="")).replace(
            "{role}", quote(role, safe="")
        )

    def run_page(self) -> str | None:
        """The run page's address without a trailing slash (None: not configured)."""
        return self.public_url.rstrip("/") if self.public_url else None

    def silenced(self, run: str, role: str, alert: str) -> bool:
        return any(s.matches(run, role, alert) for s in self.silences)


class _AliasSource(PydanticBaseSettingsSource):
    """The settings named by :data:`ENV_ALIASES` (an empty value is unset)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ gives the whole mapping

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for env, (section, key) in ENV_ALIASES.items():
            value = os.environ.get(env)
            if value:
                found.setdefault(section, {})[key] = value
        return found


class ReporterSettings(BaseSettings):
    """What a Reporter reads of the settings, from its own process's environment (it loads no
    config file): its heartbeat period, ``liveness.heartbeat_seconds`` by the service's name
    ``RLMON_LIVENESS__HEARTBEAT_SECONDS`` (0: no heartbeat). Unset: the service's own period,
    told when the Reporter connects (a Ray actor's worker has Ray's environment, not its
    driver's), and ``liveness.heartbeat_seconds``'s default until then."""

    model_config = SettingsConfigDict(env_prefix="RLMON_LIVENESS__", extra="ignore")

    heartbeat_seconds: float | None = Field(default=None, ge=0.0)


_SECRET_KEYS = set(SECRET_ENV)


def _reject_file_secrets(data: dict[str, Any], source: str) -> None:
    exporter = data.get("exporter")
    if isinstance(exporter, dict) and exporter.get("token"):
        raise ConfigError(f"{source}: exporter.token: secrets are not read from the config file; "
                          "set RLMON_EXPORTER__TOKEN or exporter.token_file")
    notifiers = data.get("notifiers") or {}
    if not isinstance(notifiers, dict):
        return
    for section, key in sorted(_SECRET_KEYS):
        block = notifiers.get(section)
        if isinstance(block, dict) and block.get(key):
            env = SECRET_ENV[(section, key)]
            raise ConfigError(
                f"{source}: notifiers.{section}.{key}: secrets are not read from the config file; "
                f"set {env} or notifiers.{section}.{key}_file"
            )


# errors of a number or a flag out of its bounds or unreadable: the message quotes the value (a
# secret is a string: its errors never do)
_QUOTED = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal",
                     "float_parsing", "int_parsing", "int_from_float", "bool_parsing"})


def load_config(path: str | Path | None = None, only: Collection[str] | None = None,
                **overrides: Any) -> Settings:
    """The settings from ``path`` (YAML; None: defaults) and the environment.

    ``only`` names the top-level sections a command uses: the file's other sections are not
    validated (``rlmon rules export`` on a laptop does not need the notifiers' secret files that
    the deployment's config points at). Raises :class:`ConfigError` naming the field; secret values
    never appear in the message.
    """
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{source}: the top level must be a mapping")
        data = loaded
        if only is not None:  # a misspelt section still fails
            data = {key: value for key, value in data.items()
                    if key in only or key not in Settings.model_fields}
        _reject_file_secrets(data, source)
    data.update(overrides)
    try:
        return Settings(**data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            + (f", got {e['input']!r}" if e["type"] in _QUOTED else "") for e in exc.errors()
        )
        raise ConfigError(f"{source}: {problems}") from None
