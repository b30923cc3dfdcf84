"""PLD compositions that build each distinct one-step privacy-loss distribution once per process.

:func:`dpsad.privacy.accounting.compose_epsilon` asks dp-accounting's ``PLDAccountant`` for every composition
anew, and the accountant builds the one-step PLD of each component from scratch (about 0.3 s each, a pure
Python loop over the grid).  The verdict side composes the same components again and again: the budget of a
dataset composes every prefix of its releases (the same students, teachers and critics each time), and a run's
epsilon curve composes its components at ten fractions of their steps.  :func:`pld_epsilon` keeps the one-step
PLDs of this process, keyed by (noise multiplier, sample rate, grid), and composes them in the accountant's own
order with the accountant's own calls, so its result is the accountant's, bit for bit
(``tests/test_accounting.py`` compares them).

Assumptions: the accountant composes a ``ComposedDpEvent`` of ``SelfComposedDpEvent(PoissonSampledDpEvent(q,
GaussianDpEvent(sigma)), steps)`` as ``identity.compose(one_step(sigma, q).self_compose(steps))`` in the events'
order, with add-or-remove-one neighbours, and a PLD is not changed by composing it (dp-accounting 0.6: both
return new objects).  The noise calibration does not come here: it stays inside the DP mechanism's modules.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

from .accounting import PLD_DISCRETIZATION, AccountantError, SGMComponent, compose_epsilon, pld_grid


# A one-step PLD holds about 1 MB of grid here (0.2-1.3 MB at sigma 3 to 0.36): 64 of them bound the memory,
# and a job composes fewer distinct components than that (a dataset's budget: one to three a release).
@lru_cache(maxsize=64)
def _one_step(noise_multiplier: float, sample_rate: float, interval: float):
    from dp_accounting.pld import privacy_loss_distribution

    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier, value_discretization_interval=interval, sampling_prob=sample_rate,
        neighboring_relation=privacy_loss_distribution.NeighborRel.ADD_OR_REMOVE_ONE)


def pld_epsilon(components: list[SGMComponent], delta: float, pld_interval: float = PLD_DISCRETIZATION) -> float:
    """compose_epsilon(components, delta, "pld", pld_interval), with the one-step PLDs of this process reused.

    The same answers as :func:`compose_epsilon`: 0 for nothing to compose, inf for a component with sigma 0 and
    steps, :class:`AccountantError` where the accountant fails or gives NaN.
    """
    active = [c for c in components if c.steps > 0]
    if not active or any(c.noise_multiplier <= 0 for c in active):
        return compose_epsilon(components, delta, "pld", pld_interval=pld_interval)  # no PLD to build
    from dp_accounting.pld import privacy_loss_distribution

    interval = pld_grid(active, pld_interval)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            composed = privacy_loss_distribution.identity(value_discretization_interval=interval)
            for component in active:
                if component.sample_rate == 0:  # as the accountant: a step that samples nobody adds nothing
                    continue
                step = _one_step(float(component.noise_multiplier), float(component.sample_rate), interval)
                composed = composed.compose(step.self_compose(int(component.steps)))
            value = float(composed.get_epsilon_for_delta(delta))
        except (ValueError, RuntimeError, OverflowError, FloatingPointError, MemoryError) as err:
            raise AccountantError(f"the pld accountant failed on {active}: {err}") from err
    if math.isnan(value):
        raise AccountantError(f"the pld accountant returned NaN on {active}")
    return value
