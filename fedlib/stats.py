"""The intervals fedlib reports, each on scipy's own implementation.

* :func:`t_interval`: Student's t interval for a mean (``scipy.stats.ttest_1samp``; a paired
  comparison passes its differences, which is what ``ttest_rel`` tests).
* :func:`clopper_pearson`: the exact binomial interval (``scipy.stats.binomtest(...).proportion_ci``).
* :func:`bootstrap_interval`: a seeded percentile bootstrap of any statistic of one or more
  independent samples (``scipy.stats.bootstrap``, each sample resampled on its own).

Every function returns plain floats, so results serialise to JSON as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

#: clopper_pearson's sides -> binomtest's alternatives (a lower bound tests "greater")
_ALTERNATIVE = {"two-sided": "two-sided", "lower": "greater", "upper": "less"}


def t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, lower, upper): Student's t interval for the mean of independent values (e.g. one
    figure per client, or paired differences); needs at least 2 values."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {x.size}")
    mean = float(x.mean())
    if np.ptp(x) == 0:  # a constant sample: zero width (scipy would warn of precision loss in its variance)
        return mean, mean, mean
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(confidence)
    return mean, float(ci.low), float(ci.high)


def clopper_pearson(k: int, n: int, confidence: float = 0.95, side: str = "two-sided") -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for a binomial proportion k/n.

    ``side="two-sided"``: equal tails (1-confidence)/2; ``"lower"``: one-sided lower bound at
    level ``confidence`` (upper end 1); ``"upper"``: one-sided upper bound (lower end 0).
    """
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if side not in _ALTERNATIVE:
        raise ValueError(f"side must be two-sided, lower or upper, got {side!r}")
    ci = stats.binomtest(int(k), int(n), alternative=_ALTERNATIVE[side]).proportion_ci(confidence, method="exact")
    return float(ci.low), float(ci.high)


def bootstrap_interval(samples: Sequence, statistic: Callable, confidence: float = 0.95, n_resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(*samples, axis=-1)`` (vectorised over
    resamples along the last axis), each sample resampled independently (a stratified
    bootstrap when the samples are groups, e.g. members and non-members), seeded."""
    res = stats.bootstrap(tuple(np.asarray(s, dtype=np.float64) for s in samples), statistic,
                          n_resamples=n_resamples, confidence_level=confidence, method="percentile",
                          vectorized=True, paired=False, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
