"""The sanity layer from seed 000's checklist: values that look like training bugs but are not.

- a DPO loss stuck at ln 2 (the model cannot tell chosen from rejected), and any loss stuck at
  ln 3 (uniform over three classes);
- grad_norm NaN under DeepSpeed 0.13.5-0.14.0: a known DeepSpeed bug, annotated so nobody pages
  on it as a training failure;
- a collapsing fp16 loss scale (repeated overflows);
- a relayed key that is not comparable across runs (its framework reduction is lossy, e.g.
  OpenRLHF ``policy_loss`` under uneven token counts).

It also holds the loss normalization between DeepSpeed and non-DeepSpeed runs: DeepSpeed's
``engine.backward`` divides the loss by gradient_accumulation_steps, so a DeepSpeed loss of 0.5
at gas 4 is a plain loss of 2.0. Over a recorded history with the run's settings
(docs/diagnose.md) two scaling signatures are visible in the values themselves:

- a loss or grad norm whose level jumps, where the run resumed with another
  gradient-accumulation or context-parallel size, by that size's ratio: the value is divided
  (or summed) by the setting, not normalized by the tokens (the 1/GA signature; a metric summed
  over CP ranks that each hold the whole value);
- more tokens per step than the batch can hold (per-device batch x GA x data-parallel size x
  the longest sequence): the tokens are counted more than once, by the CP size where it matches.

Pure data and arithmetic; no framework import.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from rlmon.service.metrics import catalog, keymaps

__all__ = ["Finding", "LossNormalization", "SanityChecker", "checker_args", "deepspeed_nan_bug",
           "level_shift", "relay_warnings", "scaled_by_setting", "tokens_overcounted"]

LN2 = math.log(2.0)
LN3 = math.log(3.0)
DS_NAN_BUG = ((0, 13, 5), (0, 14, 0))


class Kind(StrEnum):
    DPO_LOSS_LN2 = "DPOLossAtLn2"
    LOSS_LN3 = "LossAtLn3"
    GRAD_NORM_NAN_KNOWN_BUG = "GradNormNaNKnownDeepSpeedBug"
    LOSS_SCALE_COLLAPSE = "LossScaleCollapse"
    NOT_COMPARABLE = "RelayedKeyNotComparable"
    SCALED_BY_GA = "ScaledByGradAccumulation"
    SCALED_BY_CP = "ScaledByContextParallel"
    TOKENS_OVERCOUNTED = "TokensOverCounted"


@dataclass(frozen=True, slots=True)
class Finding:
    kind: Kind
    severity: str  # "warning" | "info"
    metric: str
    step: int | None
    message: str
    known_bug: bool = False


def _version(text: str) -> tuple[int, int, int]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def deepspeed_nan_bug(version: str | None) -> bool:
    """Whether a DeepSpeed version has the NaN grad_norm bug (0.13.5 to 0.14.0 inclusive)."""
    if not version:
        return False
    v = _version(version)
    return DS_NAN_BUG[0] <= v <= DS_NAN_BUG[1]


def relay_warnings(framework: str, keys: Iterable[str]) -> list[Finding]:
    """One warning per logged key whose framework reduction makes it incomparable across runs."""
    out = []
    for key in keys:
        row = keymaps.by_key(framework, key)
        if row is not None and not row.comparable:
            out.append(Finding(
                Kind.NOT_COMPARABLE, "warning", keymaps.relay_name(framework, key), None,
                f"{framework} {key!r} is relayed as {framework} reduced it ({row.reduction.value}) "
                f"and is not comparable across runs: {row.note}",
            ))
    return out


class RunMeta(Protocol):
    """What the sanity checks read of a run's metadata (the service's ``RunInfo``)."""

    @property
    def dpo(self) -> bool: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def deepspeed_version(self) -> str: ...


def checker_args(info: RunMeta | None) -> tuple[bool, str | None]:
    """A run's metadata as its checker's arguments: (a DPO run, its DeepSpeed version)."""
    if info is None:
        return False, None
    return info.dpo or info.algorithm.lower() == "dpo", info.deepspeed_version or None


_SHIFT_TOL = 0.2  # a level ratio within 20% of the setting's ratio matches it
_SHIFT_WINDOW = 5  # steps each side of a resume


def level_shift(before: Sequence[float], after: Sequence[float], ratio: float,
                ) -> float | None:
    """The level ratio (after / before, medians of the finite values nearest the resume) when
    it matches ``ratio`` or its inverse within 20% and stands out of the step-to-step noise on
    either side (each side's spread under the square root of the ratio); else None."""
    near_before = [v for v in before if math.isfinite(v)][-_SHIFT_WINDOW:]
    near_after = [v for v in after if math.isfinite(v)][:_SHIFT_WINDOW]
    if len(near_before) < 2 or len(near_after) < 2 or ratio <= 0 or ratio == 1:
        return None
    a, b = statistics.median(near_before), statistics.median(near_after)
    if a == 0 or b == 0 or (a > 0) != (b > 0):
        return None
    level = b / a
    wide = max(ratio, 1 / ratio)
    for side in (near_before, near_after):
        low, high = min(abs(v) for v in side), max(abs(v) for v in side)
        if low == 0 or high / low >= math.sqrt(wide):
            return None  # noisier than the shift could be told from
    for target in (ratio, 1 / ratio):
        if abs(math.log(level / target)) <= math.log(1 + _SHIFT_TOL):
            return level
    return None


def scaled_by_setting(metric: str, setting: str, old: int, new: int, step: int,
                      level: float) -> Finding:
    """The finding for a level shift that matches a setting's change at a resume."""
    ga = setting == "gradient_accumulation_steps"
    kind = Kind.SCALED_BY_GA if ga else Kind.SCALED_BY_CP
    if ga:
        check = ("the loss is divided (or summed) by the number of micro-batches instead of "
                 "normalized by the tokens: check the loss reduction (a mean of micro-batch "
                 "means, DeepSpeed's 1/GA scaling, a Trainer's num_items_in_batch) and compare "
                 "runs only after undoing it")
    else:
        check = ("the value is summed (or averaged) over context-parallel ranks that each hold "
                 "the whole value: reduce the metric over the data-parallel group without the "
                 "CP ranks (each CP rank already has the complete loss)")
    return Finding(kind, "warning", metric, step,
                   f"{metric} changed level x{level:.3g} at step {step}, where the run resumed "
                   f"with {setting} {old} -> {new} (x{new / old:.3g}): {check}")


def tokens_overcounted(metric: str, per_step: Sequence[tuple[int, float]], most: int,
                       cp: int | None, how: str = "", steps: int = 3) -> Finding | None:
    """``steps`` consecutive steps counting more tokens than ``most`` (the batch's capacity):
    a count summed over ranks that share the sequences; the factor named when it is the CP
    size."""
    run: list[float] = []
    for step, tokens in per_step:
        run = [*run, tokens] if math.isfinite(tokens) and tokens > most * 1.01 else []
        if len(run) >= steps:
            factor = statistics.median(run) / most
            why = (f"at least x{factor:.3g} the most the batch can hold, consistent with each "
                   f"sequence counted once per context-parallel rank (CP size {cp}): count "
                   "the tokens over the data-parallel group without the CP ranks"
                   if cp and cp > 1 and factor <= cp * (1 + _SHIFT_TOL) else
                   f"at least x{factor:.3g} the most the batch can hold: the count is summed "
                   "over ranks that share the same sequences (a gather over a group that "
                   "includes tensor, context or sequence-parallel ranks), or the settings "
                   "read are not the run's")
            return Finding(Kind.TOKENS_OVERCOUNTED, "warning", metric, step,
                           f"{metric}: {tokens:g} tokens per step for {steps} steps, more than "
                           f"{most:g} ({how or 'the most the batch can hold'}); "
                           + why)
    return None


@dataclass(frozen=True, slots=True)
class LossNormalization:
    """Run metadata: how this run's logged loss relates to a plain (non-DeepSpeed) loss."""

    deepspeed: bool
    gradient_accumulation_steps: int = 1
    scaled_by_gas: bool = False
    zero_stage: int | None = None
    deepspeed_version: str | None = None

    @property
    def factor(self) -> float:
        """Multiply a logged loss by this to get the comparable (non-DeepSpeed) loss."""
        return float(self.gradient_accumulation_steps) if self.scaled_by_gas else 1.0

    def comparable(self, loss: float) -> float:
        return loss * self.factor

    def as_metadata(self) -> dict[str, Any]:
        return {
            "deepspeed": self.deepspeed,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "loss_scaled_by_gas": self.scaled_by_gas,
            "comparable_loss_factor": self.factor,
            "zero_stage": self.zero_stage,
            "deepspeed_version": self.deepspeed_version,
            "deepspeed_nan_grad_norm_bug": deepspeed_nan_bug(self.deepspeed_version),
        }


@dataclass
class SanityChecker:
    """Feed it each step's values (``observe``); it returns the new findings of that step.

    ``loss_keys`` are the names holding a loss (any form, relayed or canonical); ``dpo`` marks a
    DPO run, where ln 2 is the chance level. A loss counts as stuck after ``stuck_steps``
    consecutive steps within ``tol`` of the constant.
    """

    dpo: bool = False
    deepspeed_version: str | None = None
    loss_keys: tuple[str, ...] = (catalog.LOSS, keymaps.relay_name("trl", "loss"))
    grad_norm_keys: tuple[str, ...] = (catalog.GRAD_NORM,)
    loss_scale_key: str = catalog.LOSS_SCALE
    stuck_steps: int = 5
    tol: float = 2e-3
    scale_drop: float = 2.0 ** 8  # a fall by this factor within the window is a collapse
    scale_window: int = 10
    _runs: dict[tuple[str, float], int] = field(default_factory=dict)
    _scales: list[float] = field(default_factory=list)
    _fired: set[tuple[Kind, str]] = field(default_factory=set)

    def _stuck(self, key: str, const: float, value: float) -> bool:
        run = self._runs.get((key, const), 0)
        run = run + 1 if math.isfinite(value) and abs(value - const) <= self.tol else 0
        self._runs[(key, const)] = run
        return run >= self.stuck_steps

    def _once(self, kind: Kind, metric: str, finding: Finding, out: list[Finding]) -> None:
        if (kind, metric) not in self._fired:
            self._fired.add((kind, metric))
            out.append(finding)

    def may_act(self, column: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Per step of a recorded series (``column(name)``: its values and whether it was
        logged, per step), whether :meth:`observe` can find anything or change its state there.
        Observing only those steps, in order, finds what observing every step finds: a step
        left out holds no loss near a constant after a loss that was not near one (its count
        stays 0), no NaN grad norm around a NaN one under the DeepSpeed bug, no loss scale."""
        act: np.ndarray | None = None
        constants = (LN2, LN3) if self.dpo else (LN3,)
        with np.errstate(invalid="ignore"):
            for key in self.loss_keys:
                values, logged = column(key)
                near = np.zeros(len(values), dtype=bool)
                for const in constants:
                    near |= np.abs(values - const) <= self.tol
                act = _or(act, _and_next(logged & np.isfinite(values) & near, logged))
            if deepspeed_nan_bug(self.deepspeed_version):
                for key in self.grad_norm_keys:
                    values, logged = column(key)
                    act = _or(act, _and_next(logged & np.isnan(values), logged))
            values, logged = column(self.loss_scale_key)
            act = _or(act, logged & np.isfinite(values) & (values > 0))
        return act

    def observe(self, step: int, values: Mapping[str, float]) -> list[Finding]:
        out: list[Finding] = []
        for key in self.loss_keys:
            v = values.get(key)
            if v is None:
                continue
            if self.dpo and self._stuck(key, LN2, v):
                self._once(Kind.DPO_LOSS_LN2, key, Finding(
                    Kind.DPO_LOSS_LN2, "warning", key, step,
                    f"DPO loss stuck at ln 2 = {LN2:.4f} for {self.stuck_steps} steps: the model "
                    "cannot tell chosen from rejected; check the learning rate, the data and the "
                    "reference model"), out)
            if self._stuck(key, LN3, v):
                self._once(Kind.LOSS_LN3, key, Finding(
                    Kind.LOSS_LN3, "warning", key, step,
                    f"loss stuck at ln 3 = {LN3:.4f} for {self.stuck_steps} steps: the model "
                    "predicts uniformly over three classes; check preprocessing and labels"), out)
        for key in self.grad_norm_keys:
            v = values.get(key)
            if v is None:
                continue
            if v != v and deepspeed_nan_bug(self.deepspeed_version):
                self._once(Kind.GRAD_NORM_NAN_KNOWN_BUG, key, Finding(
                    Kind.GRAD_NORM_NAN_KNOWN_BUG, "info", key, step,
                    f"grad_norm is NaN under DeepSpeed {self.deepspeed_version}: a known bug of "
                    "0.13.5-0.14.0 (training may be fine); upgrade, or set gradient_clipping",
                    known_bug=True), out)
            elif v == v:
                self._fired.discard((Kind.GRAD_NORM_NAN_KNOWN_BUG, key))
        scale = values.get(self.loss_scale_key)
        if scale is not None and math.isfinite(scale) and scale > 0:
            self._scales.append(scale)
            del self._scales[:-self.scale_window]
            peak = max(self._scales)
            fired = (Kind.LOSS_SCALE_COLLAPSE, self.loss_scale_key)
            if peak / scale >= self.scale_drop or scale < 1.0:
                self._once(Kind.LOSS_SCALE_COLLAPSE, self.loss_scale_key, Finding(
                    Kind.LOSS_SCALE_COLLAPSE, "warning", self.loss_scale_key, step,
                    f"fp16 loss scale fell from {peak:g} to {scale:g} within "
                    f"{len(self._scales)} steps: repeated overflows"), out)
            else:
                self._fired.discard(fired)  # recovered: a later collapse is news again
        return out


def _or(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
    return b if a is None else a | b


def _and_next(flagged: np.ndarray, logged: np.ndarray) -> np.ndarray:
    """``flagged`` and, after each flagged step, the next step that logged the key (where its
    count is reset)."""
    at = np.flatnonzero(logged)
    out = flagged.copy()
    out[at[1:][flagged[at[:-1]]]] = True
    return out
