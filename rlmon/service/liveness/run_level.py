"""One state for a whole run from the liveness states of its roles (the runs table, ``/api/runs``).

A run is as bad as its worst role: a run whose rollout role stalled is stalled even while its
actor still heartbeats, and one failed role makes the run failed. A run is finished only when
every role that has a state finished. ``unknown`` (a stream the service has not judged: a
replayed file, a store read without the live service) counts only when no role has a state.

A state this module does not rank (an outcome added to :class:`RunState` later) is shown as it
is: it outranks running and finished, so a new ending is seen, and yields to the known faults.
"""

from __future__ import annotations

from collections.abc import Iterable

from rlmon.service.liveness.run_state import RunState

__all__ = ["UNKNOWN", "run_level", "run_state"]

UNKNOWN = "unknown"

# worst first; a state not listed ranks just before RUNNING
_WORST_FIRST: tuple[str, ...] = (
    RunState.FAILED, RunState.PREEMPTED, RunState.DEAD, RunState.FROZEN, RunState.STALLED,
    RunState.SLOW, RunState.RUNNING, RunState.FINISHED)
_UNRANKED = _WORST_FIRST.index(RunState.RUNNING) - 0.5


def _rank(state: str) -> float:
    return _WORST_FIRST.index(state) if state in _WORST_FIRST else _UNRANKED


def run_state(role_states: Iterable[str]) -> str:
    """The run's state: its roles' worst (``unknown`` when none has a state)."""
    known = [str(s) for s in role_states if s and s != UNKNOWN]
    if not known:
        return UNKNOWN
    return min(known, key=_rank)


def run_level(roles: Iterable[tuple[str, str, str]]) -> tuple[str, str]:
    """The run's state from its roles' (role, state, detail), with the detail of the role that
    decided it ("actor: ..."); running when no role has a state yet."""
    ranked = sorted((r for r in roles if r[1] and r[1] != UNKNOWN), key=lambda r: _rank(r[1]))
    if not ranked:
        return RunState.RUNNING.value, ""
    role, state, detail = ranked[0]
    return state, f"{role}: {detail}" if detail else ""
