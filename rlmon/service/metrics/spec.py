"""The vocabulary the catalog is written in: statistic forms, units, domains, alert and panel hints.

Everything that describes a metric is data here, so the exporter, the dashboards, the rule files
and the docs are all rendered from the same declarations instead of repeating names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

__all__ = [
    "AlertSpec",
    "BaselineParams",
    "BaselineSpec",
    "Comparison",
    "Direction",
    "Domain",
    "Form",
    "LivenessAlertSpec",
    "MetricSpec",
    "PanelHint",
    "Severity",
    "Unit",
]


class Form(StrEnum):
    """How a rank ships a metric, and so how partials merge (docs/contract.md)."""

    MEAN = "mean"  # {"sum", "count"}: Σsum / Σcount
    SUM = "sum"  # {"sum"}: Σsum
    MIN = "min"  # {"min"}
    MAX = "max"  # {"max"}
    SQSUM = "sqsum"  # {"sqsum"}: sqrt(Σsqsum), an L2 norm sharded across ranks
    VALUE = "value"  # {"value"}: already global; every copy must agree
    MOMENTS = "moments"  # {"count", "sum", "sqsum"}: population standard deviation
    TOP = "top"  # {"top", "k"}: the k items of highest score (id, payload), the worst samples
    BOTTOM = "bottom"  # {"bottom", "k"}: the k items of lowest score


class Unit(StrEnum):
    """Units, named the way Prometheus suffixes and Grafana unit ids want them."""

    NONE = "none"
    RATIO = "ratio"  # 0..1
    NATS = "nats"
    TOKENS = "tokens"
    SECONDS = "seconds"
    BYTES = "bytes"
    STEPS = "steps"
    REQUESTS = "requests"
    TOKENS_PER_SECOND = "tokens_per_second"
    WATTS = "watts"


class Domain(StrEnum):
    """The physical domain of a value; a value outside it is a bug, not a bad run."""

    ANY = "any"
    NONNEGATIVE = "nonnegative"
    FRACTION = "fraction"  # [0, 1]

    def contains(self, value: float) -> bool:
        """Whether a finite value lies in the domain (non-finite values are another alert's job)."""
        if self is Domain.NONNEGATIVE:
            return value >= 0.0
        if self is Domain.FRACTION:
            return 0.0 <= value <= 1.0
        return True


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"


class Comparison(StrEnum):
    """Threshold comparisons a catalog alert can use."""

    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="
    ABS_LT = "abs<"  # abs(value) < threshold
    OUTSIDE = "outside"  # value < low or value > high


@dataclass(frozen=True, slots=True)
class AlertSpec:
    """A default alert attached to one catalog metric; the default rule pack is built from these."""

    name: str
    severity: Severity
    comparison: Comparison
    threshold: float = 0.0
    high: float = 0.0  # upper bound for OUTSIDE; `threshold` is then the lower bound
    for_steps: int = 1
    summary: str = ""
    # good steps before a firing alert resolves (hysteresis; None: ``for_steps``)
    resolve_after: int | None = None
    # a warning becomes critical (one alert whose severity changes) when the value crosses
    # ``critical`` (compared as the rule compares ``threshold``) or after firing for
    # ``escalate_after`` steps; a warning with neither says why in the catalog's NO_CRITICAL
    critical: float | None = None
    escalate_after: int | None = None
    # a firing alert counts a step as good only when the value clears the threshold by this
    # much (the metric's units): a mean that sits on the threshold fires once, not again and
    # again
    resolve_margin: float | None = None


@dataclass(frozen=True, slots=True)
class LivenessAlertSpec:
    """A default alert judged by time, not by a step's values (rlmon.service.liveness): the
    ``condition`` names the run state or finding that makes it fire."""

    name: str
    severity: Severity
    condition: Literal["run_stalled", "stage_stuck", "run_died", "step_time_regression",
                       "run_failed", "run_preempted", "run_frozen"]
    summary: str
    what_to_check: str


@dataclass(frozen=True, slots=True)
class PanelHint:
    """Where and how a metric is drawn on the generated dashboards."""

    dashboard: str = "overview"  # overview | rollout
    row: str = ""
    title: str = ""
    order: int = 100


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One canonical metric, declared once.

    ``forms`` lists the statistic forms a rank may use: most metrics have exactly one; a gradient
    norm may arrive already global (``value``) or as shards of an L2 norm (``sqsum``). A ranked
    metric (``top``/``bottom``) carries sample items; its value is the best item's score.
    """

    name: str
    help: str
    forms: tuple[Form, ...]
    unit: Unit = Unit.NONE
    domain: Domain = Domain.ANY
    healthy: tuple[float, float] | None = None
    what_to_check: str = ""
    alerts: tuple[AlertSpec, ...] = ()
    panel: PanelHint = field(default_factory=PanelHint)
    per_rank_spread: bool = False  # keep per-rank values so a straggler ratio can be derived
    # The ranked metric (a top/bottom form) whose items explain this metric's alerts: its worst
    # samples ride along in the alert's notifications and `rlmon samples --alert` prints them.
    samples: str = ""

    @property
    def role(self) -> str:
        """The role prefix of the name (``actor/loss`` -> ``actor``)."""
        return self.name.split("/", 1)[0]

    @property
    def prometheus_name(self) -> str:
        """Prometheus family name: ``rlmon_`` + the name with separators turned into underscores."""
        return prometheus_name(self.name)


def prometheus_name(metric: str) -> str:
    """Map a metric name onto the Prometheus name grammar ``[a-zA-Z_:][a-zA-Z0-9_:]*`` (no colons)."""
    cleaned = "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else "_" for ch in metric)
    return "rlmon_" + cleaned.strip("_").lower()


# How an early-warning rule's detector (rlmon.service.alerting.baseline) is parametrised: part of
# the vocabulary so the catalog can declare its rules without depending on the detector.
Direction = Literal["up", "down"]


@dataclass(frozen=True, slots=True)
class BaselineParams:
    """How one early-warning rule judges its metric (every number has a default that works on
    the catalog's metrics; the catalog tunes a few per metric)."""

    direction: Direction
    window: int = 30  # trailing steps the baseline is fitted on
    warmup: int = 20  # values seen before the detector may accumulate evidence
    allowance: float = 0.5  # CUSUM k: drift per step tolerated, in robust SDs
    decision: float = 5.0  # CUSUM h: evidence that fires, in robust SDs
    floor: float = 0.0  # smallest scale, in the metric's units (raw values only)
    relative_floor: float = 0.05  # smallest scale as a fraction of the baseline
    log_offset: float | None = None  # judge log(value + offset): for multiplicative metrics
    follow_drift: bool = True  # False: the baseline is a level, for metrics with no healthy drift
    # consecutive steps that fire however far out each is: a shorter spike never does alone
    spike_steps: int = 2


@dataclass(frozen=True, slots=True)
class BaselineSpec:
    """A default early-warning rule, declared in the catalog next to the fixed thresholds."""

    name: str
    metric: str
    params: BaselineParams
    summary: str = ""
    for_steps: int = 1  # steps at or over `decision` before it fires
    resolve_after: int = 3  # steps back under `decision` before it resolves
    # the fixed rule that judges the level this slide heads to: while it fires on the same
    # stream, this warning hands over to it (resolves, naming it)
    level_rule: str = ""
    # critical once the value has fallen by more than this share of its own pre-onset level
    # (0.9: below a tenth of it), whether or not it reaches the level rule's fixed bound
    critical_drop: float | None = None
    # critical once the value has not moved at all for this many steps while firing: a mean
    # pinned at a hard limit (every completion at the length cap)
    critical_pinned: int | None = None
