"""The Reporter the training thread calls: record sufficient statistics, close steps, never wait.

The training thread only accumulates numbers in a dict (:mod:`~rlmon.actors.reporter.accumulator`)
and, at ``end_step``, hands the closed step to the sender thread, which packs it into one
:class:`~rlmon.service.contract.step_message.StepMessage` (:mod:`~rlmon.actors.reporter.packer`)
and delivers it (:mod:`~rlmon.actors.reporter.delivery`): kept in a bounded buffer until the
aggregator acknowledges it, so an aggregator that is slow, restarting or gone costs nothing but
memory up to that bound; beyond it the oldest messages are dropped and counted. Nothing here is
a torch.distributed collective.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from rlmon.actors.reporter import outcome
from rlmon.actors.reporter.accumulator import (
    MEAN,
    PY_NUMBER,
    Accumulator,
    RawSpan,
    RawStep,
    RawTimeline,
    Replicated,
    add_numbers,
    add_partial,
    add_samples,
    check_count,
    check_step,
    ranked_state,
    replicated_axes,
)
from rlmon.actors.reporter.actor_end import register_shutdown
from rlmon.actors.reporter.delivery import Delivery
from rlmon.actors.reporter.detect import coerce_rank, coerce_world, detect_layout
from rlmon.actors.reporter.hardware import HardwareSampler, visible_gpus
from rlmon.actors.reporter.packer import Origin, StepPacker
from rlmon.actors.reporter.sample_capture import (
    DevicePick,
    Labels,
    Score,
    build_items,
    check_k,
    pick_array,
    pick_tensor,
)
from rlmon.actors.reporter.sink import ReportSink, default_sink, track_sender
from rlmon.actors.reporter.tally import Tally
from rlmon.actors.reporter.tensor_stats import (
    MAX_HELD_ELEMENTS,
    TORCH_TYPES,
    HeldTensors,
    Reduce,
    StepTensors,
    TensorStat,
    check_reduce,
    is_torch,
    reduce_array,
)
from rlmon.service.contract.heartbeat import Heartbeat, OpenSpan, Outcome, OutcomeKind, RankBeat
from rlmon.service.contract.records import check_metric_name, check_role, check_run
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.contract.timeline import MAX_SPANS
from rlmon.service.metrics import catalog
from rlmon.service.metrics.forms import FORMS, form_of_keys, forms_text
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form

__all__ = ["Reporter"]


class _StepClock:
    """The step's timeline as the training thread keeps it: when the step began, its closed
    spans (at most MAX_SPANS; the others counted as cut) and how many are open now."""

    __slots__ = ("cut", "depth", "spans", "start_ns")

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.spans: list[RawSpan] = []
        self.cut = 0
        self.depth = 0

    def close(self, now_ns: int) -> RawTimeline:
        """The closed step's timeline; the next step begins now."""
        timeline = (self.start_ns, now_ns, self.spans, self.cut)
        self.start_ns, self.spans, self.cut = now_ns, [], 0
        return timeline


class _TensorNames:
    """record_tensor's checked statistics: each name's latest plain one (kept across steps),
    this step's by name, and this step's forms by accumulator key."""

    __slots__ = ("forms", "stats", "step")

    def __init__(self) -> None:
        self.stats: dict[str, TensorStat] = {}
        self.step: dict[str, TensorStat] = {}
        self.forms: dict[Any, Form] = {}


class _Captures:
    """This step's record_sample_tensor captures, and the sequences seen per sample metric."""

    __slots__ = ("picks", "sequences")

    def __init__(self) -> None:
        self.picks: list[DevicePick] = []
        self.sequences: dict[str, int] = {}


class Reporter:
    """Records one rank's metrics and sends them to the aggregator, one message per step.

    ``sink`` defaults to the namespace's aggregator on Ray; with ``start_service`` a Reporter that
    finds none starts the aggregator and the service on the embedded defaults (or ``runtime``, a
    :class:`~rlmon.actors.runtime.RuntimeOptions`).
    """

    def __init__(
        self,
        run: str,
        role: str,
        *,
        rank: Rank | Mapping[str, int] | None = None,
        world: World | Mapping[str, int] | None = None,
        namespace: str = "rlmon",
        sink: ReportSink | None = None,
        start_service: bool = True,
        max_pending: int = 1024,
        max_batch: int = 64,
        step_seconds: bool = True,
        hardware_interval: float | None = 1.0,
        runtime: Any = None,
        redact: Callable[[str], str] | None = None,
        heartbeat_seconds: float | None = None,
        gpus_per_rank: float | None = None,
        total_steps: int | None = None,
    ) -> None:
        detected = detect_layout() if rank is None or world is None else None
        self.rank = coerce_rank(rank) if rank is not None else detected[0]  # type: ignore[index]
        self.world = coerce_world(world) if world is not None else detected[1]  # type: ignore[index]
        if not self.world.contains(self.rank):
            raise ValueError(f"rank {self.rank.as_dict()} lies outside world {self.world.as_dict()}")
        self.run, self.role = check_run(run), check_role(role)
        if sink is None:
            sink = default_sink(namespace, start_service=start_service, options=runtime)
        self.step_seconds = step_seconds
        # Sample payloads: every one passes `redact` (the privacy hook) before it is cut to
        # MAX_PAYLOAD_BYTES; the cut ones are counted in payloads_cut.
        self.redact = redact
        self.transfers = 0  # device-to-host copies made for tensor statistics
        self._tally = Tally(self.run, self.role)
        self._names: set[str] = set()  # metric names already validated
        self._acc: Accumulator = {}  # this step's partials
        self._batches: list[Mapping[str, Any]] = []  # this step's record_many mappings
        self._tensors = HeldTensors()
        self._tensor_names = _TensorNames()
        self._captures = _Captures()
        self._clock = _StepClock(time.perf_counter_ns())
        # Liveness (docs/liveness.md): the spans open now (name, perf ns at entry) and the last
        # step ended, written by the training thread and read by the sender thread's heartbeat
        self._open_spans: list[tuple[str, int]] = []
        self._last_step: int | None = None
        self._wall0, self._perf0 = time.time(), time.perf_counter_ns()
        # How the process ends, said in the closing heartbeat (rlmon.actors.reporter.outcome):
        # the hooks are chained once per process; the training thread is the one that ends
        # steps (an uncaught exception there ends this rank even when another thread closes)
        outcome.install()
        self._training_thread: int | None = threading.get_ident()
        self._outcome: Outcome | None = None
        self._raised_spans: outcome.Spans | None = None  # where the failure that ends it was
        self._exit_spans: outcome.Spans | None = None  # the spans a SystemExit or ^C left
        # an exception a method of this rank's actor raised (rlmon.actors.reporter.actor_end),
        # said in every heartbeat until the next step ends, with the spans open where it was
        self._raised: tuple[Outcome, outcome.Spans] | None = None
        # the steps the run plans: once its last ended, a final save is not a stall
        self.total_steps: int | None = None
        if total_steps is not None:
            self.set_total_steps(total_steps)
        # the GPUs this rank holds (goodput, the cost of alerts and stalls): as given, else as
        # its launcher says (hardware.visible_gpus), else 1
        self.gpus_per_rank = float(gpus_per_rank if gpus_per_rank is not None
                                   else visible_gpus() or 1)
        if heartbeat_seconds is None:
            from rlmon.service.config import ReporterSettings

            heartbeat_seconds = ReporterSettings().heartbeat_seconds  # None: the service's
        # device memory, GPU utilisation and power, host RSS and CPU: sampled on a thread of
        # their own, added to each step by the packer (None: not sampled)
        self._hardware = HardwareSampler(hardware_interval) if hardware_interval else None
        self._packer = StepPacker(Origin(self.run, self.role, self.rank, self.world),
                                  self._tally, redact=redact, hardware=self._hardware)
        self._delivery: Delivery[RawStep] = Delivery(
            sink, self._packer, self._tally, run=self.run, role=self.role,
            started=time.time(),  # tells a rerun of the run from a late resend
            max_pending=max_pending, max_batch=max_batch,
            heartbeat=self._heartbeat if heartbeat_seconds != 0 else None,
            heartbeat_s=heartbeat_seconds)
        track_sender(self)
        # in a Ray actor: closed when Ray ends the actor gracefully (``__ray_shutdown__``)
        register_shutdown(self.close)

    def set_total_steps(self, total_steps: int) -> None:
        """The number of steps the run plans (the framework's ``max_steps``): once its last
        step ended, the run is ending, and a save, an evaluation or an upload after it is not
        paged as a stall (docs/liveness.md). Said with every heartbeat."""
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
        self.total_steps = total_steps

    def note_raised(self, exc: BaseException, wait: float = 0.0) -> None:
        """A method of this rank's actor raised ``exc`` (rlmon's method wrapper calls this): say
        it in a heartbeat now, waiting up to ``wait`` seconds for it to leave, and in every
        heartbeat until the next step ends. The rank is not closed: its driver may go on."""
        said = outcome.describe(exc)
        if said is None or self._delivery.closed:
            return
        spans = outcome.raised_in(exc).get(id(self)) or tuple(self._open_spans)
        self._raised = (said, spans)
        self._delivery.beat_now(wait)

    # -- what the other parts count, read on the training thread ------------------------------

    @property
    def sink(self) -> ReportSink:
        """Where the step messages go."""
        return self._delivery.sink

    @sink.setter
    def sink(self, sink: ReportSink) -> None:
        self._delivery.sink = sink

    @property
    def max_pending(self) -> int:
        """The bound on steps held unacknowledged; beyond it the oldest are dropped."""
        return self._delivery.max_pending

    @property
    def max_batch(self) -> int:
        """The most messages sent in one call to the sink."""
        return self._delivery.max_batch

    @property
    def dropped(self) -> int:
        """Step messages given up on: beyond ``max_pending``, unpackable, unsent at close."""
        return self._delivery.dropped

    @property
    def sent(self) -> int:
        """Step messages the sink accepted (resends included)."""
        return self._delivery.sent

    @property
    def resent(self) -> int:
        """Acknowledged messages of open steps sent again to a restarted aggregator."""
        return self._delivery.resent

    @property
    def refused_messages(self) -> int:
        """Step messages the aggregator refused (its reason: ``last_error``)."""
        return self._delivery.refused_messages

    @property
    def rejected(self) -> int:
        """Statistics refused after recording (see record_tensor, record_many)."""
        return self._tally.rejected

    @property
    def payloads_cut(self) -> int:
        """Sample payloads cut to MAX_PAYLOAD_BYTES."""
        return self._tally.payloads_cut

    @property
    def last_error(self) -> str | None:
        """The latest refusal or failure, for a human."""
        return self._tally.last_error

    @property
    def stop_decision(self) -> StopDecision | None:
        """The service's latest stop decision for this run
        (:mod:`rlmon.service.contract.stop_decision`), from an acknowledgement."""
        return self._delivery.stop_decision

    @property
    def pending(self) -> int:
        """Steps not yet acknowledged by the aggregator."""
        return self._delivery.pending

    # -- recording (training thread) ----------------------------------------------------------

    def record(
        self,
        name: str,
        *,
        sum: float | None = None,
        count: float | None = None,
        min: float | None = None,
        max: float | None = None,
        sqsum: float | None = None,
        value: float | None = None,
        replicated: Replicated = None,
        minibatch_reduce: Literal["mean"] | None = None,
        minibatch: int = 0,
    ) -> None:
        """Accumulate one partial; repeated calls in a step (micro-batches) merge here.

        Numbers are taken as given and converted to float off the training thread.
        """
        if count is not None and sum is not None and sqsum is None and replicated is None \
                and minibatch_reduce is None:
            # The common case, inlined: a token/sample-weighted mean.
            if count.__class__ in PY_NUMBER and not 0 <= count < math.inf:
                check_count(name, count)
            entry = self._acc.get(name)
            if entry is None:
                if name not in self._names:
                    check_metric_name(name)
                    self._names.add(name)
                self._acc[name] = [MEAN, (sum, count), None, False, 0]
                return
            if entry[0] is MEAN:
                old = entry[1]
                entry[1] = (old[0] + sum, old[1] + count)
                return
        if name not in self._names:
            check_metric_name(name)
            self._names.add(name)
        given = {key: v for key, v in (("sum", sum), ("count", count), ("min", min),
                                        ("max", max), ("sqsum", sqsum), ("value", value))
                 if v is not None}
        form = form_of_keys(frozenset(given))
        if form is None:
            raise ValueError(f"{name}: give one statistic form ({forms_text()}), "
                             f"got {', '.join(given) or 'none'}")
        if count is not None:
            check_count(name, count)
        state = FORMS[form].state(given)
        self._add(name, form, state, replicated, minibatch_reduce, minibatch)

    def _add(
        self, name: str, form: Form, state: tuple[Any, ...], replicated: Replicated,
        minibatch_reduce: str | None, minibatch: int,
    ) -> None:
        """Merge one partial into this step's accumulator."""
        add_partial(self._acc, name, form, state, replicated, minibatch_reduce, minibatch)

    def record_tensor(
        self,
        name: str,
        values: Any,
        mask: Any = None,
        *,
        reduce: Reduce = "token_mean",
        replicated: Replicated = None,
        minibatch_reduce: Literal["mean"] | None = None,
        minibatch: int = 0,
    ) -> None:
        """A masked statistic of a torch tensor or numpy array, computed on its device.

        ``reduce``: ``token_mean`` (sum and count of the masked entries), ``seq_mean`` (per
        sequence, the last axis, then pooled over sequences with a token), ``sum``, ``min``,
        ``max``, ``sqsum`` or ``std``; sums accumulate in float64 whatever the dtype.

        A torch tensor costs no kernel launch here: the Reporter holds a reference (detached
        when it requires grad) until the next fold, ``end_micro_batch``, ``end_step`` or
        :data:`~rlmon.actors.reporter.tensor_stats.MAX_HELD_ELEMENTS` held elements, which reduces the
        tensors sharing a mask together in a few launches and releases them. The tensor and its
        mask are read then, not now: do not modify them in place before the fold (call
        ``end_micro_batch`` before reusing a buffer). One modified in between is detected by
        its version counter; its statistic is refused, counted in ``rejected`` and named in
        ``last_error``, never sent wrong. numpy arrays are reduced at once, on the host.
        """
        stat = self._tensor_names.step.get(name)
        if stat is None or stat.reduce != reduce or values.__class__ not in TORCH_TYPES \
                or replicated is not None or minibatch_reduce is not None:
            stat = self._tensor_stat(name, values, mask, reduce, replicated, minibatch_reduce,
                                     minibatch)
            if stat is None:  # a numpy array: reduced at once
                return
        if self._tensors.hold(stat, values, mask) > MAX_HELD_ELEMENTS:
            self.end_micro_batch()

    def _tensor_stat(self, name: str, values: Any, mask: Any, reduce: str, replicated: Replicated,
                     minibatch_reduce: str | None, minibatch: int) -> TensorStat | None:
        """record_tensor's checks, on a name's first call in a step (or a replicated or
        per-mini-batch statistic): the statistic to hold, or None when already reduced."""
        names = self._tensor_names
        if replicated is None and minibatch_reduce is None:
            # A name recorded in an earlier step: checked then; only the form may conflict.
            stat = names.stats.get(name)
            if stat is not None and stat.reduce == reduce and values.__class__ in TORCH_TYPES:
                known = names.forms.get(name)
                if known is None:
                    entry = self._acc.get(name)
                    known = names.forms[name] = stat.form if entry is None else entry[0]
                if known is stat.form:
                    names.step[name] = stat
                    return stat
        form = check_reduce(reduce)
        if name not in self._names:
            check_metric_name(name)
            self._names.add(name)
        if minibatch_reduce is not None and minibatch_reduce != "mean":
            raise ValueError(f'{name}: minibatch_reduce must be "mean" or None')
        if replicated is not None:
            replicated_axes(replicated)  # an unknown axis raises here, not on the sender thread
        key = (name, minibatch) if minibatch_reduce == "mean" else name
        known = names.forms.get(key)
        if known is None:
            entry = self._acc.get(key)
            known = names.forms[key] = form if entry is None else entry[0]
        if known is not form:
            raise ValueError(f"{name}: recorded as {known.value!r} and now as {form.value!r}")
        if not is_torch(values):
            numbers = reduce_array(values, mask, reduce)
            add_numbers(self._acc, name, form, numbers, replicated, minibatch_reduce,
                        minibatch)
            return None
        if replicated is not None or minibatch_reduce is not None:
            return TensorStat(name, form, reduce, replicated, minibatch_reduce, minibatch)
        stat = names.stats.get(name)
        if stat is None or stat.reduce != reduce:
            stat = names.stats[name] = TensorStat(name, form, reduce)
        names.step[name] = stat
        return stat

    def end_micro_batch(self) -> None:
        """Reduce the tensors recorded since the last fold now and release them.

        Optional: ``end_step`` folds too. Call it when the recorded tensors' memory should be
        freed, or before their buffers are reused. Launches a few kernels per shared mask, no
        device-to-host copy.
        """
        refused = self._tensors.fold()
        if refused:
            self._tally.refuse(refused, "modified in place after record_tensor, before it was reduced")

    def record_many(self, metrics: Mapping[str, Any]) -> None:
        """Record many metrics in one call: ``{name: statistic}``; the cheap path for scalars.

        A statistic is a ``(sum, count)`` pair (a weighted mean), a mapping of one form's keys
        (``{"max": x}``, ``{"count": n, "sum": s, "sqsum": q}``, ...), or a bare number: an
        already-reduced value in the form the catalog gives the name (``value`` for a name the
        catalog does not hold). Names are checked here; the mapping is copied and everything
        else happens on the sender thread, so a statistic that turns out malformed there (wrong
        keys, a bad count, another form than the name has this step) is refused, counted in
        ``rejected`` and named in ``last_error``, and the rest of the step is sent. Partials that
        are replicated or reduced per mini-batch go through :meth:`record`.
        """
        names = self._names
        if not names.issuperset(metrics):
            for name in metrics:
                if name not in names:
                    check_metric_name(name)
                    names.add(name)
        self._batches.append(dict(metrics))

    @contextlib.contextmanager
    def span(self, name: str, **attrs: Any) -> Iterator[None]:
        """Time a phase of the step: its start and end go into the step's timeline (nested in
        the spans open around it, with ``attrs``: a few numbers or short texts), and its
        duration into ``timing/<name>_seconds`` (the slowest rank's time, max form).

        A step keeps at most :data:`~rlmon.service.contract.timeline.MAX_SPANS` spans; more are counted
        as cut. The training thread only reads the clock twice and appends a tuple; the spans
        travel in the step message, converted on the sender thread.
        """
        clock = self._clock
        depth = clock.depth
        clock.depth = depth + 1
        start = time.perf_counter_ns()
        opened = self._open_spans
        opened.append((name, start))  # the heartbeat says where this rank is, even if it hangs
        if self._last_step is None and depth == 0:
            self._delivery.stage_entered()  # before step 0 ends: heartbeats start here
        try:
            yield
        except GeneratorExit:
            raise
        except BaseException as exc:  # where it was raised, for the closing heartbeat
            outcome.mark_raised(exc, id(self), tuple(opened))
            if not isinstance(exc, Exception) and self._exit_spans is None:
                # SystemExit, KeyboardInterrupt: how a signal turned into an exit (Ray's SIGTERM
                # handler calls sys.exit) leaves the spans; the outcome is noted without it
                self._exit_spans = tuple(opened)
            raise
        finally:
            end = time.perf_counter_ns()
            del opened[depth:]
            clock.depth = depth
            if len(clock.spans) < MAX_SPANS:
                clock.spans.append((name, start, end, depth, attrs or None))
            else:
                clock.cut += 1
            add_partial(self._acc, f"timing/{name}_seconds", Form.MAX, ((end - start) * 1e-9,),
                        None, None, 0)

    # -- worst samples (ranked forms) ----------------------------------------------------------

    def _sample_form(self, name: str, largest: bool | None) -> Form:
        """TOP or BOTTOM: the catalog's for a canonical name (``largest`` must agree), else
        from ``largest`` (default: the highest scores)."""
        if name not in self._names:
            check_metric_name(name)
            self._names.add(name)
        spec = catalog.lookup(name)
        if spec is not None:
            form = spec.forms[0]
            if form not in (Form.TOP, Form.BOTTOM):
                raise ValueError(f"{name}: the catalog gives it form {form.value!r}, not a "
                                 "ranked form (top or bottom)")
            if largest is not None and largest != (form is Form.TOP):
                raise ValueError(f"{name}: the catalog ranks it by the "
                                 f"{'highest' if form is Form.TOP else 'lowest'} score")
            return form
        return Form.TOP if largest is None or largest else Form.BOTTOM

    def record_samples(self, name: str, items: Iterable[tuple[float, Any, str | None]], *,
                       k: int = 8, largest: bool | None = None) -> None:
        """Keep the ``k`` best of ``(score, id, payload)`` items (host numbers; payload None or
        "" for none) in a ranked metric: the highest scores, or the lowest with
        ``largest=False`` (a catalog name fixes which). Calls in a step merge; ids are unique
        per sample across ranks (the merge keeps one item per id). Payloads pass ``redact``
        and are cut to MAX_PAYLOAD_BYTES (counted in ``payloads_cut``).
        """
        form = self._sample_form(name, largest)
        state, cut = ranked_state(name, form, k, items, self.redact)
        self._tally.payloads_cut += cut
        self._add(name, form, state, None, None, 0)

    def record_sample_tensor(
        self,
        name: str,
        values: Any,
        mask: Any = None,
        *,
        score: Score = "mean",
        k: int = 8,
        largest: bool | None = None,
        ids: Labels = None,
        payload: Labels = None,
    ) -> None:
        """The ``k`` worst sequences of a batch by a score computed on the values' device.

        ``values`` holds one number per sequence (shape ``(B,)``; ``mask`` then says which
        sequences count) or per token (``(B, T)``, the last axis tokens; ``mask`` the tokens that
        count): ``score`` reduces each sequence's tokens (``mean``, ``max``, ``min``, ``sum``);
        a sequence without a token never ranks. ``largest``: the highest scores, or the lowest
        (a catalog name fixes which). Ranked on the device (one stable sort: a NaN score first,
        ties by sequence index); the scores and indices of the best ``k`` join the step's one
        device-to-host copy at ``end_step`` (no copy here).

        ``ids`` and ``payload`` (opt-in text: prompt and response, token ids, a dataset key)
        are a sequence indexed by sequence (a list, a tensor or an array) or a function of
        the index. They are asked only for the selected ``k``, after the copy, on the sender
        thread: keep what they read unchanged until the step is sent. Default ids
        ``dp<rank>/<n>``: the data-parallel rank and the sequence's place among those this
        rank recorded under ``name`` in the step. Payloads pass ``redact`` and are cut to
        MAX_PAYLOAD_BYTES (counted in ``payloads_cut``). numpy arrays are ranked at once, on
        the host, and ``ids``/``payload`` asked then.
        """
        form = self._sample_form(name, largest)
        check_k(name, k)
        top = form is Form.TOP
        captures = self._captures
        offset = captures.sequences.get(name, 0)
        rows = values.shape[0] if len(getattr(values, "shape", ())) == 1 else (
            math.prod(values.shape[:-1]) if getattr(values, "shape", ()) else 0)
        captures.sequences[name] = offset + rows
        prefix = f"dp{self.rank.dp}/"
        if not is_torch(values):
            picked = pick_array(values, mask, score, k, top, name)
            items, cut = build_items(picked, ids, payload, prefix, offset, self.redact)
            self._tally.payloads_cut += cut
            add_samples(self._acc, name, form, k, items)
            return
        piece, n = pick_tensor(values, mask, score, k, top, name)
        start = self._tensors.attach(piece.device, piece)
        captures.picks.append(DevicePick(name, form, k, piece.device, start, n, ids, payload,
                                      prefix, offset))

    # -- ending a step -------------------------------------------------------------------------

    def _fold_tensors(self) -> StepTensors | None:
        """Fold what is held and start the step's one copy per device (training thread)."""
        self.end_micro_batch()
        moving = self._tensors.transfer()
        if moving is not None:
            self.transfers += moving.transfers
        return moving

    def _heartbeat(self, closing: bool) -> Heartbeat:
        """This rank's heartbeat, built on the sender thread: its open spans (outermost first,
        each with the unix time it opened) and the last step it ended."""
        wall0, perf0 = self._wall0, self._perf0
        # a failed rank's closing heartbeat: the spans open where it failed, not those still
        # open once the exception unwound them
        raised = self._raised_spans if closing else None
        noted = self._raised
        if raised is None and noted is not None and not self._open_spans:
            raised = noted[1]  # where the method's exception was raised, until a new stage
        opened = raised if raised is not None else list(self._open_spans)
        spans = tuple(OpenSpan(name, wall0 + (at - perf0) * 1e-9) for name, at in opened)
        return Heartbeat(self.run, self.role, self.world,
                         (RankBeat(self.rank, spans, self._last_step),), time.time(), closing,
                         self.gpus_per_rank, self._outcome if closing else None,
                         outcome.process_id(), self.total_steps,
                         noted[0] if noted is not None and not closing else None)

    def end_step(self, step: int) -> None:
        """Close the step and hand it to the sender thread; returns at once.

        The training thread only folds held tensors (a few launches per shared mask), starts
        their one copy per device (non-blocking into pinned memory on CUDA) and swaps the
        accumulator; waiting for the copy, merging ``record_many`` batches and packing the
        message happen on the sender thread.
        """
        step = check_step(step)
        moving = self._fold_tensors() if self._tensors else None
        batches, self._batches = self._batches, []
        captures, self._captures = self._captures, _Captures()
        names = self._tensor_names
        names.forms.clear()
        names.step.clear()
        now = time.perf_counter_ns()
        clock = self._clock
        if self.step_seconds and catalog.STRAGGLER_SOURCE not in self._acc:
            self._acc[catalog.STRAGGLER_SOURCE] = [
                Form.MAX, ((now - clock.start_ns) * 1e-9,), None, False, 0]
        timeline = clock.close(now)
        acc, self._acc = self._acc, {}
        self._last_step = step
        self._exit_spans = None  # a SystemExit caught inside a span: the run went on
        self._raised = None  # a method raised and the run went on
        self._training_thread = threading.get_ident()
        outcome.step_ended()
        self._delivery.put(RawStep(step, acc, time.time(), moving, batches, captures.picks,
                                   timeline))

    # -- delivery and the service --------------------------------------------------------------

    def should_stop(self) -> bool:
        """Whether the service asked this run to stop (a rule with the stop action fired and
        the config lets it stop the run; see ``stop_decision`` for why). Answered from the last
        acknowledgement, never waiting: the decision arrives with the acks of the steps sent
        after it was taken, so a step or two after the alert's step."""
        return self._delivery.stop_decision is not None

    def set_run_info(self, **fields: Any) -> None:
        """Send the run's metadata (fields of :class:`~rlmon.service.contract.run_info.RunInfo`) to the
        service once, without waiting; an unknown field raises TypeError. No-op without a service.
        """
        from rlmon.actors.service_actor import send_to_service
        from rlmon.service.contract.run_info import RunInfo

        send_to_service(self.sink, "set_run_info", self.run, RunInfo.from_fields(fields))

    def finish_run(self) -> None:
        """Tell the service the run ended: its series leave the exporter after a short TTL."""
        from rlmon.actors.service_actor import send_to_service

        send_to_service(self.sink, "finish_run", self.run)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message was acknowledged; False if ``timeout`` passed first.

        With messages of still-open steps retained, it also waits for a fresh answer from the
        aggregator, so messages a restarted aggregator lost are resent before it returns True.
        """
        return self._delivery.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush for up to ``timeout`` seconds (default: the exit budget, ``RLMON_EXIT_TIMEOUT``,
        60 s: a short script's first connection to a busy Ray can take longer than a few seconds),
        then stop; what is still unsent counts as dropped. Closing twice is harmless.

        The closing heartbeat says how the process ends (docs/reporter.md): clean, unless close
        is called while an exception is in flight (in an ``except`` or ``finally`` block), or
        this rank's training thread died of one, or the process is ending by an uncaught
        exception, ``sys.exit(n != 0)`` or a terminating signal."""
        self._close(outcome.exit_budget() if timeout is None else timeout, sys.exc_info()[1])

    def _close(self, timeout: float, exc: BaseException | None) -> None:
        if self._delivery.closed:
            return
        self._outcome, self._raised_spans = self._ending(exc)
        self._delivery.close(timeout)
        if self._hardware is not None:
            self._hardware.close()
        track_sender(self, open_=False)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self._close(outcome.exit_budget(), exc)

    def _ending(self, exc: BaseException | None) -> tuple[Outcome | None, outcome.Spans | None]:
        """How this rank ends (None: clean), and the spans open where its exception was raised
        (None: not raised inside this Reporter's spans): the exception in flight, else its
        training thread's, else the process's."""
        if exc is not None:
            ending, marks = outcome.describe(exc), outcome.raised_in(exc)
        elif (ending := outcome.thread_outcome(self._training_thread)) is not None:
            marks = outcome.thread_stage(self._training_thread)
        else:
            ending, marks = outcome.process_outcome(), outcome.process_stage()
        if ending is None and self._raised is not None:
            # a method of its actor raised and no step ended since: the rank ends with it
            return self._raised
        if ending is None:
            return None, None
        if ending.kind is not OutcomeKind.EXCEPTION:
            return ending, marks.get(id(self), self._exit_spans)
        return ending, marks.get(id(self))
