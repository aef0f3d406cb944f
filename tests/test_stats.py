"""fedlib.stats against scipy's own results and against the textbook formulas fedlib used before
(so that the reported intervals did not move)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedlib.privacy.membership import bootstrap_auc_ci, roc_auc
from fedlib.stats import bootstrap_interval, clopper_pearson, t_interval


def test_t_interval_is_scipys_and_the_textbook_formula():
    rng = np.random.default_rng(0)
    for size in (2, 3, 8, 48, 191):
        x = rng.normal(0.3, 2.0, size)
        mean, lo, hi = t_interval(x, 0.9)
        ci = stats.ttest_rel(x + 1.0, np.ones(size)).confidence_interval(0.9)  # paired form, same differences
        assert (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-12, abs=1e-12)
        half = stats.t.ppf(0.95, size - 1) * x.std(ddof=1) / math.sqrt(size)
        assert (mean, lo, hi) == pytest.approx((x.mean(), x.mean() - half, x.mean() + half), rel=1e-12, abs=1e-12)
    assert t_interval([0.1, 0.1, 0.1]) == (pytest.approx(0.1),) * 3
    with pytest.raises(ValueError, match="at least 2"):
        t_interval([1.0])


@pytest.mark.parametrize("n", [1, 2, 16, 32, 61, 1000])
def test_clopper_pearson_equals_the_beta_quantiles(n):
    # the exact interval's ends are beta quantiles (the formula fedlib computed by hand before)
    for k in sorted({0, 1, n // 3, n - 1, n} & set(range(n + 1))):
        lo = 0.0 if k == 0 else stats.beta.ppf(0.025, k, n - k + 1)
        hi = 1.0 if k == n else stats.beta.ppf(0.975, k + 1, n - k)
        assert clopper_pearson(k, n) == pytest.approx((lo, hi), abs=1e-11)
        one_lo = 0.0 if k == 0 else stats.beta.ppf(0.1, k, n - k + 1)
        one_hi = 1.0 if k == n else stats.beta.ppf(0.9, k + 1, n - k)
        assert clopper_pearson(k, n, 0.9, "lower") == pytest.approx((one_lo, 1.0), abs=1e-11)
        assert clopper_pearson(k, n, 0.9, "upper") == pytest.approx((0.0, one_hi), abs=1e-11)
    with pytest.raises(ValueError, match="side"):
        clopper_pearson(0, n, side="left")
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson(n + 1, n)


def test_bootstrap_auc_is_scipys_bootstrap_of_roc_auc():
    rng = np.random.default_rng(1)
    pos, neg = rng.normal(1, 1, 25), rng.normal(0, 1, 31)
    ours = bootstrap_auc_ci(pos, neg, n_boot=400, seed=5)
    # scipy's bootstrap calling the plain (unvectorised) AUC on each resample, same seed
    ref = stats.bootstrap((pos, neg), lambda a, b: roc_auc(a, b), n_resamples=400, method="percentile",
                          vectorized=False, rng=np.random.default_rng(5)).confidence_interval
    assert ours == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert ours == bootstrap_auc_ci(pos, neg, n_boot=400, seed=5)  # seeded
    assert ours[0] < roc_auc(pos, neg) < ours[1]


def test_bootstrap_interval_of_a_mean_covers():
    rng = np.random.default_rng(2)
    x = rng.normal(5.0, 1.0, 200)
    lo, hi = bootstrap_interval((x,), np.mean, n_resamples=1000, seed=0)
    assert lo < 5.0 < hi and hi - lo < 0.5
