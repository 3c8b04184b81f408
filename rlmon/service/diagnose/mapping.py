"""Logged keys mapped with the framework key maps (:mod:`rlmon.service.metrics.keymaps`).

The framework is the one whose key map names the most of the run's keys (or the one given, or
the one the writer names). A key the map gives a canonical name is evaluated under it, with
what its value is (exact, recomputed, relayed) and, where the framework reduced it lossily (a
mean of micro-batch means, a last micro-batch), a flag that every finding on it carries; the
integrations publish such keys under ``<framework>/<key>``, but a diagnosis has only the logged
number, so the rules judge it under the canonical name and say so. A key the map knows without
a canonical name is relayed under ``<framework>/<key>``; a key equal to a catalog name is taken
as such; the writer's bookkeeping (step counters, runtimes) is set apart; every other key is
listed as unknown and still watched for NaN and Inf.

Trackers prefix the keys they are handed: the Hugging Face callbacks and OpenRLHF log
``train/<key>`` to TensorBoard and W&B, so a key is also looked up without that prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rlmon.service.metrics import catalog, keymaps

__all__ = ["KeyInfo", "KeyMap", "KeyStatus", "map_keys"]

_PREFIXES = ("train/",)
BOOKKEEPING = frozenset({
    "step", "epoch", "global_step", "_step", "_runtime", "_timestamp", "total_flos",
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
    "num_tokens", "num_input_tokens_seen", "training/global_step", "training/epoch",
    "trainer/global_step",
})
_EVAL_PREFIXES = ("eval/", "eval_", "val/", "val-", "test/")
_FIDELITY_RANK = {keymaps.Fidelity.EXACT: 0, keymaps.Fidelity.RECOMPUTED: 1,
                  keymaps.Fidelity.RELAYED: 2}


class KeyStatus(StrEnum):
    CANONICAL = "canonical"  # evaluated under a catalog name
    RELAYED = "relayed"  # in the framework's key map, no canonical name: <framework>/<key>
    UNKNOWN = "unknown"  # not in any key map: listed, watched for NaN/Inf under its own name
    EVALUATION = "evaluation"  # an evaluation metric: listed, watched for NaN/Inf
    BOOKKEEPING = "bookkeeping"  # step counters, runtimes: not a metric


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """One logged key: the name it is evaluated under and what its value is."""

    key: str
    status: KeyStatus
    name: str  # the name in the step records ("" for bookkeeping)
    fidelity: str = ""  # exact | recomputed | relayed | as logged ("" when unknown)
    reduction: str = ""
    lossy: bool = False
    note: str = ""

    def describe(self) -> str:
        """What the value is, in one phrase (for findings and the terminal)."""
        if self.reduction:
            text = f"as logged: {self.reduction}"
            text += "; lossy, not comparable across runs" if self.lossy else ""
            return f"{text}; rlmon's key map: {self.fidelity}"
        return self.fidelity or self.status.value

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "status": self.status.value, "name": self.name,
                "fidelity": self.fidelity, "reduction": self.reduction, "lossy": self.lossy,
                "note": self.note}


@dataclass(frozen=True, slots=True)
class KeyMap:
    framework: str | None
    how: str  # "detected", "given", "written by the framework's own logger", "rlmon"
    scores: tuple[tuple[str, int], ...]
    keys: tuple[KeyInfo, ...]

    def by_name(self) -> dict[str, KeyInfo]:
        return {info.name: info for info in self.keys if info.name}

    def of_status(self, status: KeyStatus) -> list[KeyInfo]:
        return [info for info in self.keys if info.status is status]

    @property
    def known(self) -> int:
        return len(self.of_status(KeyStatus.CANONICAL)) + len(self.of_status(KeyStatus.RELAYED))


def _candidates(key: str) -> list[str]:
    out = [key]
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            out.append(key[len(prefix):])
    return out


def _row(framework: str, key: str) -> keymaps.KeyMapping | None:
    for candidate in _candidates(key):
        row = keymaps.by_key(framework, candidate)
        if row is not None:
            return row
    return None


def detect_framework(keys: Iterable[str]) -> tuple[str | None, tuple[tuple[str, int], ...]]:
    """The framework whose key map names the most keys (None when none names any, or two tie).

    A framework needs one key of its own that is not also a catalog name: verl logs
    ``actor/entropy``, but so does a loop that reports rlmon's canonical names."""
    keys = list(keys)
    scores = sorted(((fw, sum(_row(fw, k) is not None for k in keys))
                     for fw in keymaps.FRAMEWORKS), key=lambda s: -s[1])
    scores = [(fw, n) for fw, n in scores if n and any(
        _row(fw, k) is not None and catalog.lookup(k) is None for k in keys)]
    if not scores or (len(scores) > 1 and scores[0][1] == scores[1][1]):
        return None, tuple(scores)
    return scores[0][0], tuple(scores)


def _is_eval(key: str) -> bool:
    return any(key.startswith(p) or key.startswith(f"train/{p}") for p in _EVAL_PREFIXES)


def map_keys(keys: Sequence[str], framework: str | None = None,
             writer: str | None = None) -> KeyMap:
    """Map a run's keys; ``framework`` forces the key map (``--framework``), ``writer`` is the
    framework the file format itself belongs to (verl's file logger)."""
    scores: tuple[tuple[str, int], ...] = ()
    if framework is not None:
        how = "given"
    elif writer is not None:
        framework, how = writer, "written by the framework's own logger"
    else:
        framework, scores = detect_framework(keys)
        how = "detected from its keys" if framework else "none detected"
    infos: list[KeyInfo] = []
    claimed: dict[str, tuple[int, int]] = {}  # canonical -> (fidelity rank, index in infos)
    for key in keys:
        row = _row(framework, key) if framework else None
        bare = _candidates(key)[-1]
        if row is not None and row.canonical is not None:
            info = KeyInfo(key, KeyStatus.CANONICAL, row.canonical, row.fidelity.value,
                           row.reduction.value, not row.comparable, row.note)
            rank = _FIDELITY_RANK[row.fidelity]
            held = claimed.get(row.canonical)
            if held is not None and held[0] <= rank:  # a better key has the name: relay this one
                info = KeyInfo(key, KeyStatus.RELAYED, keymaps.relay_name(framework or "", bare),
                               row.fidelity.value, row.reduction.value, not row.comparable,
                               f"{row.canonical} is taken from {infos[held[1]].key!r}")
            elif held is not None:
                old = infos[held[1]]
                infos[held[1]] = KeyInfo(old.key, KeyStatus.RELAYED,
                                         keymaps.relay_name(framework or "", old.key),
                                         old.fidelity, old.reduction, old.lossy, old.note)
            if info.status is KeyStatus.CANONICAL:
                claimed[row.canonical] = (rank, len(infos))
        elif row is not None:
            info = KeyInfo(key, KeyStatus.RELAYED, keymaps.relay_name(framework or "", bare),
                           row.fidelity.value, row.reduction.value, not row.comparable, row.note)
        elif key in BOOKKEEPING or bare in BOOKKEEPING:
            info = KeyInfo(key, KeyStatus.BOOKKEEPING, "")
        elif catalog.lookup(bare) is not None and bare not in claimed:
            # a canonical name, as logged or under a tracker's prefix (train/rollout/verifier_score)
            info = KeyInfo(key, KeyStatus.CANONICAL, bare, "logged under the canonical name",
                           note="logged under rlmon's canonical name; its reduction is the "
                           "writer's")
            claimed[bare] = (_FIDELITY_RANK[keymaps.Fidelity.RELAYED], len(infos))
        elif _is_eval(key):
            info = KeyInfo(key, KeyStatus.EVALUATION, key)
        else:
            info = KeyInfo(key, KeyStatus.UNKNOWN, key)
        infos.append(info)
    return KeyMap(framework, how, scores, tuple(infos))


def rlmon_key_map(keys: Sequence[str]) -> KeyMap:
    """rlmon's own files: every name is rlmon's, its value computed by rlmon."""
    return KeyMap(None, "rlmon", (), tuple(
        KeyInfo(k, KeyStatus.CANONICAL if catalog.lookup(k) else KeyStatus.UNKNOWN, k,
                "exact: aggregated by rlmon" if catalog.lookup(k) else "") for k in keys))
