"""Rank detection from a real torch.distributed process group (gloo on loopback: a socket, so
the service layer; the extras venv runs it, with torch)."""

from __future__ import annotations

import pytest

from rlmon.actors.reporter.detect import detect_layout
from rlmon.service.metrics.rank import Rank, World
from tests.support.extras import optional_import
from tests.support.network import free_port


@pytest.mark.torch
def test_torch_distributed_gloo_group(monkeypatch: pytest.MonkeyPatch) -> None:
    dist = optional_import("torch.distributed")
    port = free_port()
    monkeypatch.delenv("RANK", raising=False)
    if dist.is_initialized():  # a DeepSpeed engine earlier in the session leaves its group behind
        dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        assert detect_layout() == (Rank(dp=0), World(dp=1))
    finally:
        dist.destroy_process_group()
