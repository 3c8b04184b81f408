"""Ray's own knowledge of whether a silent run's processes still exist (docs/liveness.md).

Asked by the aggregator's liveness tracker before it calls a silent run dead
(:class:`~rlmon.service.liveness.process_probe.ProcessProbe`). Ray's GCS knows, for a Reporter
in an actor, the actor's state (``DEAD`` once its worker process exited or was killed, its node
lost), and for a Reporter in a driver, whether the job's driver is still connected (a driver
that exited or was killed is marked dead within seconds). Neither says whether a live process is
running or stopped; the same-node check (``/proc``) says that for a process on the aggregator's
node, and answers for the processes Ray does not know (a script not under Ray, another
cluster). The GCS is read directly (``ray._private.state``: no dashboard needed), each answer
bounded by Ray's GCS client timeouts; any error is ``unknown``, never ``gone``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlmon.service.contract.heartbeat import ProcessId
from rlmon.service.liveness.process_probe import ProcessFate, SameNodeProbe, Sighting

__all__ = ["RayProcessProbe"]


class RayProcessProbe:
    """Ray's GCS first (actors, the job's driver), then the same node's ``/proc``."""

    def __init__(self, local: SameNodeProbe | None = None) -> None:
        self.local = local or SameNodeProbe()

    def check(self, processes: Sequence[ProcessId],
              since: Mapping[ProcessId, float]) -> dict[ProcessId, Sighting]:
        jobs: dict[str, bool] | None = None
        out = {}
        for proc in processes:
            ray_says: Sighting | None = None
            try:
                if proc.actor_id:
                    ray_says = self._actor(proc.actor_id)
                elif proc.job_id:
                    if jobs is None:
                        jobs = self._jobs()
                    dead = jobs.get(proc.job_id)
                    if dead is not None:
                        ray_says = Sighting(
                            ProcessFate.GONE if dead else ProcessFate.ALIVE,
                            f"Ray: job {proc.job_id}'s driver "
                            + ("exited" if dead else "is still connected"))
            except Exception as exc:  # the GCS unreachable, an older Ray: say so, judge locally
                ray_says = Sighting(ProcessFate.UNKNOWN, f"Ray could not be asked: {exc}")
            out[proc] = _combine(ray_says, self.local.sight(proc, since.get(proc)))
        return out

    @staticmethod
    def _actor(actor_id: str) -> Sighting:
        from ray._private.state import state

        info: dict[str, Any] = state.actor_table(actor_id)
        if not info:
            return Sighting(ProcessFate.UNKNOWN, f"Ray: no actor {actor_id}")
        status = str(info.get("State", ""))
        if status in ("DEAD", "RESTARTING"):
            return Sighting(ProcessFate.GONE, f"Ray: actor {actor_id} is {status} (its worker "
                                              f"process pid {info.get('Pid')} exited)")
        return Sighting(ProcessFate.ALIVE, f"Ray: actor {actor_id} is {status}")

    @staticmethod
    def _jobs() -> dict[str, bool]:
        from ray._private.state import state

        return {str(job["JobID"]): bool(job["IsDead"]) for job in state.job_table()}


def _combine(ray_says: Sighting | None, local: Sighting) -> Sighting:
    """Gone if either knows it gone; the same node's word when it sees the process (it tells
    stopped from running); Ray's otherwise; unknown with both reasons when neither knows."""
    if ray_says is not None and ray_says.fate is ProcessFate.GONE:
        return ray_says
    if local.fate is not ProcessFate.UNKNOWN:
        return local
    if ray_says is not None and ray_says.fate is ProcessFate.ALIVE:
        return ray_says
    reasons = "; ".join(s.how for s in (ray_says, local) if s is not None)
    return Sighting(ProcessFate.UNKNOWN, reasons)
