"""Simulated time and message builders for the liveness tests."""

from __future__ import annotations

from rlmon.service.contract.heartbeat import Heartbeat, OpenSpan, RankBeat
from rlmon.service.contract.step_message import StepMessage, columns_from_states
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form
from tests.support.clock import FakeClock

T0 = 1_700_000_000.0


def sim_clock(start: float = T0) -> FakeClock:
    """The liveness tests' clock: its ``wall`` reads ``start`` (unix seconds), the call a
    monotonic reading 1000 s into the process."""
    return FakeClock(start - T0 + 1000.0, wall_offset=T0 - 1000.0)


def step_message(run: str, step: int, dp: int = 0, world: int = 1, seq: int | None = None,
                 heartbeat: Heartbeat | None = None, role: str = "actor") -> StepMessage:
    cols = columns_from_states({"actor/loss": (Form.MEAN, (1.0, 2.0))})
    return StepMessage(run, role, step, Rank(dp=dp), World(dp=world),
                       seq if seq is not None else step + 1, 0.0, cols, heartbeat=heartbeat)


def beat(run: str, dp: int, world: int, spans: tuple[tuple[str, float], ...] = (),
         last_step: int | None = None, at: float = T0, closing: bool = False,
         role: str = "actor") -> Heartbeat:
    return Heartbeat(run, role, World(dp=world),
                     (RankBeat(Rank(dp=dp), tuple(OpenSpan(n, s) for n, s in spans), last_step),),
                     at, closing)
