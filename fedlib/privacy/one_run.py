"""The one-run audit: Steinke, Nasr & Jagielski (2023), "Privacy Auditing with One (1) Training Run".

Game. m canaries, each put into the mechanism's input independently with probability 1/2 (S_i);
the mechanism runs once; the auditor scores every canary from the output, guesses "in" for the
``k_plus`` highest scores and "out" for the ``k_minus`` lowest, and abstains on the rest: r =
k_plus + k_minus guesses (fixed before the run), v of them correct.

Bound (their Theorem 3.1 for δ = 0 and the (ε, δ) analysis of their Appendix D). If the mechanism
is (ε, δ)-DP with respect to each canary, then with q = e^ε / (1 + e^ε), the accuracy of ε-DP
randomized response,

    P[V ≥ v] ≤ P[Binomial(r, q) ≥ v] + 2mδ · max_{i = 1..v} P[v − i ≤ Binomial(r, q) < v] / i,

so ε is rejected at confidence c when that p-value is below 1 − c. The p-value grows with ε, and
the lower bound is the largest ε still rejected (:func:`one_run_epsilon_lb`). Its ceiling, what
a perfect auditor (v = r) can show, depends only on r, m, δ and c (:func:`one_run_ceiling`):
about ln(r / ln(1/(1 − c))) at δ = 0 (r ≈ 20 000 guesses to reach ε = 8 at 95 %).

Unlike the threshold game of :func:`fedlib.privacy.membership.audit_epsilon`, one run of the
mechanism tests m canaries at once: the ceiling grows with the number of canaries, not with the
number of runs.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats
from scipy.special import expit


def _check(m: int, r: int, v: int, delta: float) -> None:
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got v={v}, r={r}, m={m}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta}")


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """P[at least ``v`` of ``r`` guesses correct] bounded for an (``epsilon``, ``delta``)-DP
    mechanism with ``m`` canaries (module docstring)."""
    _check(m, r, v, delta)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    q = float(expit(epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    below = np.cumsum(stats.binom.pmf(v - i, r, q))  # P[v - i <= B < v], i = 1..v
    return min(tail + 2.0 * m * delta * float(np.max(below / i)), 1.0)


def one_run_epsilon_lb(m: int, r: int, v: int, delta: float = 0.0, confidence: float = 0.95) -> float:
    """The ε lower bound of ``v`` correct of ``r`` guesses on ``m`` canaries at ``confidence``: the
    largest ε whose p-value (:func:`one_run_p_value`) is below 1 − confidence (bisection to 1e-6;
    the returned end is rejected, so the bound errs low). 0 when even ε = 0 is not rejected."""
    beta = 1.0 - confidence
    if not 0.0 < beta < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if one_run_p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < beta:  # ends: the p-value tends to 1 as ε grows
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if one_run_p_value(m, r, v, mid, delta) < beta else (lo, mid)
    return lo


def one_run_ceiling(m: int, r: int, delta: float = 0.0, confidence: float = 0.95) -> float:
    """The largest bound ``r`` guesses on ``m`` canaries can show: all of them correct."""
    return one_run_epsilon_lb(m, r, r, delta, confidence)


def guesses(scores, included, k_plus: int, k_minus: int) -> tuple[int, int]:
    """(r, v): guess "in" for the ``k_plus`` highest ``scores``, "out" for the ``k_minus`` lowest
    (ties by canary index), abstain on the rest; ``included`` (bool per canary) scores them."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included, dtype=bool).reshape(-1)
    if s.shape != inc.shape:
        raise ValueError(f"{s.size} scores for {inc.size} canaries")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > s.size:
        raise ValueError(f"need k_plus, k_minus >= 0 with k_plus + k_minus <= {s.size} canaries, "
                         f"got {k_plus} and {k_minus}")
    order = np.argsort(-s, kind="stable")
    top, bottom = order[:k_plus], order[s.size - k_minus:]
    return k_plus + k_minus, int(inc[top].sum() + (~inc[bottom]).sum())


def canaries_for_ceiling(epsilon: float, delta: float = 0.0, confidence: float = 0.95,
                         guess_fraction: float = 1.0, max_canaries: int = 2**20) -> int:
    """The fewest canaries (up to ``max_canaries``) whose ceiling, guessing ``guess_fraction`` of
    them, reaches ``epsilon``; ``ValueError`` when none does (at δ > 0 the 2mδ term caps the
    ceiling, so some ε are out of reach at any size)."""
    if not 0 < guess_fraction <= 1:
        raise ValueError(f"guess_fraction must be in (0, 1], got {guess_fraction}")

    def reaches(m: int) -> bool:
        return one_run_ceiling(m, max(1, math.floor(m * guess_fraction)), delta, confidence) >= epsilon

    hi = 1
    while not reaches(hi):
        if hi >= max_canaries:
            raise ValueError(f"no number of canaries up to {max_canaries} reaches ε = {epsilon} at δ = {delta}")
        hi = min(2 * hi, max_canaries)
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi
