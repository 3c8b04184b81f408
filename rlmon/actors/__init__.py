"""The Ray side of rlmon: the worker-side Reporter (``reporter/``, which itself never imports Ray),
the aggregator, node-merger and service actors, the runtime that finds or starts them, the
framework integrations and the demo job."""
