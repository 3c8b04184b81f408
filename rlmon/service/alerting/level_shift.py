"""Two healthy shapes that reach an early warning's evidence without a slide under way, told
apart from one by what the departure looks like so far (issue 39's quiet healthy runs).

An early warning (a baseline rule, :mod:`rlmon.service.alerting.baseline`) says early that a
metric has left its run's own past and is on its way somewhere. Two healthy departures are on
their way nowhere:

- **A level shift**: the metric moves in one step and then holds still or recedes. A switch to
  harder prompts drops the reward at once and lengthens the completions; an LR warm restart
  lifts the clip ratio and the KL with the LR; each then stays or drifts back. The step into the
  departure is at once as far as it goes: nothing is sliding towards the level the rule's level
  rule pages at. Held back: the rule stays pending while the departure began with a step of at
  least ``JUMP`` robust SDs (a step no noise of the run's own makes), taken from the run's own
  level (the steps just before it within one SD of it: a ramp's are its own first steps on
  their way), and has not moved on since by a third of that step again (at least two SDs, at
  most four). It fires as soon as it does
  (a jump followed by a runaway), and at once where the level rule's condition already holds on
  the step (the new level is one to page at: the early warning speaks for it as before). Only
  for a rule with a level rule (a slide heads for that level, which judges any level the shift
  settles at: the policy lag has none) and on a metric a healthy run moves in one step for a
  known cause (:data:`SHIFTS_FOR_A_CAUSE`: a change of the data or of the learning rate; not
  the trainer/rollout mismatch).
- **Jitter in whole steps**: a metric whose values are all whole numbers (the policy lag) at a
  value it reached at least three times within its window before the departure: a queue's
  jitter, not growth. Held back while it stays within what it keeps returning to.

Both read only the rule's own state, so a live run, ``rlmon replay`` and ``rlmon diagnose``'s
batch path (:mod:`rlmon.service.alerting.quiet_steps`, which judges a pending rule at every
step) hold back the same steps. A shift is judged once, where the rule would first fire, from
the window before it (:class:`Shift`, kept in the rule's state); later steps of the same
episode (until the rule has been quiet for a window's length) are judged against it, since by
then the window holds the new level too; it is saved with the alert state, so a restarted
service continues the episode.

A ramp is never held back at its start: its step into the departure is one step of the ramp,
and its departure has moved on since by as much again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from statistics import median

from rlmon.service.alerting import baseline
from rlmon.service.metrics import catalog as c
from rlmon.service.metrics.spec import BaselineParams

__all__ = ["JUMP", "SHIFTS_FOR_A_CAUSE", "Shift", "hold", "jitter", "level_shift"]

# a jump's step, in robust SDs of the window before it: a step the run's own noise does not
# make (a Gaussian's one in 30,000), and more than any rule's per-step allowance
JUMP = 4.0
_MIN_BEFORE = 8  # pre-departure values needed to say where the departure began
_NOISE = 2.0  # robust SDs a departure's level moves by noise alone
_AT_REST = 1.0  # robust SDs from the level before: a step taken from there
_REVISITS = 3  # times a whole-number metric reached a value before: its jitter
# the metrics a healthy run moves in one step, for a known cause: a change of the data (reward,
# length, ties, entropy, KL) or of the learning rate (KL, clip ratio, gradient norm). The
# trainer/rollout mismatch (LogprobMismatchClimbing) is not among them: two engines holding the
# same weights differ by the same amount whatever the data; a step in it is a change of setup
SHIFTS_FOR_A_CAUSE = frozenset({c.REWARD, c.RESPONSE_LENGTH, c.FRAC_REWARD_ZERO_STD, c.ENTROPY,
                                c.KL, c.CLIP_RATIO, c.GRAD_NORM})


@dataclass(frozen=True, slots=True)
class Shift:
    """A departure judged a level shift: the level before it and its scale (the detector's
    space), where it began and the step into it (in those scales), the step of its first value,
    the last step held back."""

    expected: float
    scale: float
    began: float
    step_in: float
    first: int
    last: int

    def to_json(self) -> list[float]:
        return [self.expected, self.scale, self.began, self.step_in, self.first, self.last]

    @classmethod
    def from_json(cls, item: list[float]) -> Shift:
        expected, scale, began, step_in, first, last = item
        return cls(float(expected), float(scale), float(began), float(step_in), int(first),
                   int(last))

    def z(self, params: BaselineParams, value: float) -> float:
        """``value`` in scales from the level before, in the watched direction."""
        sign = -1.0 if params.direction == "down" else 1.0
        return sign * (baseline._transform(params, value) - self.expected) / self.scale

    def moved_on(self, params: BaselineParams, history: deque[float], step: int) -> bool:
        """Whether the departure's latest values (up to 3, after its first) have moved on past
        where it began (:func:`_moved`)."""
        recent = list(history)[-max(1, min(3, step - self.first)):]
        now = median(self.z(params, v) for v in recent)
        return now - self.began > _moved(self.step_in)


def hold(params: BaselineParams, history: deque[float], held_steps: int, step: int,
         shift: Shift | None) -> Shift | None:
    """The level shift a baseline rule about to fire at ``step`` waits on (None: it fires).
    ``held_steps``: the consecutive steps its evidence has held; ``shift``: the episode's,
    where one was judged before."""
    if shift is not None and step - shift.last <= params.window:
        return None if shift.moved_on(params, history, step) else replace(shift, last=step)
    return level_shift(params, history, held_steps, step)


def _split(history: deque[float], held_steps: int) -> tuple[list[float], list[float]] | None:
    values = list(history)
    recent = held_steps + 1  # the steps the evidence held and the one before the first
    if len(values) - recent < _MIN_BEFORE:
        return None
    return values[:-recent], values[-recent:]


def jitter(params: BaselineParams, history: deque[float], held_steps: int) -> bool:
    """A whole-number metric at a value its window kept reaching before the departure."""
    parts = _split(history, held_steps)
    if parts is None or not all(float(v).is_integer() for v in history):
        return False
    before, recent = parts
    value = recent[-1]
    # a value it keeps returning to: reached at least _REVISITS times (a fault's own first
    # steps reach a new value once or twice before the evidence holds)
    beyond = [v for v in before if (v >= value if params.direction == "up" else v <= value)]
    return len(beyond) >= _REVISITS


def level_shift(params: BaselineParams, history: deque[float], held_steps: int,
                step: int) -> Shift | None:
    """The departure as a level shift, where it began with one step of at least ``JUMP``
    robust SDs and has not moved on since (:meth:`Shift.moved_on`); else None."""
    parts = _split(history, held_steps)
    if parts is None:
        return None
    before, recent = parts
    expected, scale = baseline.predict(params, before)
    probe = Shift(expected, scale, 0.0, 0.0, step, step)
    scores = [probe.z(params, v) for v in (*before, *recent)]
    start = _onset(params, scores)
    departure = scores[start:]
    if len(departure) < 2 or start == 0:
        return None
    k = max(1, min(3, len(departure) // 2))
    began = median(departure[:max(2, k)])  # where it began: its first values' level
    # it leaves from the run's level: the steps just before it there (a ramp's are its own
    # first steps, on their way up)
    lead = median(scores[max(0, start - k):start])
    step_in = began - lead
    if lead > _AT_REST or step_in < max(JUMP, params.allowance) \
            or median(departure[-k:]) - began > _moved(step_in):
        return None
    return replace(probe, began=began, step_in=step_in, first=step - (len(departure) - 1))


def _moved(step_in: float) -> float:
    """How far past where it began a departure must go to have moved on: a third of its step
    (a big jump's new level is noisier than the run before it), at least two SDs (noise), at
    most four (a jump followed by a runaway fires within a step or two, however big the jump)."""
    return min(max(_NOISE, step_in / 3), 2 * _NOISE)


def _onset(params: BaselineParams, scores: list[float]) -> int:
    """Where the departure began: the step after the CUSUM of ``scores`` (robust z-scores,
    clipped as the detector clips them) was last zero (Page's estimate of a change's onset)."""
    cap = baseline.z_cap(params)
    total, start = 0.0, 0
    for index, z in enumerate(scores):
        total = max(0.0, total + min(max(z, -cap), cap) - params.allowance)
        if total == 0.0:
            start = index + 1
    return start
