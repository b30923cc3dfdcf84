"""What a released file states of its guarantee: the trainings it covers, and its numbers rounded up.

Failures prevented: a total of 2.00049 written "(2, delta)-DP" with ``:.4g`` stated less than the accountant's bound
(the JSON fields keep the exact values; the sentences a reader quotes round up); a synthetic file drawn from a
training that its privacy.json does not compose went out uncounted.  Imports nothing: readers of released files
need only h5py.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal


def rounded_up(value: float, digits: int = 4) -> str:
    """``value`` (at least 0) with ``digits`` significant digits in ``g`` form, rounded up: 2.00049 -> '2.001'."""
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        return f"{value:g}"
    exact = Decimal(repr(value))  # the shortest text that reads back as this float: 0.1 stays 0.1
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return f"{float(exact.quantize(step, rounding=ROUND_CEILING)):.{digits}g}"


def recorded_trainings(privacy: dict) -> list[str]:
    """The uids of the private uses a run's privacy.json composes, sorted: what its curator's-record row holds and
    what its synthetic.h5 states (``trainings``)."""
    return sorted(str(c.get("uid")) for c in privacy.get("components", []) if c.get("private"))


def recorded_public_trainings(privacy: dict) -> list[str]:
    """The uids of the trainings without noise on the public split (a public teacher, MoCo) a run's privacy.json
    composes, sorted: what its synthetic.h5 states (``public_trainings``).  Failure prevented: a ``public`` run's
    samples, kept by ``--touch`` after its teacher was trained again on another preparation's public split, going
    out under a statement of (0, 0) though that teacher read, without noise, records now private (its private
    trainings, ``[]``, match any)."""
    return sorted(str(c.get("uid")) for c in privacy.get("components", []) if not c.get("private"))
