"""Framework integrations: one module per framework, each importing its framework lazily.

Each attaches in at most three lines (docs/integrations.md) and reports canonical metrics with the
semantics recorded in :mod:`rlmon.service.metrics.keymaps`: exact where rlmon computes the value itself,
recomputed where it rebuilds it from the framework's numbers, relayed otherwise.
"""

__all__ = ["deepspeed", "openrlhf", "skyrl", "trl", "verl", "vllm"]
