"""Delay from a step's finalization to the receiver getting the alert.

Two paths, both on loopback with real parts:
  - rlmon's engine: StepAssembler finalizes -> AlertEngine -> Dispatcher (outbox + delivery
    threads) -> slack-sdk / pagerduty clients -> receiver;
  - the Prometheus path: exporter -> Debian Prometheus (scrape 1 s, eval 1 s) -> Alertmanager
    (group_wait 1 s) -> receiver. Its delay scales with those intervals; production defaults
    (15 s scrape, 30 s group_wait) add roughly their sum.
Prints the figures and the ratio of the Prometheus path to rlmon's (the baseline is rlmon's).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the loopback parts

from alerting_support import LoopbackTransport, PromStack, Receiver

from rlmon.service.aggregation.assembly import StepAssembler
from rlmon.service.alerting.engine import AlertEngine
from rlmon.service.alerting.notify import build_dispatcher, open_outbox
from rlmon.service.alerting.rules import default_rules
from rlmon.service.config import Settings
from rlmon.service.contract.records import parse_line
from rlmon.service.export.exporter import MetricsState
from rlmon.service.export.http import serve_metrics
from rlmon.service.export.prometheus_rules import render

TRIALS = int(os.environ.get("RLMON_BENCH_TRIALS", "20"))
PROM_TRIALS = int(os.environ.get("RLMON_BENCH_PROM_TRIALS", "3"))


def _line(run: str, step: int, ratio: float, dp: int) -> str:
    return json.dumps({"run": run, "role": "actor", "step": step, "rank": {"dp": dp},
                       "world": {"dp": 2},
                       "metrics": {"actor/is_ratio": {"sum": ratio * 10, "count": 10}}})


def _wait(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("receiver got nothing")
        time.sleep(0.001)


class Summary(NamedTuple):
    median: float
    p95: float
    max: float


def _summary(name: str, values: list[float]) -> Summary:
    values = sorted(values)
    p95 = values[min(len(values) - 1, math.ceil(0.95 * len(values)) - 1)]  # nearest rank
    med = statistics.median(values)
    print(f"{name:<44} n={len(values):<3} median {med * 1000:8.1f} ms   p95 {p95 * 1000:8.1f} ms"
          f"   max {values[-1] * 1000:8.1f} ms")
    return Summary(med, p95, values[-1])


def bench_engine(tmp: Path) -> dict[str, Summary]:
    receiver = Receiver().start()
    os.environ["RLMON_SLACK_WEBHOOK_URL"] = f"{receiver.url}/slack/T0/B0/bench"
    os.environ["RLMON_PAGERDUTY_ROUTING_KEY"] = "0" * 32
    # the delivery path itself: grouped (the default), Slack's message also waits the group
    # wait (notifiers.grouping.group_wait_seconds) by design; PagerDuty never does
    settings = Settings.model_validate({
        "notifiers": {"grouping": {"enabled": False}, "slack": {"min_interval_seconds": 0.0},
                      "pagerduty": {"min_interval_seconds": 0.0}, "console": {"enabled": False}},
        "outbox": {"path": str(tmp / "outbox.sqlite")},
    })
    dispatcher = build_dispatcher(settings, open_outbox(settings),
                                  transports={"pagerduty": LoopbackTransport(receiver.port)})
    dispatcher.start()
    assembler = StepAssembler(clock=time.time)
    engine = AlertEngine(default_rules())
    slack: list[float] = []
    pd: list[float] = []
    try:
        for trial in range(TRIALS):
            run = f"bench-{trial}"
            n_slack, n_pd = len(receiver.accepted("/slack")), len(receiver.accepted("/v2/enqueue"))
            assembler.add(parse_line(_line(run, 0, 3.0, 0)))
            _, record = assembler.add(parse_line(_line(run, 0, 3.0, 1)))  # last partial
            assert record is not None and record.finalized_at is not None
            dispatcher.submit(engine.evaluate(record), finalized_at=record.finalized_at)
            _wait(lambda n_slack=n_slack, n_pd=n_pd: len(receiver.accepted("/slack")) > n_slack
                  and len(receiver.accepted("/v2/enqueue")) > n_pd, 10)
            slack.append(receiver.accepted("/slack")[-1].at - record.finalized_at)
            pd.append(receiver.accepted("/v2/enqueue")[-1].at - record.finalized_at)
    finally:
        dispatcher.stop()
        receiver.stop()
    return {"slack": _summary("rlmon engine -> Slack (slack-sdk)", slack),
            "pagerduty": _summary("rlmon engine -> PagerDuty (pagerduty client)", pd)}


def bench_prometheus(tmp: Path) -> Summary | None:
    prometheus, alertmanager = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
    if not prometheus or not alertmanager:
        print("prometheus / prometheus-alertmanager not installed: Prometheus path skipped")
        return None
    receiver = Receiver().start()
    state = MetricsState()
    server = serve_metrics(state, port=0, host="127.0.0.1")
    stack = PromStack(tmp, server.port, receiver.url, render(step_period=1.0, interval="1s"))
    assembler = StepAssembler(clock=time.time)
    engine = AlertEngine(default_rules())
    delays: list[float] = []
    try:
        stack.start(prometheus, alertmanager)
        for trial in range(PROM_TRIALS):
            run = f"prom-{trial}"
            for step, ratio in enumerate((1.0, 1.0)):
                for dp in (0, 1):
                    _, rec = assembler.add(parse_line(_line(run, step, ratio, dp)))
                assert rec is not None
                state.update(rec, engine.evaluate(rec))
            _wait(lambda run=run: stack.query(f'rlmon_step{{run="{run}"}} == 1'), 30)
            before = len(receiver.accepted("/v2/enqueue"))
            assembler.add(parse_line(_line(run, 2, 3.0, 0)))
            _, rec = assembler.add(parse_line(_line(run, 2, 3.0, 1)))
            assert rec is not None and rec.finalized_at is not None
            state.update(rec, engine.evaluate(rec))
            _wait(lambda before=before: len(receiver.accepted("/v2/enqueue")) > before, 60)
            delays.append(receiver.accepted("/v2/enqueue")[-1].at - rec.finalized_at)
            state.finish_run(run)
    finally:
        stack.stop()
        server.close()
        receiver.stop()
    return _summary("exporter -> Prometheus -> Alertmanager -> PD", delays)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rlmon-bench-") as tmp:
        engine = bench_engine(Path(tmp))
        prom_dir = Path(tmp) / "prom"
        prom_dir.mkdir()
        prom = bench_prometheus(prom_dir)
    budget = 1.0
    # judged on the tail, every destination: the p95 and the worst delivery must both fit
    p95 = max(s.p95 for s in engine.values())
    worst = max(s.max for s in engine.values())
    meets = p95 < budget and worst < budget
    print(f"budget (DESIGN): last partial -> alert delivered < {budget:g} s: rlmon engine "
          f"{'meets' if meets else 'MISSES'} it (p95 {p95 * 1000:.1f} ms, max "
          f"{worst * 1000:.1f} ms; max / budget {worst / budget:.3f})")
    if prom is not None:
        print(f"ratio Prometheus+Alertmanager path / rlmon engine (PagerDuty, medians): "
              f"{prom.median / engine['pagerduty'].median:.0f}x  "
              "(scrape 1 s, eval 1 s, group_wait 1 s)")
    return 0 if meets else 1


if __name__ == "__main__":
    sys.exit(main())
