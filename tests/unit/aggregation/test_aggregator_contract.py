"""The aggregator enforces the contract on messages from any producer, not only a Reporter:
a bad message is counted and rejected with a named field, the rest of the batch is kept."""

from __future__ import annotations

import numpy as np
import pytest

from rlmon.service.aggregation.aggregator import AggregatorCore
from rlmon.service.contract.step_message import Columns, StepMessage, columns_from_states
from rlmon.service.metrics.partial import Partial
from rlmon.service.metrics.rank import Rank, World
from rlmon.service.metrics.spec import Form

_GOOD = columns_from_states({"actor/loss": (Form.MEAN, (2.0, 1.0))})


def _msg(**overrides: object) -> StepMessage:
    fields: dict[str, object] = dict(run="r", role="actor", step=0, rank=Rank(), world=World(),
                                     seq=1, time=0.0, columns=_GOOD)
    fields.update(overrides)
    return StepMessage(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("bad", "field"), [
    (_msg(run="a b"), "run"),
    (_msg(run=""), "run"),
    (_msg(role="Actor"), "role"),
    (_msg(step=-1), "step"),
    (_msg(step=2**53), "step"),
    (_msg(rank=Rank(dp=3), world=World(dp=2)), "rank"),
    (_msg(columns=columns_from_states({"actor/loss": (Form.MEAN, (2.0, -1.0))})),
     "metrics.actor/loss"),
    (_msg(columns=columns_from_states({"user/m": (Form.MOMENTS, (1.0, 1.0, -4.0))})),
     "metrics.user/m"),
    (_msg(columns=columns_from_states({"bad\nname": (Form.SUM, (1.0,))})), "metrics"),
    (_msg(columns=None, partials=((0, {"user/v": Partial(Form.MEAN, (1.0, -2.0))}),)),
     "metrics.user/v"),
    (_msg(columns=Columns(_GOOD.schema, np.zeros((2, 3)))), "metrics"),
])
def test_a_message_breaking_the_contract_is_rejected_and_the_rest_kept(
    bad: StepMessage, field: str,
) -> None:
    core = AggregatorCore()
    good = _msg(run="ok", step=0)
    ack = core.ingest([bad, good])
    assert ack.rejected == 1 and ack.accepted == 1
    assert f": {field}:" in ack.errors[0]
    assert core.counters.rejected == 1
    (record,) = core.pending_records()
    assert record.run == "ok" and record.metrics["actor/loss"] == 2.0
