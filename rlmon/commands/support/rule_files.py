"""The rule file a subcommand reads: loaded, and its problems said, the same way everywhere."""

from __future__ import annotations

import sys
from typing import IO

from rlmon.service.alerting.rules import Rule, RuleError, load_rules, unknown_metrics

__all__ = ["read_rules"]


def read_rules(path: str | None, command: str, err: IO[str] | None = None) -> list[Rule] | None:
    """The default pack with the rule file at ``path`` on top (None: the pack alone).

    A file that cannot be read or parsed is said on ``err`` as ``rlmon <command>: <error>`` (the
    error names the file, and the rule and field at fault) and None is returned: the command
    exits with its input-error code. Rules of the file watching a metric the catalog does not
    define (a typo, or a custom metric) are warned about and kept.
    """
    err = err or sys.stderr
    try:
        rules = load_rules(path)
    except (RuleError, OSError) as exc:
        print(f"rlmon {command}: {exc}", file=err)
        return None
    for warning in unknown_metrics(rules) if path is not None else ():
        print(f"rlmon {command}: warning: {warning}", file=err)
    return rules
