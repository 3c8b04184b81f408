"""The claims benchmark's parts (``bench/bench_claims.py``): runs generated with known truth
(:mod:`.runs`), written by the formats' own writers and read back as rlmon reads them
(:mod:`.formats`), scored sentence by sentence (:mod:`.score`), one module a claim kind under
:mod:`.kinds`, each registered by name (:mod:`.registry`).

A new claim kind: a module under ``bench/claims/kinds/`` with a function
``(seeds, fast) -> Score`` decorated ``@register("kind.name", "the sentence scored")``, its module
named in ``kinds/__init__.py``. Seeds are the bench's: the tuning set and the held-out set are
scored apart.
"""

from bench.claims.registry import KINDS, ClaimKind, register
from bench.claims.score import Score

__all__ = ["KINDS", "ClaimKind", "Score", "register"]
