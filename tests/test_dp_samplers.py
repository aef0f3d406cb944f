"""The DP noise sources and the exact discrete Gaussian sampler (fedlib.dp.samplers): the draws'
distribution against the closed-form pmf, computed here by direct summation, not by the sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

from fedlib.dp.samplers import (
    SECRET,
    SEEDED,
    NoiseSource,
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
)


def _chi_square_p(draws: np.ndarray, pmf, radius: int) -> float:
    """Goodness of fit of integer ``draws`` to ``pmf`` on -radius..radius (its mass outside is
    negligible): the cells of expected count >= 5, and the two tails as one cell each."""
    n = draws.size
    ys = np.arange(-radius, radius + 1)
    probs = np.array([pmf(int(y)) for y in ys])
    inner = np.flatnonzero(probs * n >= 5)
    lo, hi = inner[0], inner[-1]
    observed = [int((draws < ys[lo]).sum()), *[int((draws == ys[i]).sum()) for i in range(lo, hi + 1)],
                int((draws > ys[hi]).sum())]
    expected = np.array([probs[:lo].sum(), *probs[lo:hi + 1], probs[hi + 1:].sum()]) * n
    return float(chisquare(observed, expected * n / expected.sum()).pvalue)


def _discrete_gaussian_pmf(sigma: float):
    radius = int(40 * sigma) + 10
    norm = math.fsum(math.exp(-y * y / (2 * sigma * sigma)) for y in range(-radius, radius + 1))
    return lambda y: math.exp(-y * y / (2 * sigma * sigma)) / norm


@pytest.mark.parametrize("sigma", [0.7, 2.5, 7.3])
def test_exact_sampler_matches_the_closed_form_pmf(sigma):
    draws = NoiseSource(seed=3).discrete_gaussian(sigma, 20_000, "test", sigma)
    assert _chi_square_p(draws, _discrete_gaussian_pmf(sigma), int(40 * sigma) + 10) > 1e-3
    # exact second moment of N_Z(0, sigma^2) by summation: the sample variance within 5 standard errors
    pmf = _discrete_gaussian_pmf(sigma)
    radius = int(40 * sigma) + 10
    var = math.fsum(y * y * pmf(y) for y in range(-radius, radius + 1))
    fourth = math.fsum(y**4 * pmf(y) for y in range(-radius, radius + 1))
    se = math.sqrt((fourth - var * var) / draws.size)
    assert abs(float(np.mean(draws.astype(np.float64) ** 2)) - var) < 5 * se
    assert abs(float(draws.mean())) < 5 * math.sqrt(var / draws.size)


def test_secret_source_draws_the_same_distribution_and_never_repeats():
    source = NoiseSource()
    assert source.mode == SECRET and source.derive("client", 1) is source and source.secagg_seed("x") is None
    sigma = 1.9
    draws = source.discrete_gaussian(sigma, 20_000, "ignored")
    assert _chi_square_p(draws, _discrete_gaussian_pmf(sigma), 80) > 1e-6
    assert not np.array_equal(source.discrete_gaussian(50.0, 64), source.discrete_gaussian(50.0, 64))
    normal = source.normal((100_000,))
    assert abs(float(normal.mean())) < 0.02 and abs(float(normal.std()) - 1) < 0.02


def test_seeded_source_is_reproducible_and_names_its_parts():
    a, b = NoiseSource(seed=5), NoiseSource(seed=5)
    assert a.mode == SEEDED
    assert np.array_equal(a.discrete_gaussian(3.0, 100, "k"), b.discrete_gaussian(3.0, 100, "k"))
    assert not np.array_equal(a.discrete_gaussian(3.0, 100, "k"), a.discrete_gaussian(3.0, 100, "other"))
    assert a.derive("client", 0) == b.derive("client", 0) != a.derive("client", 1)


@pytest.mark.parametrize("num,den", [(0, 1), (3, 10), (1, 1), (27, 10)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(num, den):
    rng = NoiseSource(seed=num * 100 + den).integers()
    hits = sum(bernoulli_exp(num, den, rng) for _ in range(20_000))
    assert binomtest(hits, 20_000, math.exp(-num / den)).pvalue > 1e-3


def test_discrete_laplace_matches_its_pmf():
    t = 3
    rng = NoiseSource(seed=9).integers()
    draws = np.array([discrete_laplace(t, rng) for _ in range(20_000)])
    ratio = math.exp(-1 / t)
    pmf = lambda y: (1 - ratio) / (1 + ratio) * ratio ** abs(y)  # noqa: E731
    assert _chi_square_p(draws, pmf, 200) > 1e-3


def test_sampler_refuses_a_bad_sigma():
    with pytest.raises(ValueError, match="finite sigma"):
        discrete_gaussian(float("nan"), 3, NoiseSource(seed=0).integers())
    assert not discrete_gaussian(0.0, 3, NoiseSource(seed=0).integers()).any()
