"""Forwarding to trackers: each finalized step's exact values, the run's settings, its alerts and
its end state, logged to W&B, MLflow and TensorBoard (config ``forward``, docs/configuration.md).

:class:`~rlmon.service.forward.sink.ForwardSink` is what the service feeds; each tracker has a
thread and a bounded queue of its own, so a tracker that is down or slow is retried and counted
without delaying an alert or another tracker.
"""
