"""Find a process's rank and world when the caller does not give them.

Tried in order: Megatron-LM's ``parallel_state`` (DP, CP, TP, PP), a current torch
``DeviceMesh`` (dimensions named by axis; unrecognised names fold into dp), a plain initialised
``torch.distributed`` group (every rank a DP rank), then the launcher's ``RANK`` / ``WORLD_SIZE``.
Nothing here issues a collective: each source only reads what the process already knows.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from rlmon.service.metrics.rank import AXES, Rank, World

__all__ = ["coerce_rank", "coerce_world", "detect_layout"]

_MESH_AXES = {"dp": "dp", "data": "dp", "dp_shard": "dp", "fsdp": "dp", "ddp": "dp",
              "cp": "cp", "context": "cp", "sp": "cp", "tp": "tp", "tensor": "tp",
              "pp": "pp", "pipeline": "pp"}


def coerce_rank(value: Rank | Mapping[str, int]) -> Rank:
    if isinstance(value, Rank):
        return value
    unknown = set(value) - set(AXES)
    if unknown:
        raise ValueError(f"rank: unknown axis {sorted(unknown)[0]!r} (axes are dp, cp, tp, pp)")
    return Rank(**{k: int(v) for k, v in value.items()})


def coerce_world(value: World | Mapping[str, int]) -> World:
    if isinstance(value, World):
        return value
    unknown = set(value) - set(AXES)
    if unknown:
        raise ValueError(f"world: unknown axis {sorted(unknown)[0]!r} (axes are dp, cp, tp, pp)")
    return World(**{k: int(v) for k, v in value.items()})


def _megatron() -> tuple[Rank, World] | None:
    ps: Any = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized():
        return None
    cp_rank = getattr(ps, "get_context_parallel_rank", lambda: 0)()
    cp_size = getattr(ps, "get_context_parallel_world_size", lambda: 1)()
    rank = Rank(
        ps.get_data_parallel_rank(), cp_rank,
        ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(),
    )
    world = World(
        ps.get_data_parallel_world_size(), cp_size,
        ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
    )
    return rank, world


def _device_mesh() -> tuple[Rank, World] | None:
    if "torch.distributed.device_mesh" not in sys.modules:
        return None
    try:
        module: Any = sys.modules["torch.distributed.device_mesh"]
        mesh = module._mesh_resources.get_current_mesh()
    except Exception:  # no current mesh
        return None
    coords = mesh.get_coordinate() or []
    names = mesh.mesh_dim_names or ("",) * len(coords)  # unnamed dimensions fold into dp
    rank, world = dict.fromkeys(AXES, 0), dict.fromkeys(AXES, 1)
    for dim, name in enumerate(names):
        # An unrecognised dimension (torchtitan's dp_replicate, a custom name) still splits the
        # ranks: it folds into dp, row-major, so no two ranks collide and none is lost.
        axis = _MESH_AXES.get(name, "dp")
        rank[axis] = rank[axis] * mesh.size(dim) + coords[dim]
        world[axis] *= mesh.size(dim)
    return Rank(**rank), World(**world)


def _torch_distributed() -> tuple[Rank, World] | None:
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return Rank(dp=dist.get_rank()), World(dp=dist.get_world_size())


def _environment() -> tuple[Rank, World] | None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return Rank(dp=int(os.environ["RANK"])), World(dp=int(os.environ["WORLD_SIZE"]))
    return None


def detect_layout() -> tuple[Rank, World]:
    """The first layout a known source reports, else a single rank."""
    for source in (_megatron, _device_mesh, _torch_distributed, _environment):
        found = source()
        if found is not None:
            return found
    return Rank(), World()
