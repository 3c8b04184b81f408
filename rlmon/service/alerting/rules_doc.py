"""The default pack's notification policy as a docs table (docs/alerting.md, generated): per
rule its severity, how many good steps it keeps firing for, and its critical level, escalation
duration or the catalog's reason for having neither."""

from __future__ import annotations

from rlmon.service.alerting.rules import Condition, Rule, default_rules
from rlmon.service.generated import Artifact
from rlmon.service.metrics import catalog

__all__ = ["artifacts", "policy_markdown"]


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


def policy_markdown() -> str:
    rows = ["| alert | severity | resolves after (good steps) | critical |", "|---|---|---|---|"]
    for rule in default_rules():
        rows.append(f"| `{rule.name}` | {rule.severity.value} | {_resolves(rule)} | "
                    f"{_critical(rule)} |")
    return "\n".join(rows) + "\n"


def artifacts() -> list[Artifact]:
    return [Artifact("docs/alerting.md", policy_markdown, block="policy")]
