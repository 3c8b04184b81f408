"""The service's spine: a batch of finalized steps or liveness views walks a line of stages
(:mod:`rlmon.service.spine.line`) and becomes one immutable verdict
(:mod:`rlmon.service.spine.verdict`) that the commit, the sinks and the stream memory read.
:class:`rlmon.service.service_core.ServiceCore` wires the stages and owns their lifecycle.
"""
