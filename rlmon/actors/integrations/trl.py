"""TRL: a ``transformers.TrainerCallback`` that relays what TRL logs, plus, bound to a
``GRPOTrainer``, exact values taken from the trainer's own per-micro-batch tensors.

Use it as ``from rlmon.actors.integrations.trl import RlmonCallback`` (importing the module as
``trl`` would shadow TRL's own package in the user's module)::

    RlmonCallback.attach(trainer, run="grpo-7b")     # trainer.add_callback + the GRPO hooks

What TRL logs (``trl/trainer/grpo_trainer.py``, TRL 1.16): ``_compute_loss`` reduces ``kl``,
``entropy`` and the ``clip_ratio/*_mean`` keys of every micro-batch to a global (sum, count) with
``accelerator.reduce`` and appends the quotient; ``log`` then averages the list over the logging
window. With gradient accumulation (or several iterations per generation) that is a mean of
micro-batch means, not the token mean of the step. Bound to the trainer, rlmon keeps the (sum,
count) pairs that ``accelerator.reduce`` returned inside ``_compute_loss`` and pools them once,
so ``actor/kl``, ``actor/entropy`` and ``actor/clip_ratio`` are the step's token means. It also
takes the gathered rewards from ``_calculate_rewards`` (mean, population std, min and max of the
step's completions) and the per-batch maxima of the completion lengths before ``log`` averages
them; from the same hook, the worst samples: the completions of highest and lowest reward
(``rollout/reward_highest``, ``rollout/reward_lowest``, ranked on the rewards' device) and the
longest truncated ones (``rollout/truncated_longest``), with their prompt and completion text
only when ``sample_text`` asks for it (opt-in; a function ``(prompt, completion) -> str`` may
shape or redact it). Keys it cannot make exact go under ``trl/<key>``
(``rlmon/service/metrics/keymaps.py``). A callback added without the trainer
(``trainer.add_callback(RlmonCallback(run=...))``) relays only, and the lossy keys then go under
``trl/<key>`` too.

Only the main process reports; the values are already global, so the reporter's world is one
rank. ``transformers`` is imported only when the callback class is first used.

The stop switch (``rlmon.service.contract.stop_decision``): when the service asks the run to stop
(``Reporter.should_stop()``), the callback sets ``control.should_training_stop``, and the trainer
ends after the current step the way it does at ``max_steps`` (``on_train_end`` runs, the last step
is reported). In one process it looks at the end of every step. With several processes every rank
must stop at the same step (a rank that stops alone leaves the others waiting in a collective), so
the main process's answer is broadcast to all ranks at each logging step (``on_log``, which every
rank calls right after the trainer's own gather of the loss); that needs the callback bound to the
trainer (``RlmonCallback.attach``). ``stopped`` holds the step and the reason once it stopped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from rlmon.actors.integrations._base import (
    ReporterLike,
    end_training,
    env_reporter,
    framework_version,
    lazy_class,
    plan_steps,
    relay,
    send_run_info,
)
from rlmon.service.metrics import catalog

__all__ = ["attach", "callback"]  # and RlmonCallback, built lazily by __getattr__

FRAMEWORK = "trl"
log = logging.getLogger("rlmon.trl")

# The keys whose value ``_compute_loss`` computes with its ``global_masked_mean`` (one
# ``accelerator.reduce`` of a stacked (sum, count) each), in the order it computes them.
_LOSS_KEYS = ("kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
              "clip_ratio/region_mean", "cispo_clip_ratio", "vespo/phi_seq_mean")
# ... and those rlmon publishes exactly, pooled over the step's micro-batches.
POOLED = {"kl": catalog.KL, "entropy": catalog.ENTROPY,
          "clip_ratio/region_mean": catalog.CLIP_RATIO}
# Per-batch maxima that TRL averages over the logging window; rlmon takes their max.
MAXIMA = {"completions/max_length": catalog.RESPONSE_LENGTH_MAX}


class _Hooks:
    """What the GRPOTrainer hooks collected since the last training log (main process only)."""

    def __init__(self) -> None:
        self.loss: dict[str, list[Any]] = {}  # key -> per-micro-batch (sum, count) tensors
        self.unmatched: set[str] = set()  # keys whose tensors could not be told apart
        self.rewards: list[Any] = []  # per generation batch: the gathered rewards (NaN-aware)
        # per generation batch: this process's (prompts, completions, completion lengths)
        self.texts: list[tuple[list[Any], list[Any], list[int]]] = []


def _as_text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list):  # conversational: the messages' contents
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in x)
    return str(x)


def _prompt_and_completion(prompt: Any, completion: Any) -> str:
    """A sample's text: the completion, then the end of its prompt (the payload is cut at 2 kB,
    and the completion is what went wrong)."""
    return f"completion: {_as_text(completion)}\nprompt: ...{_as_text(prompt)[-300:]}"


def _tolist(tensors: list[Any], cat: bool = False) -> list[Any]:
    """One device-to-host copy for a list of tensors of one device."""
    import torch

    return (torch.cat(tensors) if cat else torch.stack(tensors)).tolist()


class _Relay:
    """The framework-free part of the callback."""

    def __init__(self, run: str, *, reporter: ReporterLike | None = None,
                 role: str = "trainer", algorithm: str | None = None, samples_k: int = 8,
                 sample_text: bool | Callable[[Any, Any], str] = False,
                 **reporter_kw: Any) -> None:
        self.run, self.role, self.algorithm = run, role, algorithm
        self.samples_k = samples_k
        self.sample_text = _prompt_and_completion if sample_text is True else (
            sample_text or None)
        self.run_info: dict[str, Any] | None = None
        self._reporter = reporter
        # Only the main process reports, and what it reports is global: a world of one rank.
        reporter_kw.setdefault("rank", {})
        reporter_kw.setdefault("world", {})
        self._kw = reporter_kw
        self.published: dict[str, str] = {}
        self.trainer: Any = None
        self.hooks: set[str] = set()  # the trainer methods hooked ("loss", "rewards")
        self._collected = _Hooks()
        self._open_step: int | None = None  # recorded into, not ended yet
        self.stopped: tuple[int, str] | None = None  # (step, why) once the service stopped it
        self._said_unbound = False
        self.fallbacks = 0  # windows where a hooked key had to be relayed as logged

    @classmethod
    def attach(cls, trainer: Any, run: str, **kw: Any) -> Any:
        """``trainer.add_callback`` with a callback bound to ``trainer``; returns the callback."""
        cb = cls(run, **kw)
        cb.bind(trainer)
        trainer.add_callback(cb)
        return cb

    @property
    def reporter(self) -> ReporterLike:
        if self._reporter is None:
            # RLMON_SINK_JSONL=path writes contract lines instead (offline, `rlmon replay`)
            self._reporter = env_reporter(self.run, self.role, **self._kw)
        return self._reporter

    # -- the GRPOTrainer hooks ------------------------------------------------------------------

    def bind(self, trainer: Any) -> None:
        """Hook ``trainer._compute_loss`` and ``trainer._calculate_rewards`` (GRPOTrainer and its
        subclasses) on this instance; other trainers are only relayed."""
        self.trainer = trainer
        if all(hasattr(trainer, a) for a in ("_compute_loss", "_metrics", "accelerator")):
            self._hook_loss(trainer)
            self.hooks.add("loss")
        if hasattr(trainer, "_calculate_rewards") and hasattr(trainer, "reward_weights"):
            self._hook_rewards(trainer)
            self.hooks.add("rewards")

    def _collecting(self, trainer: Any) -> bool:
        model = getattr(trainer, "model", None)
        return bool(getattr(model, "training", False)) and bool(
            getattr(trainer.accelerator, "is_main_process", True))

    def _hook_loss(self, trainer: Any) -> None:
        compute = trainer._compute_loss
        accelerator = trainer.accelerator

        def _compute_loss(model: Any, inputs: Any) -> Any:
            if not self._collecting(trainer):
                return compute(model, inputs)
            metrics = trainer._metrics["train"]
            before = {k: len(metrics[k]) if k in metrics else 0 for k in _LOSS_KEYS}
            totals: list[Any] = []
            reduce = accelerator.reduce
            had = "reduce" in vars(accelerator)

            def capture(tensor: Any, *args: Any, **kw: Any) -> Any:
                out = reduce(tensor, *args, **kw)
                if tuple(getattr(out, "shape", ())) == (2,):
                    totals.append(out.detach())
                return out

            accelerator.reduce = capture
            try:
                loss = compute(model, inputs)
            finally:
                if had:
                    accelerator.reduce = reduce
                else:
                    del accelerator.reduce
            collected = self._collected
            grown = [k for k in _LOSS_KEYS if k in metrics and len(metrics[k]) > before[k]]
            # global_masked_mean's reduces are the last ones of _compute_loss, in _LOSS_KEYS
            # order (the adaptive-entropy controller's, if any, comes before them).
            if len(totals) < len(grown) or any(len(metrics[k]) != before[k] + 1 for k in grown):
                collected.unmatched.update(k for k in grown if k in POOLED)
                return loss
            for key, pair in zip(grown, totals[len(totals) - len(grown):], strict=True):
                if key in POOLED:
                    collected.loss.setdefault(key, []).append(pair)
            return loss

        trainer._compute_loss = _compute_loss

    def _hook_rewards(self, trainer: Any) -> None:
        calculate = trainer._calculate_rewards

        def _calculate_rewards(*args: Any, **kw: Any) -> Any:
            per_func = calculate(*args, **kw)  # gathered over processes: the whole batch
            if self._collecting(trainer):
                # The reward TRL logs: the weighted sum over functions, NaN where every function
                # returned None (grpo_trainer.py, after the advantages).
                weights = trainer.reward_weights.to(per_func.device).unsqueeze(0)
                rewards = (per_func * weights).nansum(dim=1)
                rewards = rewards.masked_fill(per_func.isnan().all(dim=1), float("nan"))
                self._collected.rewards.append(rewards.detach())
                prompts, completions, ids = (list(args[1:4]) + [kw.get(k) for k in (
                    "prompts", "completions", "completion_ids_list")][len(args[1:4]):])
                self._collected.texts.append((list(prompts or ()), list(completions or ()),
                                              [len(c) for c in ids or ()]))
            return per_func

        trainer._calculate_rewards = _calculate_rewards

    def _exact(self, logs: Mapping[str, Any]) -> dict[str, str]:
        """Record the hooked values of the closing window; returns {TRL key it replaces: the
        name published instead}."""
        got, self._collected = self._collected, _Hooks()
        done: dict[str, str] = {}
        rep = self.reporter
        if "loss" in self.hooks:
            metrics = self.trainer._metrics.get("train", {})
            keys = [k for k in POOLED if got.loss.get(k) and k not in got.unmatched]
            flat = _tolist([p for k in keys for p in got.loss[k]]) if keys else []
            at = 0
            for key in keys:
                pairs, at = flat[at:at + len(got.loss[key])], at + len(got.loss[key])
                if self._matches(pairs, list(metrics.get(key, ()))):
                    rep.record(POOLED[key], sum=math.fsum(s for s, _ in pairs),
                               count=math.fsum(c for _, c in pairs))
                    done[key] = POOLED[key]
            for key, name in MAXIMA.items():
                values = [v for v in metrics.get(key, ()) if not math.isnan(v)]
                if values:
                    rep.record(name, max=max(values))
                    done[key] = name
        if got.rewards:
            sizes = [int(t.numel()) for t in got.rewards]  # completions per generation batch
            rep.record(catalog.SAMPLES, sum=float(sum(sizes)))
            done["(not logged) samples"] = catalog.SAMPLES
            means = list(self.trainer._metrics.get("train", {}).get(
                "completions/mean_length", ())) if "loss" in self.hooks else []
            if len(means) == len(sizes):  # TRL's mean over each gathered batch, undone
                rep.record(catalog.TOKENS, sum=float(sum(
                    round(m * n) for m, n in zip(means, sizes, strict=True))))
                done["(not logged) tokens"] = catalog.TOKENS
            self._record_samples(got)
            values = [v for v in _tolist(got.rewards, cat=True) if not math.isnan(v)]
            if values:
                s, q = math.fsum(values), math.fsum(v * v for v in values)
                rep.record(catalog.REWARD, sum=s, count=len(values))
                rep.record(catalog.REWARD_STD, count=len(values), sum=s, sqsum=q)
                rep.record(catalog.REWARD_MIN, min=min(values))
                rep.record(catalog.REWARD_MAX, max=max(values))
                done.update(reward=catalog.REWARD, reward_std=catalog.REWARD_STD)
        missed = [k for k in (*POOLED, "reward", "reward_std") if k in logs and k not in done]
        if missed and self.hooks:
            self.fallbacks += 1
            log.warning("rlmon: no exact values for %s this step; relayed as trl/<key>", missed)
        return done

    def _record_samples(self, got: _Hooks) -> None:
        """The window's worst samples: rewards ranked on their device (NaN: no reward, never
        ranked), truncated completions by length; text asked for the selected few only."""
        import numpy as np

        rep, k = self.reporter, self.samples_k
        limit = getattr(self.trainer, "max_completion_length", None)
        for rewards, (prompts, completions, lengths) in zip(got.rewards, got.texts, strict=True):
            payload = self._payload(prompts, completions)
            # the gathered rewards start with the main process's own completions
            for name in (catalog.REWARD_LOWEST, catalog.REWARD_HIGHEST):
                rep.record_sample_tensor(name, rewards, rewards == rewards, k=k, payload=payload)
            if limit and lengths:
                sizes = np.array(lengths, dtype=np.float64)
                rep.record_sample_tensor(catalog.TRUNCATED_LONGEST, sizes, sizes >= limit, k=k,
                                         payload=payload)

    def _payload(self, prompts: list[Any], completions: list[Any],
                 ) -> Callable[[int], str] | None:
        text = self.sample_text
        if text is None:
            return None
        return lambda i: text(prompts[i], completions[i]) if i < len(completions) else ""

    @staticmethod
    def _matches(pairs: list[list[float]], logged: list[float]) -> bool:
        """The pairs are TRL's: each quotient, in float32 as TRL divides, is the logged value."""
        import numpy as np

        if len(pairs) != len(logged):
            return False
        for (s, c), value in zip(pairs, logged, strict=True):
            quotient = np.float32(s) / np.maximum(np.float32(c), np.float32(1.0))
            if float(quotient) != value and not (math.isnan(value) and math.isnan(quotient)):
                return False
        return True

    # -- TrainerCallback events ----------------------------------------------------------------

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> None:
        if self.trainer is not None and self._processes(args) > 1:
            self._agree_on_stop(state, control)
        if not logs or not getattr(state, "is_world_process_zero", True):
            return
        if self.run_info is None:
            self.run_info = self._send_run_info(args)
        step = int(state.global_step)
        if self._open_step is not None and step != self._open_step:
            self._end_open_step()
        training = self.trainer is None or bool(getattr(self.trainer.model, "training", True))
        replaced = self._exact(logs) if self.trainer is not None and training else {}
        rest = {k: v for k, v in logs.items() if k not in replaced}
        self.published.update(relay(self.reporter, FRAMEWORK, rest))
        self.published.update(replaced)
        # Eval and the end-of-training summary log at the same step: the step ends when the
        # next one begins (or at on_train_end), so they join it instead of arriving late.
        self._open_step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_open_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._stop_requested():
            return
        if self._processes(args) == 1:
            self._stop(state, control)
        elif self.trainer is None and not self._said_unbound:
            self._said_unbound = True
            log.warning("rlmon: the service asks this run to stop, but a callback not bound to "
                        "the trainer cannot stop every rank at the same step; bind it with "
                        "RlmonCallback.attach(trainer, ...) to honour the stop switch")

    # -- the stop switch -----------------------------------------------------------------------

    def _processes(self, args: Any) -> int:
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is not None:
            return int(getattr(accelerator, "num_processes", 1) or 1)
        try:  # TrainingArguments.world_size needs torch and a backend to answer
            return int(getattr(args, "world_size", 1) or 1)
        except Exception:
            return 1

    def _stop_requested(self) -> bool:
        """The main process's Reporter's answer, read without waiting (other processes have no
        Reporter, and none is made here)."""
        check = getattr(self._reporter, "should_stop", None)
        return bool(check()) if callable(check) else False

    def _agree_on_stop(self, state: Any, control: Any) -> None:
        """Every rank learns the main process's answer (one broadcast of one number)."""
        import torch
        from accelerate.utils import broadcast

        accelerator = self.trainer.accelerator
        wanted = accelerator.is_main_process and self._stop_requested()
        flag = torch.tensor([int(wanted)], device=accelerator.device)
        if int(broadcast(flag, from_process=0).item()):
            self._stop(state, control)

    def _stop(self, state: Any, control: Any) -> None:
        control.should_training_stop = True
        if self.stopped is None:
            decision = getattr(self._reporter, "stop_decision", None)
            why = getattr(decision, "reason", "") or "the service asked the run to stop"
            self.stopped = (int(state.global_step), why)
            log.warning("rlmon: stopping training after step %d: %s", state.global_step, why)

    def _end_open_step(self) -> None:
        if self._open_step is not None:
            step, self._open_step = self._open_step, None
            self.reporter.end_step(step)

    def _send_run_info(self, args: Any) -> dict[str, Any]:
        """Run metadata from the trainer's args (GRPOConfig's ``loss_type`` is the reduction)."""

        def integer(name: str) -> int | None:
            try:  # TrainingArguments properties (world_size) need torch and a backend to answer
                value = getattr(args, name, None)
            except Exception:
                return None
            return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

        loss_type = getattr(args, "loss_type", None)
        algorithm = self.algorithm
        if algorithm is None and self.trainer is not None and "loss" in self.hooks:
            algorithm = "grpo"
        return send_run_info(
            self.reporter, framework=FRAMEWORK, framework_version=framework_version(FRAMEWORK),
            algorithm=algorithm, dpo=(algorithm or "").lower() == "dpo" or None,
            loss_reduction=loss_type if isinstance(loss_type, str) else None,
            grad_accumulation=integer("gradient_accumulation_steps"), dp=integer("world_size"),
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the planned steps (TRL computes max_steps from the data and epochs before this)
        if getattr(state, "is_world_process_zero", True):
            plan_steps(self.reporter, getattr(state, "max_steps", None))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """TRL's end of training: the last step ends and the Reporter closes (the rank ends
        cleanly)."""
        if getattr(state, "is_world_process_zero", True):
            self._end_open_step()
        if self._reporter is not None:
            end_training(self._reporter)


def _build() -> type:
    from transformers import TrainerCallback

    class RlmonCallback(_Relay, TrainerCallback):
        """``RlmonCallback.attach(trainer, run="grpo-7b")``, or, relaying only,
        ``trainer.add_callback(RlmonCallback(run="grpo-7b"))``."""

    return RlmonCallback


__getattr__ = lazy_class(__name__, "RlmonCallback", _build)


def callback(run: str, **kw: Any) -> Any:
    """An :class:`RlmonCallback` instance (imports transformers); relays only until bound."""
    cls: Any = __getattr__("RlmonCallback")
    return cls(run, **kw)


def attach(trainer: Any, run: str, **kw: Any) -> Any:
    """``RlmonCallback.attach(trainer, run=...)``: add a callback bound to the trainer."""
    cls: Any = __getattr__("RlmonCallback")
    return cls.attach(trainer, run, **kw)
