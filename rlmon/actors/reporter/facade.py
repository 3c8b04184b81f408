"""The worker-side Reporter: record sufficient statistics, send one message per step, never wait.

The training thread only accumulates numbers in a dict and, at ``end_step``, packs them into one
:class:`~rlmon.service.contract.step_message.StepMessage`; a background thread sends it. Messages
stay in a bounded
buffer until the aggregator acknowledges them, so an aggregator that is slow, restarting or gone
costs nothing but memory up to that bound; beyond it the oldest messages are dropped and counted.
Nothing here is a torch.distributed collective.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rlmon.actors.reporter.detect import coerce_rank, coerce_world, detect_layout
from rlmon.actors.reporter.hardware import HardwareSampler
from rlmon.actors.reporter.sample_capture import (
    DevicePick,
    Labels,
    Score,
    build_items,
    check_k,
    cut_payload,
    pick_array,
    pick_tensor,
    sample_id,
)
from rlmon.actors.reporter.sink import ReportSink, SinkClosed, track_sender
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
from rlmon.service.contract.rank import AXES, Rank, World
from rlmon.service.contract.records import MAX_STEP, check_metric_name, check_role, check_run
from rlmon.service.contract.step_message import Columns, Schema, StepMessage, state_row
from rlmon.service.contract.stop_decision import StopDecision
from rlmon.service.contract.timeline import MAX_SPANS, Span, Timeline, attrs_of, clean_text
from rlmon.service.metrics import catalog
from rlmon.service.metrics.forms import BLOCK_WIDTH, FORMS, FormDef, Merge, form_of_keys, forms_text
from rlmon.service.metrics.partial import ALL_AXES, Partial, combine
from rlmon.service.metrics.spec import Form

if TYPE_CHECKING:
    from rlmon.actors.runtime import RuntimeOptions

__all__ = ["Reporter"]

Replicated = Sequence[str] | Literal["all"] | None
log = logging.getLogger(__name__)

_MEAN = Form.MEAN  # a module global: enum attribute access is slow on the hot path

# An accumulator entry: [form, state, replicated, minibatch_mean, minibatch].
_Entry = list[Any]
# What end_step hands the sender besides the accumulator: tensor statistics in flight to the
# host and record_many batches, both merged into the accumulator off the training thread.
# Sample captures ride along: their scores and indices are in the tensors' copy.
_Deferred = tuple[StepTensors | None, list[Mapping[str, Any]], list[DevicePick]]


_PY_NUMBER = (float, int)
_SAY_AT_MOST = 100  # distinct refusals logged per Reporter (each once); later ones are counted
_PROBE_S = 0.5  # how often a reporter holding retained messages asks the aggregator who it is
# Spans read the monotonic clock; it is aligned to wall time once per process, so a span never
# jumps with the wall clock and spans of one process always line up with each other.
_WALL_OFFSET_NS = time.time_ns() - time.perf_counter_ns()
# A closed span as the training thread keeps it: (name, start, end, depth, attrs), monotonic ns.
_RawSpan = tuple[str, int, int, int, dict[str, Any] | None]
# A step's timeline as end_step hands it on: (start, end, spans, spans cut), monotonic ns.
_RawTimeline = tuple[int, int, list[_RawSpan], int]


def _check_count(name: str, count: Any) -> None:
    """Reject a negative or non-finite Python count here; other number types at pack time."""
    if count.__class__ in _PY_NUMBER and not 0 <= count < math.inf:
        raise ValueError(f"{name}: count must be finite and >= 0, got {count!r}")


def _check_step(step: Any) -> int:
    try:
        value = operator.index(step)
    except TypeError:
        raise ValueError(f"step must be an integer, got {step!r}") from None
    if isinstance(step, bool) or not 0 <= value <= MAX_STEP:
        raise ValueError(f"step must be an integer in 0..{MAX_STEP}, got {step!r}")
    return value


def _replicated(value: Replicated) -> frozenset[str] | None:
    if value is None:
        return None
    if value == "all":
        return ALL_AXES
    axes = frozenset(value)
    unknown = axes - ALL_AXES
    if unknown:
        raise ValueError(f"replicated: unknown axis {sorted(unknown)[0]!r} (axes are {AXES})")
    return axes or None


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
        runtime: RuntimeOptions | None = None,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        detected = detect_layout() if rank is None or world is None else None
        self.rank = coerce_rank(rank) if rank is not None else detected[0]  # type: ignore[index]
        self.world = coerce_world(world) if world is not None else detected[1]  # type: ignore[index]
        if not self.world.contains(self.rank):
            raise ValueError(f"rank {self.rank.as_dict()} lies outside world {self.world.as_dict()}")
        self.run, self.role = check_run(run), check_role(role)
        if sink is None:
            from rlmon.actors.runtime import RaySink

            sink = RaySink(namespace, start_service=start_service, options=runtime)
        self.sink = sink
        self.max_pending, self.max_batch = max_pending, max_batch
        self.step_seconds = step_seconds
        self.dropped = 0
        self.sent = 0
        self.transfers = 0  # device-to-host copies made for tensor statistics
        # Sample payloads: every one passes `redact` (the privacy hook) before it is cut to
        # MAX_PAYLOAD_BYTES; the cut ones are counted here.
        self.redact = redact
        self.payloads_cut = 0
        self._picks: list[DevicePick] = []  # this step's record_sample_tensor captures
        self._sequences: dict[str, int] = {}  # sequences seen this step, per sample metric
        self.last_error: str | None = None
        self._acc: dict[Any, _Entry] = {}
        self._names: set[str] = set()  # metric names already validated
        self._forms_ok: set[tuple[str, Form]] = set()  # (name, form) the catalog allows
        self._said: set[str] = set()  # refusals already logged (each is said once)
        self.rejected = 0  # statistics refused after recording (see record_tensor, record_many)
        self.refused_messages = 0  # step messages the aggregator refused (its reason: last_error)
        self._tensors = HeldTensors()
        self._tensor_forms: dict[Any, Form] = {}  # this step's record_tensor forms by key
        # record_tensor's fast path: this step's checked plain statistics by name, and each
        # name's latest plain statistic, kept across steps
        self._tensor_step: dict[str, TensorStat] = {}
        self._tensor_stats: dict[str, TensorStat] = {}
        self._batches: list[Mapping[str, Any]] = []  # this step's record_many mappings
        self._batch_forms: dict[str, FormDef] = {}  # a bare number's form, by metric name
        self._plain: dict[str, tuple[Form, bool]] = {}
        self._schema: Schema | None = None
        self._schema_key: tuple[Any, ...] = ()
        self._seq = 0
        self._started = time.time()  # tells a rerun of the run from a late resend
        self._step_start_ns = time.perf_counter_ns()
        self._spans: list[_RawSpan] = []  # this step's closed spans (at most MAX_SPANS)
        self._spans_cut = 0  # this step's spans beyond MAX_SPANS
        self._depth = 0  # spans open now
        self._host, self._pid = clean_text(socket.gethostname()), os.getpid()
        # device memory, GPU utilisation and power, host RSS and CPU: sampled on a thread of
        # their own, added to each step on the sender thread (None: not sampled)
        self._hardware = HardwareSampler(hardware_interval) if hardware_interval else None
        self._pending: deque[StepMessage] = deque()  # packed, sent or not, not acknowledged
        self._raw: deque[tuple[int, dict[Any, _Entry], float, _Deferred, _RawTimeline]] = \
            deque()  # not packed
        self._retained: deque[StepMessage] = deque()  # acknowledged, step not finalized yet
        self._incarnation: str | None = None
        self._next_probe = 0.0  # monotonic time of the next incarnation probe (while retained)
        self._probe_asked = 0  # flush() asks for a probe that starts after it was called...
        self._probe_done = 0  # ...and waits until one has answered
        self._packing = 0
        self.resent = 0
        # The service's latest stop decision for this run (rlmon.service.contract.stop_decision), from an ack:
        # written by the sender thread, read by should_stop() on the training thread.
        self.stop_decision: StopDecision | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._gone = False  # the sink said Ray is gone for good: nothing more can be sent
        self._thread = threading.Thread(target=self._send_loop, name="rlmon-reporter", daemon=True)
        self._thread.start()
        track_sender(self)

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
            if count.__class__ in _PY_NUMBER and not 0 <= count < math.inf:
                _check_count(name, count)
            entry = self._acc.get(name)
            if entry is None:
                if name not in self._names:
                    check_metric_name(name)
                    self._names.add(name)
                self._acc[name] = [_MEAN, (sum, count), None, False, 0]
                return
            if entry[0] is _MEAN:
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
            _check_count(name, count)
        state = FORMS[form].state(given)
        self._add(name, form, state, replicated, minibatch_reduce, minibatch)

    def _add(
        self, name: str, form: Form, state: tuple[float, ...], replicated: Replicated,
        minibatch_reduce: str | None, minibatch: int, acc: dict[Any, _Entry] | None = None,
    ) -> None:
        mb_mean = minibatch_reduce == "mean"
        if minibatch_reduce is not None and not mb_mean:
            raise ValueError(f'{name}: minibatch_reduce must be "mean" or None')
        key = (name, minibatch) if mb_mean else name
        if acc is None:
            acc = self._acc
        entry = acc.get(key)
        if entry is None:
            rep = _replicated(replicated) if replicated is not None else (
                ALL_AXES if FORMS[form].replicated_by_default else None)
            acc[key] = [form, state, rep, mb_mean, minibatch]
            return
        if entry[0] is not form:
            raise ValueError(f"{name}: recorded as {entry[0].value!r} and now as {form.value!r}")
        entry[1] = combine(form, entry[1], state)

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
        stat = self._tensor_step.get(name)
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
        if replicated is None and minibatch_reduce is None:
            # A name recorded in an earlier step: checked then; only the form may conflict.
            stat = self._tensor_stats.get(name)
            if stat is not None and stat.reduce == reduce and values.__class__ in TORCH_TYPES:
                known = self._tensor_forms.get(name)
                if known is None:
                    entry = self._acc.get(name)
                    known = self._tensor_forms[name] = stat.form if entry is None else entry[0]
                if known is stat.form:
                    self._tensor_step[name] = stat
                    return stat
        form = check_reduce(reduce)
        if name not in self._names:
            check_metric_name(name)
            self._names.add(name)
        if minibatch_reduce is not None and minibatch_reduce != "mean":
            raise ValueError(f'{name}: minibatch_reduce must be "mean" or None')
        if replicated is not None:
            _replicated(replicated)  # an unknown axis raises here, not on the sender thread
        key = (name, minibatch) if minibatch_reduce == "mean" else name
        known = self._tensor_forms.get(key)
        if known is None:
            entry = self._acc.get(key)
            known = self._tensor_forms[key] = form if entry is None else entry[0]
        if known is not form:
            raise ValueError(f"{name}: recorded as {known.value!r} and now as {form.value!r}")
        if not is_torch(values):
            numbers = reduce_array(values, mask, reduce)
            self._add_numbers(name, form, numbers, replicated, minibatch_reduce, minibatch)
            return None
        if replicated is not None or minibatch_reduce is not None:
            return TensorStat(name, form, reduce, replicated, minibatch_reduce, minibatch)
        stat = self._tensor_stats.get(name)
        if stat is None or stat.reduce != reduce:
            stat = self._tensor_stats[name] = TensorStat(name, form, reduce)
        self._tensor_step[name] = stat
        return stat

    def end_micro_batch(self) -> None:
        """Reduce the tensors recorded since the last fold now and release them.

        Optional: ``end_step`` folds too. Call it when the recorded tensors' memory should be
        freed, or before their buffers are reused. Launches a few kernels per shared mask, no
        device-to-host copy.
        """
        refused = self._tensors.fold()
        if refused:
            self._refuse(refused, "modified in place after record_tensor, before it was reduced")

    def _refuse(self, names: Sequence[str], why: str) -> None:
        self.rejected += len(names)
        self.last_error = f"{names[0]}: {why}"
        self._say_once(self.last_error, "rlmon: %s/%s: %d statistic(s) refused, e.g. %s: %s",
                       self.run, self.role, len(names), names[0], why)

    def _say_once(self, refusal: str, message: str, *args: Any) -> None:
        """Log a refusal the first time it happens (not every step), up to _SAY_AT_MOST kinds."""
        if refusal not in self._said and len(self._said) < _SAY_AT_MOST:
            self._said.add(refusal)
            log.warning(message, *args)

    def _check_catalog_forms(self, acc: dict[Any, _Entry]) -> None:
        """Refuse the statistics whose form the catalog does not give their name (sender
        thread): the aggregator would refuse the whole step for one of them."""
        wrong: list[tuple[Any, str, str]] = []
        for key, entry in acc.items():
            name, form = (key[0] if entry[3] else key), entry[0]
            if (name, form) in self._forms_ok:
                continue
            error = catalog.form_error(name, form)
            if error is None:
                self._forms_ok.add((name, form))
            else:
                wrong.append((key, name, error))
        for key, _name, _error in wrong:
            del acc[key]
        if wrong:
            self._refuse([name for _, name, _ in wrong], wrong[0][2])

    def _refused_by_aggregator(self, ack: Any) -> None:
        """What the aggregator refused of a sent batch: counted and said, like a local refusal."""
        rejected = getattr(ack, "rejected", 0)
        if rejected:
            errors = getattr(ack, "errors", None) or ["(no reason given)"]
            self.refused_messages += rejected
            self.last_error = f"refused by the aggregator: {errors[0]}"
            reason = errors[0].split(": ", 1)[-1]  # without its "run/role step N: " origin
            self._say_once(reason, "rlmon: %s/%s: the aggregator refused %d step message(s): %s",
                           self.run, self.role, rejected, errors[0])

    def _add_numbers(self, name: str, form: Form, numbers: Mapping[str, float],
                     replicated: Replicated, minibatch_reduce: str | None, minibatch: int,
                     acc: dict[Any, _Entry] | None = None) -> None:
        """Add a tensor statistic given by form key (with its count) to the accumulator."""
        spec = FORMS[form]
        if numbers["count"] == 0 and spec.columnar is not Merge.ADD:
            return  # an extreme of no entries is nothing to report, not +-inf
        self._add(name, form, spec.state(numbers), replicated, minibatch_reduce, minibatch, acc)

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
        depth = self._depth
        self._depth = depth + 1
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            end = time.perf_counter_ns()
            self._depth = depth
            if len(self._spans) < MAX_SPANS:
                self._spans.append((name, start, end, depth, attrs or None))
            else:
                self._spans_cut += 1
            self._add(f"timing/{name}_seconds", Form.MAX, ((end - start) * 1e-9,),
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

    def _add_samples(self, name: str, form: Form, k: int, items: Sequence[Any],
                     acc: dict[Any, _Entry] | None = None) -> None:
        ranked = FORMS[form].ranked
        assert ranked is not None
        state = ranked.combine((k,), (k, *items))  # the best k, one per id
        self._add(name, form, state, None, None, 0, acc)

    def _ranked_state(self, name: str, form: Form, k: Any, given: Iterable[Any],
                      ) -> tuple[Any, ...]:
        """The best ``k`` of ``(score, id[, payload])`` items as a ranked state: ids made
        printable, payloads redacted and cut (only the kept ones)."""
        check_k(name, k)
        ranked = FORMS[form].ranked
        assert ranked is not None
        try:
            best = sorted(((float(item[0]), sample_id(item[1]),
                            item[2] if len(item) > 2 and item[2] else "") for item in given),
                          key=ranked.order)
        except (IndexError, TypeError) as exc:
            raise ValueError(f"{name}: items must be (score, id) or (score, id, payload): "
                             f"{type(exc).__name__}") from None
        kept: list[Any] = []
        seen: set[str] = set()
        for score, ident, payload in best:
            if ident in seen:
                continue
            seen.add(ident)
            if payload:
                text = self.redact(str(payload)) if self.redact is not None else str(payload)
                payload, cut = cut_payload(text)
                self.payloads_cut += cut
            kept.append((score, ident, payload))
            if len(kept) == k:
                break
        return (k, *kept)

    def record_samples(self, name: str, items: Iterable[tuple[float, Any, str | None]], *,
                       k: int = 8, largest: bool | None = None) -> None:
        """Keep the ``k`` best of ``(score, id, payload)`` items (host numbers; payload None or
        "" for none) in a ranked metric: the highest scores, or the lowest with
        ``largest=False`` (a catalog name fixes which). Calls in a step merge; ids are unique
        per sample across ranks (the merge keeps one item per id). Payloads pass ``redact``
        and are cut to MAX_PAYLOAD_BYTES (counted in ``payloads_cut``).
        """
        form = self._sample_form(name, largest)
        self._add(name, form, self._ranked_state(name, form, k, items), None, None, 0)

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
        offset = self._sequences.get(name, 0)
        rows = values.shape[0] if len(getattr(values, "shape", ())) == 1 else (
            math.prod(values.shape[:-1]) if getattr(values, "shape", ()) else 0)
        self._sequences[name] = offset + rows
        prefix = f"dp{self.rank.dp}/"
        if not is_torch(values):
            picked = pick_array(values, mask, score, k, top, name)
            items, cut = build_items(picked, ids, payload, prefix, offset, self.redact)
            self.payloads_cut += cut
            self._add_samples(name, form, k, items)
            return
        piece, n = pick_tensor(values, mask, score, k, top, name)
        start = self._tensors.attach(piece.device, piece)
        self._picks.append(DevicePick(name, form, k, piece.device, start, n, ids, payload,
                                      prefix, offset))

    # -- ending a step -------------------------------------------------------------------------

    def _fold_tensors(self) -> StepTensors | None:
        """Fold what is held and start the step's one copy per device (training thread)."""
        self.end_micro_batch()
        moving = self._tensors.transfer()
        if moving is not None:
            self.transfers += moving.transfers
        return moving

    def _complete(self, acc: dict[Any, _Entry], deferred: _Deferred) -> None:
        """Merge a step's tensor statistics and record_many batches into its accumulator
        (sender thread); a statistic that does not fit is refused and counted."""
        moving, batches, picks = deferred
        refused: list[tuple[str, str]] = []
        if moving is not None:
            vectors = moving.vectors()
            for stat, state in moving.read(vectors):
                try:
                    self._add(stat.name, stat.form, state, stat.replicated,
                              stat.minibatch_reduce, stat.minibatch, acc)
                except ValueError as exc:  # recorded in another form by record() after it
                    refused.append((stat.name, str(exc)))
            for pick in picks:
                self._complete_pick(acc, pick, vectors[pick.device], refused)
        for batch in batches:
            self._merge_batch(acc, batch, refused)
        if refused:
            self._refuse([name for name, _ in refused], refused[0][1])

    def _complete_pick(self, acc: dict[Any, _Entry], pick: DevicePick, row: list[float],
                       refused: list[tuple[str, str]]) -> None:
        """A device sample capture's items: ids and payloads asked for the selected only."""
        try:
            items, cut = build_items(pick.picked(row), pick.ids, pick.payload, pick.prefix,
                                     pick.offset, self.redact)
            self.payloads_cut += cut
            self._add_samples(pick.name, pick.form, pick.k, items, acc)
        except Exception as exc:  # the caller's ids/payload failed: never its text in a log
            refused.append((pick.name, f"ids or payload raised {type(exc).__name__}"))

    def _merge_batch(self, acc: dict[Any, _Entry], batch: Mapping[str, Any],
                     refused: list[tuple[str, str]]) -> None:
        for name, stat in batch.items():
            if stat.__class__ is tuple and len(stat) == 2:  # (sum, count): the common case
                total, count = stat
                if count.__class__ in _PY_NUMBER and not 0 <= count < math.inf:
                    refused.append((name, f"count must be finite and >= 0, got {count!r}"))
                    continue
                entry = acc.get(name)
                if entry is None:
                    acc[name] = [_MEAN, stat, None, False, 0]
                    continue
                if entry[0] is _MEAN:
                    old = entry[1]
                    entry[1] = (old[0] + total, old[1] + count)
                    continue
                form, state = _MEAN, tuple(stat)
            else:
                try:
                    form, state = self._batch_state(name, stat)
                except (TypeError, ValueError) as exc:
                    refused.append((name, str(exc)))
                    continue
            try:
                self._add(name, form, state, None, None, 0, acc)
            except ValueError as exc:
                refused.append((name, str(exc)))

    def _batch_state(self, name: str, stat: Any) -> tuple[Form, tuple[float, ...]]:
        """The form and state of one record_many statistic other than a (sum, count) pair."""
        if isinstance(stat, Mapping):
            form = form_of_keys(frozenset(stat))
            if form is None:
                raise ValueError(f"{name}: give one statistic form ({forms_text()}), "
                                 f"got {', '.join(stat) or 'none'}")
            keyed = FORMS[form]
            if keyed.ranked is not None:  # {"k": 8, "top": [[score, id, payload?], ...]}
                return form, self._ranked_state(name, form, stat["k"], stat[keyed.ranked.key])
            state = keyed.state(stat)
            for i in keyed.counts:
                _check_count(name, state[i])
            return form, state
        if isinstance(stat, tuple | list):
            raise ValueError(f"{name}: a sequence must be a (sum, count) pair, got {stat!r}")
        spec = self._batch_forms.get(name)
        if spec is None:
            declared = catalog.lookup(name)
            spec = FORMS[declared.forms[0]] if declared is not None else FORMS[Form.VALUE]
            if spec.of_value is None:  # a form that cannot hold one value (sqsum)
                spec = FORMS[Form.VALUE]
            self._batch_forms[name] = spec
        of_value = spec.of_value
        assert of_value is not None
        return spec.form, of_value(stat)

    def _is_plain(self, name: str, form: Form) -> bool:
        """Whether the metric travels in the columnar block; cached by name (one dict get)."""
        known = self._plain.get(name)
        if known is None or known[0] is not form:
            spec = catalog.lookup(name)
            known = self._plain[name] = (form, Schema.plain(form) and not (
                spec is not None and spec.per_rank_spread
            ))
        return known[1]

    def end_step(self, step: int) -> None:
        """Close the step and hand it to the sender thread; returns at once.

        The training thread only folds held tensors (a few launches per shared mask), starts
        their one copy per device (non-blocking into pinned memory on CUDA) and swaps the
        accumulator; waiting for the copy, merging ``record_many`` batches and packing the
        message happen on the sender thread.
        """
        step = _check_step(step)
        moving = self._fold_tensors() if self._tensors else None
        batches, self._batches = self._batches, []
        picks, self._picks = self._picks, []
        self._sequences.clear()
        self._tensor_forms.clear()
        self._tensor_step.clear()
        now = time.perf_counter_ns()
        if self.step_seconds and catalog.STRAGGLER_SOURCE not in self._acc:
            self._acc[catalog.STRAGGLER_SOURCE] = [
                Form.MAX, ((now - self._step_start_ns) * 1e-9,), None, False, 0]
        timeline = (self._step_start_ns, now, self._spans, self._spans_cut)
        self._step_start_ns = now
        self._spans, self._spans_cut = [], 0
        acc, self._acc = self._acc, {}
        with self._cond:
            self._raw.append((step, acc, time.time(), (moving, batches, picks), timeline))
            self._trim()
            self._cond.notify()

    def _trim(self) -> None:
        while len(self._raw) + len(self._pending) > self.max_pending:
            if self._pending:
                self._pending.popleft()
            else:
                self._raw.popleft()
            self.dropped += 1

    def _timeline(self, raw: _RawTimeline) -> Timeline:
        """The step's timeline in unix ns, attributes normalized (sender thread)."""
        start, end, spans, cut = raw
        shift = _WALL_OFFSET_NS
        return Timeline(
            start + shift, end + shift,
            tuple(Span(clean_text(name), s + shift, e + shift, depth,
                       attrs_of(attrs) if attrs else ())
                  for name, s, e, depth, attrs in spans),
            cut, self._host, self._pid,
        )

    def _pack(self, step: int, acc: dict[Any, _Entry], wall: float,
              timeline: _RawTimeline | None = None) -> StepMessage:
        plain: list[tuple[str, Form]] = []
        rows: list[tuple[float, ...]] = []  # converted and count-checked in one numpy pass
        other: dict[int, dict[str, Partial]] = {}
        for key, (form, state, rep, mb_mean, mb) in acc.items():
            if rep is None and not mb_mean and self._is_plain(key, form):
                plain.append((key, form))
                rows.append(state_row(form, state))
                continue
            ranked = FORMS[form].ranked
            state = ranked.check(state) if ranked is not None else tuple(map(float, state))
            for i in FORMS[form].counts:
                if not 0 <= state[i] < math.inf:
                    name = key[0] if mb_mean else key
                    raise ValueError(f"{name}: count must be finite and >= 0, got {state[i]!r}")
            name = key[0] if mb_mean else key
            other.setdefault(mb if mb_mean else 0, {})[name] = Partial(form, state, rep, mb_mean)
        columns = self._columns(plain, rows) if plain else None
        self._seq += 1
        return StepMessage(
            self.run, self.role, step, self.rank, self.world, self._seq, wall,
            columns, tuple(sorted(other.items(), key=lambda kv: kv[0])), self.dropped,
            self._started, timeline=self._timeline(timeline) if timeline is not None else None,
            refused=self.rejected,
        )

    def _columns(self, plain: list[tuple[str, Form]], rows: list[tuple[float, ...]]) -> Columns:
        key = tuple(plain)
        if key != self._schema_key or self._schema is None:
            self._schema = Schema.build(dict(key))
            order = {name: i for i, (name, _) in enumerate(key)}
            self._perm = np.array([order[n] for n in self._schema.names], dtype=np.intp)
            self._count_cells = np.zeros((len(key), BLOCK_WIDTH), dtype=bool)
            for i, (_, form) in enumerate(key):
                self._count_cells[i, list(FORMS[form].counts)] = True
            self._schema_key = key
        block = np.array(rows, dtype=np.float64)
        counts = block[self._count_cells]
        if counts.size and not ((counts >= 0) & (counts < math.inf)).all():
            bad = self._count_cells & ~((block >= 0) & (block < math.inf))
            row, col = np.argwhere(bad)[0]
            raise ValueError(f"{plain[row][0]}: count must be finite and >= 0, "
                             f"got {float(block[row, col])!r}")
        return Columns(self._schema, block[self._perm])

    # -- sending (background thread) -----------------------------------------------------------

    def _probe_due(self) -> float | None:
        """Seconds until the next incarnation probe (0: now), or None when none is needed."""
        if not self._retained:
            return None
        return max(0.0, self._next_probe - time.monotonic())

    def _probe(self, asked: int) -> None:
        """Ask the aggregator who it is, so retained messages reach a restarted one.

        Without this a reporter that has nothing new to send would never learn of a restart, and
        the steps it had sent but that were still open would finalize without it.
        """
        probe = getattr(self.sink, "probe", None)
        try:
            ack = probe(self.run, self.role) if probe is not None else self.sink.send([])
        except Exception as exc:  # unreachable: try again later; flush() keeps waiting
            if isinstance(exc, SinkClosed):
                self._give_up(exc)
                return
            with self._cond:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._next_probe = time.monotonic() + 0.2
            return
        with self._cond:
            self._next_probe = time.monotonic() + _PROBE_S
            if ack is not None:
                self._retain([], ack)
            self._probe_done = max(self._probe_done, asked)
            self._cond.notify_all()

    def _send_loop(self) -> None:
        backoff = 0.05
        while True:
            probe_asked: int | None = None
            with self._cond:
                while not self._pending and not self._raw and not self._closed:
                    due = self._probe_due()
                    if due == 0.0:
                        probe_asked = self._probe_asked
                        break
                    self._cond.wait(due)
                if probe_asked is None and not self._pending and not self._raw and self._closed:
                    return
            if probe_asked is not None:
                self._probe(probe_asked)
                if self._gone:
                    return
                continue
            with self._cond:
                raw = list(self._raw)
                self._raw.clear()
                self._packing = len(raw)  # neither raw nor pending while packed: flush waits
            packed = []
            for step, acc, wall, deferred, timeline in raw:
                try:
                    if deferred[0] is not None or deferred[1]:
                        self._complete(acc, deferred)
                    self._check_catalog_forms(acc)
                    if self._hardware is not None:
                        for name, (form, state) in self._hardware.take().items():
                            acc.setdefault(name, [form, state, None, False, 0])  # user's first
                    packed.append(self._pack(step, acc, wall, timeline))
                except Exception as exc:  # not a number, too large for a float, a bad count
                    self.last_error = f"step {step}: {type(exc).__name__}: {exc}"
                    self.dropped += 1
            with self._cond:
                self._pending.extend(packed)
                self._packing = 0
                self._trim()
                if not self._pending:
                    self._cond.notify_all()  # a flush waiting on what was dropped returns now
                    continue
                batch = [self._pending[i] for i in range(min(self.max_batch, len(self._pending)))]
            try:
                ack = self.sink.send(batch)
            except Exception as exc:  # the aggregator is slow, restarting or gone: keep and retry
                self.last_error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, SinkClosed):
                    self._give_up(exc)
                    return
                with self._cond:
                    if self._closed:
                        return
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            last = batch[-1].seq
            with self._cond:
                while self._pending and self._pending[0].seq <= last:
                    self._pending.popleft()
                self.sent += len(batch)
                self._refused_by_aggregator(ack)
                self._retain(batch, ack)
                self._cond.notify_all()

    def _give_up(self, exc: Exception) -> None:
        """Ray is gone for good: count what can no longer be sent, say it once, stop."""
        with self._cond:
            lost = len(self._pending) + len(self._raw)
            self.dropped += lost
            self._pending.clear()
            self._raw.clear()
            self._retained.clear()
            self._gone = True
            self._cond.notify_all()
        log.warning("rlmon: %s/%s: %s; %d step message(s) not sent (counted as dropped)",
                    self.run, self.role, exc, lost)

    def _retain(self, batch: list[StepMessage], ack: Any) -> None:
        """Keep acknowledged messages of open steps; resend them to a restarted aggregator.
        Take the run's stop decision from the ack when it applies to this Reporter."""
        decision = (getattr(ack, "stops", None) or {}).get(self.run)
        if decision is not None and decision != self.stop_decision and decision.applies_to(
                self._started):
            if self.stop_decision is None:
                log.warning("rlmon: %s/%s: the service asks this run to stop: %s", self.run,
                            self.role, decision.reason)
            self.stop_decision = decision
        incarnation = getattr(ack, "incarnation", None)
        floors = getattr(ack, "floors", None)
        if not incarnation or floors is None:
            return
        if self._incarnation is not None and incarnation != self._incarnation:
            # The aggregator restarted: the open steps it held are gone; rebuild them.
            self.resent += len(self._retained)
            self._pending.extendleft(replace(m, resend=True) for m in reversed(self._retained))
            self._retained.clear()
        self._incarnation = incarnation
        self._retained.extend(batch)
        floor = floors.get((self.run, self.role), 0)
        self._retained = deque(m for m in self._retained if m.step >= floor)
        while len(self._retained) > self.max_pending:
            self._retained.popleft()

    def should_stop(self) -> bool:
        """Whether the service asked this run to stop (a rule with the stop action fired and
        the config lets it stop the run; see ``stop_decision`` for why). Answered from the last
        acknowledgement, never waiting: the decision arrives with the acks of the steps sent
        after it was taken, so a step or two after the alert's step."""
        return self.stop_decision is not None

    def set_run_info(self, **fields: Any) -> None:
        """Send the run's metadata (fields of :class:`~rlmon.service.export.exporter.RunInfo`) to the
        service once, without waiting; an unknown field raises TypeError. No-op without a service.
        """
        from rlmon.actors.service_actor import send_to_service
        from rlmon.service.export.exporter import RunInfo

        send_to_service(self.sink, "set_run_info", self.run, RunInfo.from_fields(fields))

    def finish_run(self) -> None:
        """Tell the service the run ended: its series leave the exporter after a short TTL."""
        from rlmon.actors.service_actor import send_to_service

        send_to_service(self.sink, "finish_run", self.run)

    @property
    def pending(self) -> int:
        """Steps not yet acknowledged by the aggregator."""
        return len(self._pending) + len(self._raw) + self._packing

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message was acknowledged; False if ``timeout`` passed first.

        With messages of still-open steps retained, it also waits for a fresh answer from the
        aggregator, so messages a restarted aggregator lost are resent before it returns True.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._probe_done
            if self._retained:
                self._probe_asked += 1
                target = self._probe_asked
                self._next_probe = 0.0
            self._cond.notify_all()
            while not self._gone and (self._pending or self._raw or self._packing or (
                    self._retained and self._probe_done < target)):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is not None else 0.5)
        return not self._gone

    def close(self, timeout: float = 10.0) -> None:
        """Flush for up to ``timeout`` seconds, then stop; what is still unsent counts as dropped.
        Closing twice is harmless."""
        if self._closed:
            return
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self.dropped += len(self._pending) + len(self._raw)
            self._pending.clear()
            self._raw.clear()
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        if self._hardware is not None:
            self._hardware.close()
        track_sender(self, open_=False)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
