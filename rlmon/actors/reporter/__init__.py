"""The worker-side client (no Ray import): what a training process calls and what travels from it.

The :class:`Reporter` facade runs on the training thread; its sender thread packs each step and
delivers it to a sink; beside them, batched tensor statistics, worst-sample capture, hardware
sampling and rank detection.
"""

from rlmon.actors.reporter.facade import Reporter

__all__ = ["Reporter"]
