"""``rlmon rules``: show or validate alert rules."""

from __future__ import annotations

import argparse
import sys

from rlmon.commands.support.rule_files import read_rules
from rlmon.service.alerting.conditions.kind import RlmonOnly
from rlmon.service.alerting.conditions.registry import kind_of
from rlmon.service.alerting.rules import Rule, rules_to_yaml

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rules", help="show, check or export alert rules")
    rsub = p.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    show = rsub.add_parser("show", help="print the effective rules as a YAML rule file")
    show.add_argument("--rules", help="YAML rule file on top of the default pack")
    show.set_defaults(func=_show)
    check = rsub.add_parser("check", help="validate a rule file")
    check.add_argument("file")
    check.set_defaults(func=_check)
    export = rsub.add_parser("export", help="write Prometheus alerting rules from the rule pack")
    export.add_argument("--format", choices=("prometheus", "prometheusrule"), default="prometheus",
                        help="a Prometheus rule file, or a prometheus-operator PrometheusRule")
    export.add_argument("--rules", help="YAML rule file on top of the default pack")
    export.add_argument("--config", help="rlmon config (prometheus_rules.step_period_seconds)")
    export.add_argument("--step-period", type=float, help="seconds per trainer step (for: N steps)")
    export.add_argument("--release", default=None,
                        help="`release:` label of a PrometheusRule (kube-prometheus-stack's "
                        "release name; default kube-prometheus-stack; '' for none)")
    export.add_argument("-o", "--output", help="write here instead of stdout")
    export.set_defaults(func=_export)


def _explained(rules: list[Rule]) -> str:
    """The rule file, each rule under a comment saying its condition in words and in PromQL
    (or why rlmon alone judges it), from its condition's kind."""
    lines = []
    pending = iter(rules)
    for line in rules_to_yaml(rules).splitlines():
        if line.startswith("- "):  # a rule of the list (its own lines are indented)
            rule = next(pending)
            found = kind_of(rule).promql(rule)
            exported = f"rlmon only: {found.value}" if isinstance(found, RlmonOnly) \
                else f"Prometheus: {found.expr}"
            lines.append(f"# {rule.name}: {rule.describe()} ({exported})")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _show(args: argparse.Namespace) -> int:
    rules = read_rules(args.rules, "rules")
    if rules is None:
        return 2
    print(_explained(rules), end="")
    return 0


def _check(args: argparse.Namespace) -> int:
    rules = read_rules(args.file, "rules")
    if rules is None:
        return 2
    print(f"{args.file}: {len(rules)} rules OK")
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlmon.service.config import ConfigError, load_config
    from rlmon.service.export.prometheus_rules import render

    try:
        settings = load_config(args.config, only=("prometheus_rules",))
    except (ConfigError, OSError) as exc:
        print(f"rlmon rules: {exc}", file=sys.stderr)
        return 2
    rules = read_rules(args.rules, "rules")
    if rules is None:
        return 2
    cfg = settings.prometheus_rules
    period = args.step_period if args.step_period is not None else cfg.step_period_seconds
    if period <= 0:
        print("rlmon rules: --step-period must be positive", file=sys.stderr)
        return 2
    from rlmon.service.export.prometheus_rules import DEFAULT_RELEASE

    release = DEFAULT_RELEASE if args.release is None else args.release
    text = render(rules, step_period=period, fmt=args.format, interval=cfg.evaluation_interval,
                  release=release)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0
