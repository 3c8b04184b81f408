"""Each rule condition defined once (:mod:`~rlmon.service.alerting.conditions.kind`): the live
check, the long-log batch path, the liveness alerts, the PromQL export and the words all dispatch
through the registry (:mod:`~rlmon.service.alerting.conditions.registry`)."""
