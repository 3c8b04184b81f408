"""What runs in and beside the training job, on top of the pure-Python core (:mod:`rlmon.service`).

* ``reporter/``: the worker-side client a training process calls (the Reporter and its parts,
  tensor statistics, sample capture, hardware sampling, rank detection, Ray-free sinks); it
  never imports Ray.
* ``integrations/``: one adapter per framework (TRL, OpenRLHF, verl, SkyRL, DeepSpeed, vLLM)
  feeding a Reporter.
* The Ray side: the aggregator, node-merger and service actors, the runtime that finds or
  starts them (with the Reporter's Ray sink), and the demo job.
"""
