"""Finding or starting rlmon's actors on a Ray cluster, and the Reporter's Ray sink.

Actors are named in the namespace given to the Reporter (``rlmon`` by default): the service
``rlmon-service`` and one aggregator per shard, ``rlmon-aggregator-<i>``. A (run, role) always
maps to the same shard. ``get_if_exists`` makes concurrent starts from many ranks race-free.

One module per concept:

* :mod:`~rlmon.actors.runtime.names`: the actors' names and the shard of a stream;
* :mod:`~rlmon.actors.runtime.options`: how to start the runtime, and where its state lives;
* :mod:`~rlmon.actors.runtime.held`: what this process holds (one runtime per namespace);
* :mod:`~rlmon.actors.runtime.connect`: joining a Ray cluster, or starting a local Ray;
* :mod:`~rlmon.actors.runtime.no_auto_init`: rlmon's calls never start Ray by Ray's auto-init;
* :mod:`~rlmon.actors.runtime.start`: finding or starting the service and its aggregators;
* :mod:`~rlmon.actors.runtime.console`: what rlmon prints, and the service's console relay;
* :mod:`~rlmon.actors.runtime.sink`: the Reporter's Ray sink;
* :mod:`~rlmon.actors.runtime.shutdown`: the graceful stop of a namespace's runtime;
* :mod:`~rlmon.actors.runtime.at_exit`: the exit flush;
* :mod:`~rlmon.actors.runtime.local_ray`: stopping the local Ray rlmon started, whole.

Importing this package imports no Ray (only calling into it does).
"""

from rlmon.actors.runtime.at_exit import before_exit_flush
from rlmon.actors.runtime.held import Runtime, RuntimeGone, runtime_of
from rlmon.actors.runtime.names import AGGREGATOR, SERVICE, aggregator_name, shard_of
from rlmon.actors.runtime.options import RuntimeOptions, default_state_dir
from rlmon.actors.runtime.shutdown import shutdown_runtime
from rlmon.actors.runtime.sink import RaySink
from rlmon.actors.runtime.start import ensure_runtime, metrics_url, node_merger

__all__ = [
    "AGGREGATOR",
    "SERVICE",
    "RaySink",
    "Runtime",
    "RuntimeGone",
    "RuntimeOptions",
    "aggregator_name",
    "before_exit_flush",
    "default_state_dir",
    "ensure_runtime",
    "metrics_url",
    "node_merger",
    "runtime_of",
    "shard_of",
    "shutdown_runtime",
]
