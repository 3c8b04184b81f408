"""The names of rlmon's actors in their namespace, and which aggregator shard serves a stream.

The service is ``rlmon-service`` and the aggregators ``rlmon-aggregator-<i>``; a (run, role)
always maps to the same shard, in every process and after every restart.
"""

from __future__ import annotations

import zlib

from rlmon.actors.service_actor import SERVICE

__all__ = ["AGGREGATOR", "SERVICE", "aggregator_name", "node_merger_name", "shard_of"]

AGGREGATOR = "rlmon-aggregator"


def aggregator_name(shard: int) -> str:
    return f"{AGGREGATOR}-{shard}"


def node_merger_name(shard: int, node: str) -> str:
    """The node merger of one aggregator shard on one Ray node."""
    return f"rlmon-node-merger-{shard}-{node[:16]}"


def shard_of(run: str, role: str, shards: int) -> int:
    """The aggregator shard of a (run, role): stable across processes and restarts."""
    return zlib.crc32(f"{run}\0{role}".encode()) % max(shards, 1)
