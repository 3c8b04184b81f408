"""Rank and world detection for a Reporter created without them."""

from __future__ import annotations

import sys
import types

import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.detect import detect_layout
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.metrics.rank import Rank, World


def test_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    rep = Reporter("r", "actor", sink=LocalSink())
    assert (rep.rank, rep.world) == (Rank(dp=3), World(dp=4))
    rep.close()


def test_single_rank_without_any_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert detect_layout() == (Rank(), World())


def test_megatron_parallel_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-LM cannot be installed here (CUDA build); a stand-in module exposes the same
    ``parallel_state`` functions, which is all the detection reads."""
    ps = types.ModuleType("megatron.core.parallel_state")
    values = {
        "model_parallel_is_initialized": True, "get_data_parallel_rank": 1,
        "get_data_parallel_world_size": 2, "get_context_parallel_rank": 1,
        "get_context_parallel_world_size": 2, "get_tensor_model_parallel_rank": 0,
        "get_tensor_model_parallel_world_size": 2, "get_pipeline_model_parallel_rank": 3,
        "get_pipeline_model_parallel_world_size": 4,
    }
    for name, value in values.items():
        setattr(ps, name, lambda value=value: value)
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", ps)
    assert detect_layout() == (Rank(1, 1, 0, 3), World(2, 2, 2, 4))


class _StandInMesh:
    """The three DeviceMesh members detection reads (a stand-in so it runs without torch)."""

    def __init__(self, names: tuple[str, ...] | None, sizes: tuple[int, ...],
                 coords: tuple[int, ...]) -> None:
        self.mesh_dim_names, self._sizes, self._coords = names, sizes, coords

    def size(self, dim: int) -> int:
        return self._sizes[dim]

    def get_coordinate(self) -> list[int]:
        return list(self._coords)


def _install_mesh(monkeypatch: pytest.MonkeyPatch, mesh: _StandInMesh) -> None:
    module = types.ModuleType("torch.distributed.device_mesh")
    module._mesh_resources = types.SimpleNamespace(  # type: ignore[attr-defined]
        get_current_mesh=lambda: mesh)
    monkeypatch.setitem(sys.modules, "torch.distributed.device_mesh", module)
    monkeypatch.delitem(sys.modules, "megatron.core.parallel_state", raising=False)


@pytest.mark.parametrize(("names", "rank", "world"), [
    # torchtitan's HSDP mesh: dp_replicate x dp_shard fold into dp, row-major.
    (("dp_replicate", "dp_shard", "tp"), Rank(dp=5, tp=1), World(dp=6, tp=2)),
    (("replica", "fsdp", "tensor"), Rank(dp=5, tp=1), World(dp=6, tp=2)),
    (None, Rank(dp=11), World(dp=12)),  # no names at all: every dimension is dp
])
def test_device_mesh_keeps_every_dimension(
    monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...] | None, rank: Rank, world: World,
) -> None:
    _install_mesh(monkeypatch, _StandInMesh(names, (2, 3, 2), (1, 2, 1)))
    assert detect_layout() == (rank, world)


def test_device_mesh_ranks_never_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = set()
    for a in range(2):
        for b in range(3):
            for c in range(2):
                _install_mesh(monkeypatch, _StandInMesh(
                    ("dp_replicate", "dp_shard", "cp"), (2, 3, 2), (a, b, c)))
                rank, world = detect_layout()
                assert world == World(dp=6, cp=2) and world.contains(rank)
                seen.add(rank)
    assert len(seen) == 12
