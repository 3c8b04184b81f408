"""The default pack as docs tables (docs/alerting.md, generated): per rule its condition in words
and its Prometheus expression (or why rlmon alone judges it), both from its condition's kind
(:mod:`rlmon.service.alerting.conditions`); and the notification policy: its severity, how many
good steps it keeps firing for, and its critical level, escalation duration or the catalog's
reason for having neither."""

from __future__ import annotations

from rlmon.service.alerting.conditions.kind import RlmonOnly
from rlmon.service.alerting.conditions.registry import kind_of
from rlmon.service.alerting.rules import Condition, Rule, default_rules
from rlmon.service.artifact import Artifact
from rlmon.service.metrics import catalog

__all__ = ["artifacts", "conditions_markdown", "policy_markdown"]


def _critical(rule: Rule) -> str:
    if rule.severity.value == "critical":
        return "critical from the start"
    parts = []
    if rule.critical is not None:
        side = ("<=" if rule.direction == "down" else ">=") \
            if rule.condition is Condition.BASELINE else rule.op
        parts.append(f"at `{rule.metric}` {side} {rule.critical:g}")
    if rule.critical_drop is not None:
        parts.append(f"at `{rule.metric}` {rule.critical_drop:.0%} below its own pre-onset "
                     "level")
    if rule.critical_pinned is not None:
        parts.append(f"at `{rule.metric}` unchanged for {rule.critical_pinned} steps (pinned at "
                     "its cap)")
    if rule.escalate_after is not None:
        parts.append(f"after {rule.escalate_after} steps firing")
    return "; ".join(parts) or f"none: {catalog.NO_CRITICAL.get(rule.name, '?')}"


def _resolves(rule: Rule) -> str:
    if rule.condition.value in {s.condition for s in catalog.LIVENESS_ALERTS}:
        return "when the liveness timer says so"
    text = f"{rule.resolve_steps}"
    if rule.level_rule:
        text += f", back at the pre-onset level, or handed to `{rule.level_rule}`"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _prometheus(rule: Rule) -> str:
    found = kind_of(rule).promql(rule)
    if isinstance(found, RlmonOnly):
        return f"rlmon only: {found.value}"
    return f"`{_cell(found.expr)}`"


def conditions_markdown(rules: list[Rule] | None = None) -> str:
    """One row per rule: its condition in words (``for N steps`` included) and in PromQL."""
    rows = ["| alert | severity | condition | Prometheus (`rlmon rules export`) |",
            "|---|---|---|---|"]
    for rule in default_rules() if rules is None else rules:
        rows.append(f"| `{rule.name}` | {rule.severity.value} | {_cell(rule.describe())} | "
                    f"{_prometheus(rule)} |")
    return "\n".join(rows) + "\n"


def policy_markdown() -> str:
    rows = ["| alert | severity | resolves after (good steps) | critical |", "|---|---|---|---|"]
    for rule in default_rules():
        rows.append(f"| `{rule.name}` | {rule.severity.value} | {_resolves(rule)} | "
                    f"{_critical(rule)} |")
    return "\n".join(rows) + "\n"


def artifacts() -> list[Artifact]:
    return [Artifact("docs/alerting.md", conditions_markdown, block="conditions"),
            Artifact("docs/alerting.md", policy_markdown, block="policy")]
