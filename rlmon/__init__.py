"""rlmon: monitoring for RLHF training on Ray.

The user API is re-exported lazily so that ``import rlmon.service`` (pure Python) never pulls in
Ray: ``rlmon.Reporter`` imports :mod:`rlmon.actors` only when it is first touched.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CATALOG", "Reporter", "StepRecord", "default_rules", "replay", "watch_methods"]
__version__ = "0.1.0"

_LAZY = {
    "CATALOG": "rlmon.service.metrics.catalog",
    "StepRecord": "rlmon.service.contract.step_record",
    "default_rules": "rlmon.service.alerting.rules",
    "replay": "rlmon.service.replay",
    "Reporter": "rlmon.actors.reporter",
    "watch_methods": "rlmon.actors.reporter",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rlmon' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
