"""``rlmon rules``: show or validate alert rules."""

from __future__ import annotations

import argparse
import sys

from rlmon.service.rules import RuleError, load_rules, rules_to_yaml

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


def _show(args: argparse.Namespace) -> int:
    try:
        print(rules_to_yaml(load_rules(args.rules)), end="")
    except (RuleError, OSError) as exc:
        print(f"rlmon rules: {exc}", file=sys.stderr)
        return 2
    return 0


def _check(args: argparse.Namespace) -> int:
    try:
        rules = load_rules(args.file)
    except (RuleError, OSError) as exc:
        print(f"rlmon rules: {exc}", file=sys.stderr)
        return 2
    print(f"{args.file}: {len(rules)} rules OK")
    return 0
