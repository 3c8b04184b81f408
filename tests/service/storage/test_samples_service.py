"""Worst samples downstream: stored with their step (bounded: payload budget and retention, what
is cut counted), printed by ``rlmon samples``, carried by the notifications of the alerts whose
metric has samples (webhook, Slack, PagerDuty custom details), never in the exporter's labels."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.sink import LocalSink
from rlmon.cli import main
from rlmon.service.alerting.engine import AlertEvent
from rlmon.service.alerting.notify.console import ConsoleNotifier
from rlmon.service.alerting.notify.render import pagerduty_body, slack_body, webhook_body
from rlmon.service.alerting.rules import default_rules
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.export.http import build_registry
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore
from rlmon.service.storage.history import HistoryStore
from rlmon.service.storage.stored_samples import NOTIFY_CHARS, NOTIFY_ITEMS, bound_payloads
from tests.support.alerting_support import Receiver, wait_for, webhook_settings
from tests.support.records import step_record


def _record(step: int, items: tuple[tuple[float, str, str], ...], **metrics: float,
            ) -> StepRecord:
    return step_record(run="grpo", step=step,
                       metrics={catalog.IS_RATIO_LOWEST: items[0][0], **metrics},
                       samples={catalog.IS_RATIO_LOWEST: items})


def test_catalog_sample_metrics_are_ranked_and_alerts_point_at_them() -> None:
    ranked = {spec.name for spec in catalog.sample_metrics()}
    assert ranked == {catalog.LOGP_DIFF_WORST, catalog.IS_RATIO_LOWEST, catalog.REWARD_HIGHEST,
                      catalog.REWARD_LOWEST, catalog.TRUNCATED_LONGEST}
    for spec in catalog.metrics():
        assert not spec.samples or spec.samples in ranked, spec.name
    assert catalog.samples_for(catalog.IS_RATIO_MIN) == catalog.IS_RATIO_LOWEST
    assert catalog.samples_for(catalog.IS_RATIO) == catalog.IS_RATIO_LOWEST
    assert catalog.samples_for(catalog.LOGP_DIFF) == catalog.LOGP_DIFF_WORST
    assert catalog.samples_for(catalog.LOSS) is None


def test_the_payload_budget_cuts_the_later_items_text_and_counts_it() -> None:
    items = [(0.1, "a", "x" * 6), (0.2, "b", "é" * 4), (0.3, "c", "zz")]
    kept, cut = bound_payloads(items, 9)
    assert kept == ((0.1, "a", "x" * 6), (0.2, "b", "é"), (0.3, "c", "")) and cut == 2
    store = HistoryStore(sample_payload_bytes=9)
    store.add([_record(0, tuple(items))])
    (stored,) = store.samples("grpo")
    assert stored.items == kept and stored.cut == 2 and store.sample_payloads_cut == 2


def test_retention_keeps_the_newest_steps_samples_and_counts_what_left() -> None:
    store = HistoryStore()
    store.add([_record(s, ((0.5, f"s{s}", ""),)) for s in range(10)])
    pruned = store.prune(keep_steps=100, keep_samples=3)
    assert pruned.samples == 7
    assert [s.step for s in store.samples("grpo", step=None)] == [9]
    assert store.samples("grpo", step=6) == [] and len(store.samples("grpo", step=7)) == 1


def test_an_is_alert_carries_its_worst_samples_to_the_webhook_and_rlmon_samples_prints_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    receiver = Receiver().start()
    settings = webhook_settings(receiver, tmp_path / "outbox.sqlite")
    # ISRatioStale at its first stale step (its default waits three): this test is the samples'
    rules = [r.model_copy(update={"for_steps": 1}) if r.name == "ISRatioStale" else r
             for r in default_rules()]
    service = ServiceCore(settings, state_dir=tmp_path, rules=rules).start()
    sink = LocalSink(on_record=lambda record: service.publish([record]))
    reps = [Reporter("grpo", "actor", rank={"dp": d}, world={"dp": 2}, sink=sink,
                     step_seconds=False) for d in range(2)]
    long = "stale prompt " * 100
    try:
        for step in range(2):
            for d, rep in enumerate(reps):
                # step 1: three sequences of rank 1 come from a stale policy
                ratios = [[1.0, 0.9, 1.1]] * 4 if step == 0 or d == 0 else \
                    [[1.0, 0.02, 1.0], [0.05, 1.0, 1.0], [0.01, 0.5, 1.0], [1.0, 1.0, 1.0]]
                rep.record(catalog.IS_RATIO_MIN, min=min(min(r) for r in ratios))
                rep.record_sample_tensor(
                    catalog.IS_RATIO_LOWEST, _array(ratios), score="min", k=4,
                    payload=[f"{long} #{d}.{i}" if i == 2 else f"prompt {d}.{i}"
                             for i in range(4)])
                rep.end_step(step)
            for rep in reps:
                assert rep.flush(5)
        hooks = wait_for(lambda: receiver.accepted("/hook"), 10, "the ISRatioStale webhook")
        (alert,) = [a for a in hooks[0].body["alerts"] if a["alert"] == "ISRatioStale"]
        samples = alert["worst_samples"]
        assert samples["metric"] == catalog.IS_RATIO_LOWEST
        assert [i["id"] for i in samples["items"]] == ["dp1/2", "dp1/0", "dp1/1"][:NOTIFY_ITEMS]
        assert [i["score"] for i in samples["items"]] == [0.01, 0.02, 0.05]
        assert len(samples["items"][0]["payload"]) == NOTIFY_CHARS  # cut, with an ellipsis
        # the command names the service's state directory, so it runs as quoted (below)
        more = samples["more"]
        assert more == f"rlmon samples grpo --role actor --step 1 --state-dir {tmp_path.resolve()}"
        scrape = generate_latest(build_registry(service.metrics, process=False)).decode()
        assert 'rlmon_actor_is_ratio_lowest{role="actor",run="grpo"} 0.01' in scrape
        assert "stale prompt" not in scrape and "dp1/" not in scrape  # items are never labels
    finally:
        for rep in reps:
            rep.close()
        service.close()
        receiver.stop()

    assert main(shlex.split(more)[1:]) == 0
    assert "dp1/2" in capsys.readouterr().out
    assert main(["samples", "grpo", "--alert", "ISRatioStale", "--state-dir",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ISRatioStale fired at grpo/actor step 1" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:2].strip().isdigit()]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("1", "0.01", "dp1/2"), ("2", "0.02", "dp1/0"), ("3", "0.05", "dp1/1"),
        ("4", "0.9", "dp0/0")]
    assert main(["samples", "grpo", "--step", "1", "--json", "--state-dir",
                 str(tmp_path)]) == 0
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["items"][0]["payload"] == f"{long} #1.2"  # whole in the store
    assert main(["samples", "grpo", "--step", "7", "--state-dir", str(tmp_path)]) == 1


def _array(rows: list[list[float]]) -> object:
    import numpy as np

    return np.array(rows)


def test_slack_pagerduty_and_console_carry_the_samples_and_the_command() -> None:
    event = AlertEvent("grpo", "actor", 4, "LogprobMismatch", "warning", "firing",
                       catalog.LOGP_DIFF, 0.4, samples_metric=catalog.LOGP_DIFF_WORST,
                       samples=((2.5, "dp1/7", "Question: 2+2?\nAnswer: <think>"),))
    slack = json.dumps(slack_body([event], None, "rlmon"))
    assert "dp1/7" in slack and "Question: 2+2? Answer: &lt;think&gt;" in slack
    assert "rlmon samples grpo --role actor --step 4" in slack
    console = io.StringIO()
    ConsoleNotifier(console).send(webhook_body([event], None))
    assert "worst samples (actor/logp_diff_worst):\n      1. dp1/7  2.5  Question: 2+2? " \
        "Answer: <think>" in console.getvalue()
    details = pagerduty_body(event, {}, "g", None)["payload"]["custom_details"]
    assert details["worst_samples"]["items"] == [
        {"score": 2.5, "id": "dp1/7", "payload": "Question: 2+2?\nAnswer: <think>"}]


def test_rlmon_samples_does_not_import_ray(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite")
    store.add([_record(0, ((0.5, "a", "text"),))])
    store.close()
    code = ("import sys; from rlmon.cli import main; "
            f"rc = main(['samples', 'grpo', '--state-dir', {str(tmp_path)!r}]); "
            "assert 'ray' not in sys.modules; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "a" in done.stdout and "text" in done.stdout
