"""The service's built-in sinks (:class:`~rlmon.service.spine.sink.StepSink`): the Prometheus
exporter, the goodput ledger's accounting, the sanity layer and the OTLP span export. The forward
sink to W&B / MLflow / TensorBoard is one too (:class:`rlmon.service.forward.sink.ForwardSink`).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Mapping

from rlmon.service.aggregation.aggregator_stats import AggregatorStats
from rlmon.service.aggregation.stream_tracker import Expired, Stream
from rlmon.service.alerting.sanity import Finding, SanityChecker, checker_args, relay_warnings
from rlmon.service.config import OtlpConfig
from rlmon.service.contract.run_info import RunInfo
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.otlp import OtlpExport
from rlmon.service.goodput.ledger import GoodputLedger
from rlmon.service.metrics import keymaps
from rlmon.service.spine.sink import StepSink
from rlmon.service.spine.verdict import Verdict

__all__ = ["ExporterSink", "GoodputSink", "OtlpSink", "SanitySink"]

log = logging.getLogger("rlmon.sanity")

class ExporterSink(StepSink):
    """/metrics: each stream's newest step and its alerts firing, the liveness states, the run
    metadata; it keeps each aggregator shard's latest counters (ingest, removed).

    Before the commit: /metrics shows the step, its alerts and the shard's counts whether or not
    the history write succeeds (Prometheus' own alerting does not wait on SQLite), and a scrape
    never waits on the write; setting a gauge twice for a batch delivered again is harmless."""

    before_commit = True

    def __init__(self, metrics: MetricsState) -> None:
        self.metrics = metrics
        self._shard_stats: dict[int, AggregatorStats] = {}

    def record(self, verdict: Verdict) -> None:
        if verdict.stats is not None:
            self._shard_stats[verdict.shard] = verdict.stats
        for step in verdict.steps:
            self.metrics.update(step.record, step.restored + step.events)
        for sighting in verdict.sightings:
            self.metrics.set_liveness(sighting.view, sighting.firing)

    def run_info(self, run: str, info: RunInfo) -> None:
        self.metrics.set_run_info(run, info)

    def finish_run(self, run: str) -> None:
        """The run's series leave the exporter after the finished-run TTL."""
        self.metrics.finish_run(run)

    def aggregated(self) -> AggregatorStats:
        """What the aggregator shards counted, summed (the ingest counters of /metrics)."""
        return AggregatorStats.total(list(self._shard_stats.values()))

    def removed(self) -> dict[tuple[str, str], int]:
        """What expiry and retention removed in the aggregator shards, by kind."""
        out: dict[tuple[str, str], int] = {}
        for stats in list(self._shard_stats.values()):
            for kind, n in stats.removed.items():
                out[("aggregator", kind)] = out.get(("aggregator", kind), 0) + n
        return out


class GoodputSink(StepSink):
    """Where the GPU-hours go: the ledger holds each step as it is judged (the judge adds it
    before pricing alerts); after each batch of steps its thread accounts what is ready.

    After the commit: the accounting is woken once the batch's steps are kept, off the alerts'
    path."""

    def __init__(self, ledger: GoodputLedger) -> None:
        self.ledger = ledger

    def start(self) -> None:
        self.ledger.start()

    def record(self, verdict: Verdict) -> None:
        if verdict.kind == "steps":
            self.ledger.wake()  # its thread accounts ready steps: never on the alerts' path

    def finish_run(self, run: str) -> None:
        self.ledger.finish(run)

    def forget(self, expired: Expired) -> None:
        self.ledger.forget(expired.runs)

    def close(self, timeout: float) -> None:
        self.ledger.close()


class SanitySink(StepSink):
    """The sanity layer: each (run, role)'s steps looked at for values that look like training
    bugs but have known causes, and the relayed keys whose framework reduction makes them
    incomparable across runs. Findings are logged, kept and counted, not paged.

    Before the commit: it reads only the steps and keeps its findings in memory, so nothing of
    it waits on the history write (as before the spine)."""

    before_commit = True

    def __init__(self, run_info: Mapping[str, RunInfo]) -> None:
        """``run_info``: the stream memory's registry of the runs' metadata (read only)."""
        self._run_info = run_info
        self.checkers: dict[Stream, SanityChecker] = {}
        self.relayed: dict[str, set[str]] = {}  # relayed key names already checked, per run
        self.findings: deque[Finding] = deque(maxlen=1_000)
        self.counts: Counter[str] = Counter()

    def record(self, verdict: Verdict) -> None:
        for record in verdict.records:
            self._check(record)

    def run_info(self, run: str, info: RunInfo) -> None:
        for (r, _role), checker in self.checkers.items():
            if r == run:
                checker.dpo, checker.deepspeed_version = checker_args(info)

    def forget(self, expired: Expired) -> None:
        for stream in expired.streams:
            self.checkers.pop(stream, None)
        for run in expired.runs:
            self.relayed.pop(run, None)

    def _check(self, record: StepRecord) -> None:
        checker = self.checkers.get((record.run, record.role))
        if checker is None:
            dpo, ds_version = checker_args(self._run_info.get(record.run))
            checker = self.checkers[(record.run, record.role)] = SanityChecker(
                dpo=dpo, deepspeed_version=ds_version)
        for finding in checker.observe(record.step, record.metrics):
            self._found(record, finding)
        seen = self.relayed.setdefault(record.run, set())
        fresh: dict[str, list[str]] = {}
        for name in record.metrics:
            framework, sep, key = name.partition("/")
            # only the keymaps' keys are remembered: a producer's own names cannot grow this
            if (sep and framework in keymaps.FRAMEWORKS and name not in seen
                    and keymaps.by_key(framework, key) is not None):
                seen.add(name)
                fresh.setdefault(framework, []).append(key)
        for framework, keys in sorted(fresh.items()):
            for finding in relay_warnings(framework, keys):
                self._found(record, finding)

    def _found(self, record: StepRecord, finding: Finding) -> None:
        self.findings.append(finding)
        self.counts[finding.kind.value] += 1
        log.warning("%s/%s step %s: %s: %s", record.run, record.role, record.step,
                    finding.metric, finding.message)


class OtlpSink(StepSink):
    """The steps' timelines as spans to an OTLP/HTTP collector (config ``otlp``); the exporter
    is built by :meth:`start` when enabled (``otlp`` None until then).

    After the commit: spans leave for another system only for steps that were stored, so a
    batch delivered again after a failed write is not exported twice."""

    def __init__(self, config: OtlpConfig) -> None:
        self.config = config
        self.otlp: OtlpExport | None = None

    def start(self) -> None:
        if self.config.enabled and self.otlp is None:
            self.otlp = OtlpExport(self.config)

    def record(self, verdict: Verdict) -> None:
        if self.otlp is not None and verdict.steps:
            self.otlp.export(verdict.records)

    def close(self, timeout: float) -> None:
        if self.otlp is not None:
            self.otlp.close()
