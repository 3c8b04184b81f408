"""The baseline detector's transform over a whole series (``baseline_batch.transform``, numpy
and ``math.log`` mapped in C) is ``baseline._transform`` value by value, bit for bit, on seeded
values with the awkward ones mixed in: NaN, infinities, negatives, both zeros, huge and tiny."""

from __future__ import annotations

import math
import random
import struct

import pytest

from rlmon.service.alerting import baseline, baseline_batch
from rlmon.service.metrics.spec import BaselineParams

_AWKWARD = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, -1e308, 1e308, 1.7e308, 5e-324,
            -5e-324, 1e-300, 2.0**-1074, 1.0, 3.0]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)  # NaN == NaN, -0.0 != 0.0 here


def _values(seed: int) -> list[float]:
    rng = random.Random(seed)
    values = [rng.choice((rng.gauss(0.0, 1.0), rng.lognormvariate(0.0, 3.0),
                          -rng.expovariate(1.0), rng.uniform(-1e-9, 1e-9)))
              for _ in range(2_000)]
    for value in _AWKWARD:
        values.insert(rng.randrange(len(values) + 1), value)
    return values


@pytest.mark.parametrize("log_offset", [None, 1.0, 1e-6, 0.5, 1e300])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_series_transform_is_the_scalar_one_bit_for_bit(log_offset: float | None,
                                                            seed: int) -> None:
    params = BaselineParams(direction="down", log_offset=log_offset)
    values = _values(seed)
    batch = baseline_batch.transform(params, values)
    assert len(batch) == len(values)
    scalar = [baseline._transform(params, v) for v in values]
    mismatched = [(v, s, b) for v, s, b in zip(values, scalar, batch.tolist(), strict=True)
                  if _bits(s) != _bits(b)]
    assert not mismatched, mismatched[:5]
    # the series takes the same numbers as the predictions' own transform
    series = baseline_batch.SeriesPredictions(params, values)
    assert [_bits(v) for v in series.transformed(0, len(values)).tolist()] == \
        [_bits(v) for v in scalar]


def test_a_value_the_scalar_transform_refuses_is_refused_alike() -> None:
    # log(0): with no offset to keep the logarithm's argument positive, both raise
    params = BaselineParams(direction="down", log_offset=0.0)
    with pytest.raises(ValueError, match="math domain error"):
        baseline._transform(params, -2.0)
    with pytest.raises(ValueError, match="math domain error"):
        baseline_batch.transform(params, [1.0, -2.0, 3.0])
