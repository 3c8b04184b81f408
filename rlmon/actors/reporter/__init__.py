"""The worker-side client (no Ray import): what a training process calls and what travels from it.

On the training thread, :class:`Reporter` (``facade``) records sufficient statistics into a
step's accumulator (``accumulator``) and closes the step; on its sender thread, ``packer``
builds the step's StepMessage and ``delivery`` sends it (sequence numbers, retain until
acknowledged, incarnation probes, giving up), counting refusals in a ``tally``. ``sink`` holds
the sink protocol, the in-process and file sinks and the registry of open Reporters. Beside
them: batched tensor statistics (``tensor_stats``), worst-sample capture (``sample_capture``),
hardware sampling (``hardware``) and rank detection (``detect``); in a Ray actor, how the
actor's end reaches the service (``actor_end``).
"""

from rlmon.actors.reporter.actor_end import watch_methods
from rlmon.actors.reporter.facade import Reporter

__all__ = ["Reporter", "watch_methods"]
