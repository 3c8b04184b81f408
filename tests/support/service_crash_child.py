"""The service process of the crash-point tests (tests/test_crash_points.py).

``python service_crash_child.py STATE_DIR DESTINATION [live|stop]`` runs a real
:class:`ServiceCore` with one receiver (``slack`` through slack-sdk, or the generic ``webhook``;
its URL comes from the environment like any secret), publishes the steps of :data:`STEPS` one
call each, as an aggregator does, then shuts down gracefully (drains the outbox): ``live`` first
lets the delivery threads send everything, ``stop`` shuts down at once (the drain finds rows
pending). Run again on the same state
directory it is the restarted service receiving the aggregator's redelivery of every step.
``RLMON_CRASH_AT`` (rlmon.service.crash_points) kills it at a commit point on the way.
Exit status 0: drained; 1: notifications still pending after the drain timeout.
"""

from __future__ import annotations

import sys
import time

from rlmon.service.alerting.rules import default_rules
from rlmon.service.config import load_config
from rlmon.service.contract.step_record import StepRecord
from rlmon.service.metrics import catalog
from rlmon.service.service_core import ServiceCore

RUN = "crash"
IS_RATIO = catalog.get("actor/is_ratio").name
# ISRatioDivergence fires at steps 0 and 2 and resolves at steps 1 and 3: four transitions
STEPS = (3.0, 1.0, 3.0, 1.0)
TRANSITIONS = (("0", "firing"), ("1", "resolved"), ("2", "firing"), ("3", "resolved"))


def main(state_dir: str, destination: str, mode: str) -> int:
    settings = load_config(
        None, notifiers={"console": {"enabled": False}},
        routing={"critical": [destination], "warning": [destination]},
        outbox={"backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.2},
    )
    # without hysteresis (resolve after one good step) so that every step is a transition: the
    # crash points are about delivery, not about when an alert resolves
    rules = [r.model_copy(update={"resolve_after": 1}) for r in default_rules()]
    core = ServiceCore(settings, state_dir=state_dir, rules=rules).start()
    for n, ratio in enumerate(STEPS):
        core.publish([StepRecord(run=RUN, role="actor", step=n, complete=True, ranks_expected=1,
                                 ranks_reporting=1, missing_ranks=(), metrics={IS_RATIO: ratio},
                                 finalized_at=float(n))])
    deadline = time.monotonic() + 30.0
    while mode == "live" and core.dispatcher.outbox.pending() and time.monotonic() < deadline:
        time.sleep(0.02)  # the service runs on while its threads deliver
    return 0 if core.close(timeout=30.0) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3], sys.argv[3] if len(sys.argv) > 3 else "stop"))
