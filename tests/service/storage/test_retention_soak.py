"""An hour of the service on a simulated clock keeps its memory and its store flat (a soak: slow, in
the service layer)."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from rlmon.service.config import Settings
from rlmon.service.service_core import ServiceCore
from rlmon.service.spine.sinks import SanitySink
from tests.support.clock import FakeClock
from tests.unit.storage.test_retention import IS_RATIO, T0, step

pytestmark = pytest.mark.slow


def _sizes(core: ServiceCore) -> dict[str, int]:
    memory, engine = core.spine.memory, core.spine.judge.engine
    sanity = core.spine.sinks[SanitySink]
    return {
        "streams": len(memory.tracker), "runs": memory.tracker.runs,
        "alert_states": len(engine.states), "last_steps": len(engine.last_step),
        "sanity": len(sanity.checkers), "run_info": len(memory.run_info),
        "relayed": len(sanity.relayed), "exporter_series": core.metrics.series,
    }


def test_soak_one_simulated_hour_memory_and_disk_stay_flat(tmp_path: Path) -> None:
    """A new run every minute (two roles, ten metric names of its own, a firing and a resolve
    now and then) lives four minutes; half say they finished, half just stop. Retention keeps 10
    minutes of history. Measured after 15 minutes (steady state) and after 60."""
    clock = FakeClock(T0)
    config = Settings.model_validate({
        "notifiers": {"console": {"enabled": False}},
        "exporter": {"run_ttl_seconds": 300, "finished_run_ttl_seconds": 60},
        "retention": {"history_steps": 20, "history_days": 600 / 86_400,
                      "stream_ttl_seconds": 300, "finished_ttl_seconds": 60,
                      "max_streams": 1_000, "every_seconds": 30},
    })
    core = ServiceCore(config, state_dir=tmp_path, clock=clock).start()
    tracemalloc.start()
    marks: dict[int, tuple[int, int, dict[str, int]]] = {}
    try:
        for tick in range(0, 3_601, 10):
            clock.now = T0 + tick
            born = range(max(0, tick // 60 - 3), tick // 60 + 1)  # runs alive now
            for r in born:
                run, n = f"soak-{r}", (tick - 60 * r) // 10
                if n == 24 and r % 2 == 0:
                    core.finish_run(run)
                if n >= 24:
                    continue
                own = {f"custom/{run}/m{j}": float(n + j) for j in range(10)}
                ratio = 3.0 if n % 8 == 3 else 1.0
                for role in ("actor", "rollout"):
                    core.publish([step(run, n, clock.now, role, **{IS_RATIO: ratio}, **own)])
            if tick in (900, 3_600):
                gc.collect()
                marks[tick] = (tracemalloc.get_traced_memory()[0], core.history.size_bytes(),
                               _sizes(core))
    finally:
        tracemalloc.stop()
        core.close()
    (mem0, disk0, sizes0), (mem1, disk1, sizes1) = marks[900], marks[3_600]
    print(f"\nsoak: memory {mem0 / 1024:.0f} KiB at 15 min, {mem1 / 1024:.0f} KiB at 60 min; "
          f"disk {disk0 / 1024:.0f} KiB, {disk1 / 1024:.0f} KiB; structures {sizes0} -> {sizes1};"
          f" removed {dict(core.spine.memory.removed)}")
    assert sizes1 == sizes0
    assert mem1 <= mem0 * 1.1 + 256 * 1024, (mem0, mem1)
    assert disk1 <= disk0 * 1.1 + 64 * 1024, (disk0, disk1)
    removed = core.spine.memory.removed
    assert removed["history_runs"] >= 40 and removed["streams_forgotten"] >= 80
