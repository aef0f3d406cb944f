"""The one-run audit (fedlib.privacy.one_run, Steinke, Nasr & Jagielski 2023) against its stated
properties: the p-value against an exact binomial sum, the ceiling against its closed form,
randomized-response canaries of an ε-DP mechanism stay below ε (at the stated confidence) and
those of a broken one go above the ε it claims."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedlib.privacy.one_run import (
    canaries_for_ceiling,
    guesses,
    one_run_ceiling,
    one_run_epsilon_lb,
    one_run_p_value,
)


def _tail(r: int, v: int, q: float) -> float:
    return sum(math.comb(r, j) * q**j * (1 - q) ** (r - j) for j in range(v, r + 1))


def test_p_value_is_the_binomial_tail_plus_the_delta_term():
    q = math.exp(1.0) / (1 + math.exp(1.0))
    assert one_run_p_value(50, 20, 15, 1.0) == pytest.approx(_tail(20, 15, q), rel=1e-12)
    # δ term: 2mδ · max_i P[v - i <= B < v] / i, computed term by term
    below = [sum(math.comb(20, j) * q**j * (1 - q) ** (20 - j) for j in range(15 - i, 15)) / i
             for i in range(1, 16)]
    assert one_run_p_value(50, 20, 15, 1.0, 1e-3) == pytest.approx(_tail(20, 15, q) + 2 * 50 * 1e-3 * max(below))
    assert one_run_p_value(50, 20, 0, 1.0) == 1.0
    with pytest.raises(ValueError, match="correct <= guesses <= canaries"):
        one_run_p_value(10, 20, 5, 1.0)


def test_bound_is_where_the_p_value_crosses_the_level():
    for m, r, v, delta in [(1000, 100, 90, 0.0), (1000, 100, 90, 1e-5), (200, 200, 130, 0.0)]:
        eps = one_run_epsilon_lb(m, r, v, delta, 0.95)
        assert eps > 0
        assert one_run_p_value(m, r, v, eps, delta) < 0.05 <= one_run_p_value(m, r, v, eps + 2e-6, delta)
    assert one_run_epsilon_lb(1000, 100, 50) == 0.0  # chance accuracy rejects nothing


def test_ceiling_closed_form_and_sizes():
    # δ = 0, all r correct: q^r = 1 - confidence, so ε = ln(q / (1 - q)) with q = 0.05^(1/r)
    for r in (10, 100, 1000, 10000):
        q = 0.05 ** (1 / r)
        assert one_run_ceiling(r, r) == pytest.approx(math.log(q / (1 - q)), abs=2e-6)
    assert one_run_ceiling(20000, 20000, 1e-5) < one_run_ceiling(20000, 20000)  # δ costs
    m = canaries_for_ceiling(8.0)
    assert one_run_ceiling(m, m) >= 8.0 > one_run_ceiling(m - 1, m - 1)
    # at δ = 1e-5 the 2mδ term caps the ceiling near 8.2: ε = 10 is out of reach
    with pytest.raises(ValueError, match="no number of canaries"):
        canaries_for_ceiling(10.0, 1e-5, max_canaries=2**16)


def test_guesses_take_the_most_confident():
    scores = [0.9, 0.1, 0.5, 0.8, 0.2, 0.3]
    included = [True, False, True, False, False, True]
    assert guesses(scores, included, 2, 2) == (4, 3)  # in: 0 (yes), 3 (no); out: 1 (yes), 4 (yes)
    with pytest.raises(ValueError, match="k_plus"):
        guesses(scores, included, 4, 3)


def _audit(scores, included, delta):
    r, v = guesses(scores, included, included.size // 2, included.size // 2)
    return one_run_epsilon_lb(included.size, r, v, delta)


def _randomized_response_run(rng, m, epsilon):
    """One run of the ε-DP randomized response on m canaries: each reports its inclusion bit,
    flipped with probability 1/(1 + e^ε); the auditor's score is the reported bit (ties random)."""
    included = rng.random(m) < 0.5
    keep = rng.random(m) < math.exp(epsilon) / (1 + math.exp(epsilon))
    reported = np.where(keep, included, ~included)
    return reported + 0.01 * rng.random(m), included


@pytest.mark.parametrize("delta", [0.0, 1e-5])
def test_dp_canaries_stay_below_epsilon_broken_ones_exceed_it(delta):
    rng = np.random.default_rng(0)
    m, epsilon, trials = 1000, 1.0, 200
    honest = [_audit(*_randomized_response_run(rng, m, epsilon), delta) for _ in range(trials)]
    # the bound holds at 95 %: at most ~5 % of runs may exceed ε (binomial slack: 18 of 200 is p < 1e-3)
    assert sum(e > epsilon for e in honest) <= 18
    assert np.median(honest) > 0.7 * epsilon  # and it is near-tight for randomized response at this size
    # a mechanism that claims ε = 1 but runs randomized response at ε = 3 is caught in every run
    broken = [_audit(*_randomized_response_run(rng, m, 3.0), delta) for _ in range(20)]
    assert min(broken) > epsilon
