"""What runs in and beside the training job, on top of the pure-Python core (:mod:`rlmon.service`).

* ``reporter/``: the worker-side client a training process calls (the Reporter and its parts,
  tensor statistics, sample capture, hardware sampling, rank detection, Ray-free sinks); it
  never imports Ray.
* ``integrations/``: one adapter per framework (TRL, OpenRLHF, verl, SkyRL, DeepSpeed, vLLM)
  feeding a Reporter.
* The Ray side: the aggregator, node-merger and service actors, the runtime that finds or
  starts them (with the Reporter's Ray sink), and the demo job.
"""

import importlib.util
from typing import Any

from rlmon.actors.reporter.sink import ReportSink, set_default_sink


def _ray_sink(namespace: str, *, start_service: bool, options: Any) -> ReportSink:
    """A Reporter's default sink: the namespace's aggregator on Ray. Imported here, in the package
    that holds both the client and the Ray shell, so that neither imports the other upward."""
    try:
        ray_missing = importlib.util.find_spec("ray") is None
    except ImportError:
        ray_missing = True
    if ray_missing:  # said now, not by the sender thread's first send
        raise ModuleNotFoundError(
            "rlmon: a Reporter without sink= sends to Ray, and Ray is not installed here: "
            "pip install 'rlmon[service]' (or give it a sink: JsonlSink, LocalSink)", name="ray")
    from rlmon.actors.runtime import RaySink

    return RaySink(namespace, start_service=start_service, options=options)


set_default_sink(_ray_sink)
