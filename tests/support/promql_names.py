"""The metric names a PromQL expression selects: a test checks each dashboard query against the
names a live exporter serves."""

from __future__ import annotations

import re

__all__ = ["metric_names"]

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
     "group_left", "group_right", "inf", "nan", "atan2"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, labels, keywords or durations)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    text = re.sub(r"\b\d[\w.]*", "", text)  # numbers and durations such as 5m, 1e-9
    return {m for m in _IDENT.findall(text) if m.lower() not in _KEYWORDS}
