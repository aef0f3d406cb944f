"""Membership inference against shared masks: scoring, ROC statistics, confidence
intervals and the empirical ε lower bound an attack implies.

Conventions: a *score* is higher for "more likely a member"; an attack predicts "member"
iff ``score >= threshold``. Members are the positives.

Contents
--------
* ROC: :func:`roc_auc` (exact Mann-Whitney, ties count 1/2), :func:`roc_curve`,
  :func:`tpr_at_fpr` (with an explicit note when the target FPR is below the resolution
  1/n_nonmembers of the data), :func:`bootstrap_auc_ci`, :func:`auc_ci` (bootstrap, or the
  exact :func:`separated_auc_bound` at perfect separation).
* Intervals: :mod:`fedlib.stats` (Clopper-Pearson, t, bootstrap; on scipy).
* DP auditing: :func:`epsilon_lower_bound` (Jagielski et al. 2020; Nasr et al. 2021) from
  a confusion matrix, its ceiling at a game size (:func:`epsilon_ceiling`, the bound of a perfect
  attack), :func:`audit_epsilon` from scores with a threshold chosen on a
  held-out split (choosing it on the evaluation data would bias the bound upwards).
* LiRA-style attack (Carlini et al. 2022): :func:`lira_scores` over generic per-target
  shadow statistics; :func:`target_direction` / :func:`direction_statistic` turn masks
  into such a statistic (agreement of an observed mask with the direction in which a
  target sample moves the mask).
* The FedPrLLM paper's "signal strength" (App. C): :func:`signal_strength`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from fedlib.privacy.similarity import hamming_fraction, hamming_total, mean_pairwise_hamming
from fedlib.stats import bootstrap_interval, clopper_pearson

# --------------------------------------------------------------------------- ROC


def _as_1d(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise ValueError("empty score array")
    if np.isnan(a).any():
        raise ValueError("scores contain NaN")
    return a


def roc_auc(scores_members, scores_nonmembers) -> float:
    """Exact ROC AUC = P(score_member > score_nonmember) + 1/2 P(equal), computed from
    mid-ranks (the Mann-Whitney U statistic divided by n_members * n_nonmembers)."""
    pos, neg = _as_1d(scores_members), _as_1d(scores_nonmembers)
    ranks = stats.rankdata(np.concatenate([pos, neg]))  # average ranks for ties
    u = ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2.0
    return float(u / (pos.size * neg.size))


def roc_curve(scores_members, scores_nonmembers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds) for the rule "member iff score >= threshold", one point per
    distinct score value in decreasing order, starting at threshold=+inf (0, 0) and ending
    at the lowest score (1, 1). The trapezoidal area under it equals :func:`roc_auc`."""
    pos, neg = _as_1d(scores_members), _as_1d(scores_nonmembers)
    thresholds = np.unique(np.concatenate([pos, neg]))[::-1]
    pos_sorted, neg_sorted = np.sort(pos), np.sort(neg)
    # number of scores >= t = n - (number of scores < t)
    tp = pos.size - np.searchsorted(pos_sorted, thresholds, side="left")
    fp = neg.size - np.searchsorted(neg_sorted, thresholds, side="left")
    tpr = np.concatenate([[0.0], tp / pos.size])
    fpr = np.concatenate([[0.0], fp / neg.size])
    return fpr, tpr, np.concatenate([[np.inf], thresholds])


@dataclass
class TprAtFpr:
    """Result of :func:`tpr_at_fpr`. ``fpr`` is the FPR actually achieved (<= target)."""

    tpr: float
    fpr: float
    threshold: float
    target_fpr: float
    tp: int
    fp: int
    n_members: int
    n_nonmembers: int
    #: False when n_nonmembers < 1/target_fpr: the only FPR <= target the data can show
    #: is 0, so the reported TPR is "TPR at FPR = 0", not at the target.
    resolvable: bool
    #: the smallest non-zero FPR these data can measure (1 / n_nonmembers)
    min_nonzero_fpr: float
    note: str


def tpr_at_fpr(scores_members, scores_nonmembers, fpr: float) -> TprAtFpr:
    """Highest TPR over thresholds whose empirical FPR is <= ``fpr``.

    Threshold rule: among the :func:`roc_curve` thresholds (member iff score >= t) take the
    lowest t with FP/n_nonmembers <= fpr; ties at t are all called members, so the
    achieved FPR can be below the target. With fewer than 1/fpr non-members the target is
    not resolvable: the result is the TPR at FPR 0 and ``resolvable`` is False (say so when
    reporting). The threshold is picked on the same scores it is evaluated on, so this is
    the usual (slightly optimistic) in-sample figure of the MIA literature; the TPR's
    sampling error is :func:`clopper_pearson` ``(tp, n_members)``.
    """
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr}")
    pos, neg = _as_1d(scores_members), _as_1d(scores_nonmembers)
    fprs, tprs, thr = roc_curve(pos, neg)
    ok = np.nonzero(fprs <= fpr + 1e-12)[0]
    i = ok[-1]  # fprs is non-decreasing along the curve, so the last admissible is best
    resolvable = neg.size * fpr >= 1.0 - 1e-9 or fpr == 0.0
    note = ""
    if not resolvable:
        note = (
            f"only {neg.size} non-members: FPR resolution is {1 / neg.size:.3g} > target "
            f"{fpr:g}; reported TPR is at FPR={fprs[i]:g}"
        )
    return TprAtFpr(
        tpr=float(tprs[i]),
        fpr=float(fprs[i]),
        threshold=float(thr[i]),
        target_fpr=float(fpr),
        tp=int(round(tprs[i] * pos.size)),
        fp=int(round(fprs[i] * neg.size)),
        n_members=pos.size,
        n_nonmembers=neg.size,
        resolvable=bool(resolvable),
        min_nonzero_fpr=1.0 / neg.size,
        note=note,
    )


def _auc_along(pos: np.ndarray, neg: np.ndarray, axis: int = -1) -> np.ndarray:
    """:func:`roc_auc` of every resample along ``axis`` (mid-ranks, as there)."""
    ranks = stats.rankdata(np.concatenate([pos, neg], axis=axis), axis=axis)
    n_pos, n_neg = pos.shape[axis], neg.shape[axis]
    u = np.take(ranks, np.arange(n_pos), axis=axis).sum(axis=axis) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def bootstrap_auc_ci(
    scores_members,
    scores_nonmembers,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval for the AUC, resampling members and non-members
    separately (stratified), seeded (:func:`fedlib.stats.bootstrap_interval`)."""
    pos, neg = _as_1d(scores_members), _as_1d(scores_nonmembers)
    return bootstrap_interval((pos, neg), _auc_along, confidence, n_boot, seed)


def separated_auc_bound(n_members: int, n_nonmembers: int, confidence: float = 0.95) -> float:
    """Exact lower confidence bound on the true AUC when every member outscores every non-member.

    The bootstrap degenerates to [1, 1] at perfect separation (every resample is separated too)
    and the Hanley–McNeil standard error is 0 at AUC = 1, so neither says how low the true AUC
    can be. Here: n = min(n_members, n_nonmembers) disjoint (member, non-member) pairs are
    independent trials, each won (member scores higher) with probability AUC; all n were won, so
    the Clopper–Pearson lower end for n successes of n, (α/2)^(1/n) with α = 1 − confidence
    (the lower end of the two-sided interval), is an exact bound. It uses only n of the n_m·n_n
    pairs, so it is conservative (valid, not tight).
    """
    n = min(n_members, n_nonmembers)
    if n < 1:
        raise ValueError("need members and non-members")
    return clopper_pearson(n, n, confidence)[0]


def auc_ci(scores_members, scores_nonmembers, confidence: float = 0.95, n_boot: int = 2000,
           seed: int = 0) -> tuple[float, float]:
    """AUC interval: :func:`bootstrap_auc_ci`, except at perfect separation (AUC 1 or 0), where
    the bootstrap is degenerate and the bound on the separated side is
    :func:`separated_auc_bound` (AUC = 1: [bound, 1]; AUC = 0: [0, 1 − bound])."""
    pos, neg = _as_1d(scores_members), _as_1d(scores_nonmembers)
    auc = roc_auc(pos, neg)
    if auc in (0.0, 1.0):
        bound = separated_auc_bound(pos.size, neg.size, confidence)
        return (bound, 1.0) if auc == 1.0 else (0.0, 1.0 - bound)
    return bootstrap_auc_ci(pos, neg, confidence, n_boot, seed)


# --------------------------------------------------------------------------- DP auditing


def epsilon_lower_bound(
    tp: int, fn: int, fp: int, tn: int, confidence: float = 0.95, delta: float = 0.0
) -> float:
    """Empirical lower bound on the ε of an (ε, δ)-DP mechanism from a membership test's
    confusion matrix (Jagielski et al. 2020; Nasr et al. 2021).

    Any (ε, δ)-DP mechanism forces TPR <= e^ε FPR + δ and 1-FPR <= e^ε (1-TPR) + δ for
    every test, so ε >= max(ln((TPR-δ)/FPR), ln((1-FPR-δ)/(1-TPR))). Sampling error is
    handled with Clopper-Pearson: TPR is replaced by its lower and FPR by its upper bound,
    each one-sided at level 1-(1-confidence)/2 (i.e. the ends of two-sided intervals at
    ``confidence``), so both hold jointly with probability >= ``confidence``. The second
    form uses the same two bounds (the CP upper bound of 1-TPR is 1 minus the CP lower
    bound of TPR), so taking the max costs no extra confidence. Returns 0 when neither is
    positive (the data show no leakage at this confidence).
    """
    n_pos, n_neg = tp + fn, fp + tn
    if min(tp, fn, fp, tn) < 0 or n_pos == 0 or n_neg == 0:
        raise ValueError("need non-negative counts with members and non-members")
    tpr_lo, _ = clopper_pearson(tp, n_pos, confidence, "two-sided")
    _, fpr_hi = clopper_pearson(fp, n_neg, confidence, "two-sided")
    fnr_hi = 1.0 - tpr_lo
    tnr_lo = 1.0 - fpr_hi
    candidates = []
    if tpr_lo - delta > 0 and fpr_hi > 0:
        candidates.append(math.log((tpr_lo - delta) / fpr_hi))
    if tnr_lo - delta > 0 and fnr_hi > 0:
        candidates.append(math.log((tnr_lo - delta) / fnr_hi))
    return max([0.0, *candidates])


def epsilon_ceiling(n_members: int, n_nonmembers: int, confidence: float = 0.95, delta: float = 0.0) -> float:
    """The largest bound :func:`epsilon_lower_bound` can give for a game of ``n_members`` members
    and ``n_nonmembers`` non-members: that of a perfect attack (TP = n_members, FP = 0).

    The bound only grows as TP grows or FP falls (the Clopper-Pearson lower end of TPR rises with
    TP, the upper end of FPR falls with FP, and both forms are monotone in them), so no attack,
    however strong, can show more at this size; an audited ε above it is impossible, and a proven
    ε above it cannot be refuted by this game. Closed form at δ = 0: with a = (1 - confidence)/2,
    ln(a^(1/n_m) / (1 - a^(1/n_n))) (the larger of this and its mirror image).
    """
    return epsilon_lower_bound(n_members, 0, 0, n_nonmembers, confidence, delta)


def audit_ceilings(n_members: int, n_nonmembers: int, confidence: float = 0.95, delta: float = 0.0,
                   select_fraction: float = 0.5) -> dict:
    """:func:`epsilon_ceiling` of both of :func:`audit_epsilon`'s constructions: ``lr1`` (an a-priori
    threshold, the bound on every score) and ``split`` (the bound on the part left after the
    threshold is chosen on ``select_fraction`` of each group)."""
    kp, kn = int(n_members * select_fraction), int(n_nonmembers * select_fraction)
    return {"lr1": epsilon_ceiling(n_members, n_nonmembers, confidence, delta),
            "split": epsilon_ceiling(n_members - kp, n_nonmembers - kn, confidence, delta)}


def confusion_at_threshold(scores_members, scores_nonmembers, threshold: float) -> tuple:
    """(tp, fn, fp, tn) for the rule member iff score >= threshold."""
    pos, neg = _as_1d(scores_members), _as_1d(scores_nonmembers)
    tp = int((pos >= threshold).sum())
    fp = int((neg >= threshold).sum())
    return tp, pos.size - tp, fp, neg.size - fp


def audit_epsilon(
    scores_members,
    scores_nonmembers,
    confidence: float = 0.95,
    delta: float = 0.0,
    threshold: float | None = None,
    select_fraction: float = 0.5,
    seed: int = 0,
) -> dict:
    """ε lower bound from attack scores.

    If ``threshold`` is given it is applied to all scores. Otherwise the scores are split
    (seeded, stratified): the threshold maximising the bound is chosen on the
    ``select_fraction`` part and the bound is computed on the rest, so the reported figure
    keeps its confidence level (a threshold tuned on the evaluation scores would not).
    Returns the bound, the threshold and the evaluation confusion counts (whose sums give the
    game's ceiling, :func:`epsilon_ceiling`).
    """
    pos, neg = _as_1d(scores_members), _as_1d(scores_nonmembers)
    if threshold is None:
        rng = np.random.default_rng(seed)
        pos, neg = rng.permutation(pos), rng.permutation(neg)
        kp, kn = int(pos.size * select_fraction), int(neg.size * select_fraction)
        if min(kp, kn, pos.size - kp, neg.size - kn) < 1:
            raise ValueError("too few scores to split into selection and evaluation parts")
        sel_p, sel_n, pos, neg = pos[:kp], neg[:kn], pos[kp:], neg[kn:]
        best, threshold = -1.0, float("inf")
        for t in np.unique(np.concatenate([sel_p, sel_n])):
            eps = epsilon_lower_bound(*confusion_at_threshold(sel_p, sel_n, t), confidence, delta)
            if eps > best:
                best, threshold = eps, float(t)
    tp, fn, fp, tn = confusion_at_threshold(pos, neg, threshold)
    return {
        "epsilon_lb": epsilon_lower_bound(tp, fn, fp, tn, confidence, delta),
        "threshold": threshold,
        "tp": tp,
        "fn": fn,
        "fp": fp,
        "tn": tn,
        "confidence": confidence,
        "delta": delta,
    }


# --------------------------------------------------------------------------- LiRA


def _shadow_matrix(x, n: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:  # one shadow population shared by all targets
        a = np.broadcast_to(a, (n, a.size))
    if a.ndim != 2 or a.shape[0] != n:
        raise ValueError(f"shadow statistics must be (n_targets, k) or (k,), got {a.shape}")
    return a


def _gauss_params(s: np.ndarray, global_variance: bool, min_std: float):
    mu = np.nanmean(s, axis=1)
    if global_variance:
        resid = s - mu[:, None]
        dof = max(int(np.sum(~np.isnan(s))) - s.shape[0], 1)
        sd = np.full(s.shape[0], math.sqrt(np.nansum(resid**2) / dof))
    else:
        sd = np.nanstd(s, axis=1, ddof=1)
    return mu, np.maximum(np.nan_to_num(sd, nan=min_std), min_std)


def _kde_logpdf(obs: np.ndarray, s: np.ndarray, min_std: float) -> np.ndarray:
    out = np.empty(obs.size)
    for i in range(obs.size):
        row = s[i][~np.isnan(s[i])]
        if row.size >= 2 and np.std(row) > min_std:
            out[i] = stats.gaussian_kde(row).logpdf(obs[i])[0]
        else:  # degenerate shadow sample: a narrow Gaussian around its mean
            out[i] = stats.norm.logpdf(obs[i], np.mean(row), min_std)
    return out


def lira_scores(
    obs,
    shadow_in,
    shadow_out,
    method: str = "gaussian",
    global_variance: bool = False,
    min_std: float = 1e-6,
) -> np.ndarray:
    """Likelihood-ratio membership scores, LiRA style (Carlini et al. 2022).

    ``obs[i]`` is the statistic of the observed (client) output for target i;
    ``shadow_in[i, :]`` / ``shadow_out[i, :]`` are that statistic on shadow outputs
    computed with / without target i (rows may be NaN-padded when targets have different
    shadow counts; a 1-D array is shared by all targets). Score
    = log p_in(obs) - log p_out(obs), higher = more likely a member.

    ``method="gaussian"``: per-target normal fits (``global_variance=True`` pools the
    variance over targets, Carlini's choice with few shadows); ``"kde"``: per-target
    Gaussian kernel density; ``"offline"``: no in-shadows needed (``shadow_in`` ignored):
    score = log P_out(S <= obs), the one-sided offline LiRA. Standard deviations are
    floored at ``min_std`` so a shadow population with no spread cannot give ±inf.
    """
    x = _as_1d(obs)
    s_out = _shadow_matrix(shadow_out, x.size)
    if method == "offline":
        mu, sd = _gauss_params(s_out, global_variance, min_std)
        return stats.norm.logcdf(x, mu, sd)
    s_in = _shadow_matrix(shadow_in, x.size)
    if method == "gaussian":
        mu_i, sd_i = _gauss_params(s_in, global_variance, min_std)
        mu_o, sd_o = _gauss_params(s_out, global_variance, min_std)
        return stats.norm.logpdf(x, mu_i, sd_i) - stats.norm.logpdf(x, mu_o, sd_o)
    if method == "kde":
        return _kde_logpdf(x, s_in, min_std) - _kde_logpdf(x, s_out, min_std)
    raise ValueError(f"method must be gaussian, kde or offline, got {method!r}")


# --------------------------------------------------------------------------- mask statistics


def _flat(mask) -> torch.Tensor:
    if isinstance(mask, Mapping):
        return torch.cat([mask[k].reshape(-1) for k in sorted(mask)])
    return mask.reshape(-1)


def target_direction(masks_in: Sequence, masks_out: Sequence) -> torch.Tensor:
    """Flat float64 vector mean(masks_in) - mean(masks_out): per entry, how much more often
    it is pruned when the target is in the data. Masks are tensors or {layer: mask} dicts
    (flattened in sorted layer order). Estimate it on shadows *not* reused to fit
    :func:`lira_scores` (or the in-shadow statistics are inflated by overfitting)."""
    if not masks_in or not masks_out:
        raise ValueError("need in and out masks")
    mean_in = torch.stack([_flat(m).to(torch.float64) for m in masks_in]).mean(0)
    mean_out = torch.stack([_flat(m).to(torch.float64) for m in masks_out]).mean(0)
    return mean_in - mean_out


def direction_statistic(mask, direction: torch.Tensor) -> float:
    """Agreement of a mask with a target direction: sum_e d_e * mask_e / sum_e |d_e| (a
    scalar statistic for :func:`lira_scores`; 0 when the direction is all zero)."""
    m = _flat(mask).to(torch.float64)
    d = direction.reshape(-1).to(torch.float64)
    if m.numel() != d.numel():
        raise ValueError(f"mask has {m.numel()} entries, direction {d.numel()}")
    norm = float(d.abs().sum())
    return float((m * d).sum()) / norm if norm > 0 else 0.0


def signal_strength(mask_with, mask_without, natural_masks: Sequence | float) -> dict:
    """The FedPrLLM paper's MIA "signal strength" (App. C).

    ``target_hamming``: Hamming fraction between masks computed with and without a target
    sample (pass paired sequences to average over targets/data sets); ``natural_hamming``:
    mean pairwise Hamming fraction between masks from independently drawn data sets (or a
    float); ``ratio`` = target / natural (paper: 3.23 % / 4.96 % = 0.65).

    Caveat: a ratio below 1 does *not* mean the target is undetectable. The natural
    variation is spread over many directions while the target's influence is a specific,
    predictable direction the attacker can compute with shadow data; detectability is the
    signal along that direction against the noise along it (what :func:`lira_scores` on
    :func:`direction_statistic` measures, scored by :func:`roc_auc`).
    """
    withs = mask_with if isinstance(mask_with, (list, tuple)) else [mask_with]
    withouts = mask_without if isinstance(mask_without, (list, tuple)) else [mask_without]
    if len(withs) != len(withouts):
        raise ValueError("mask_with and mask_without must pair up")

    def dist(a, b):
        return hamming_total(a, b) if isinstance(a, Mapping) else hamming_fraction(a, b)

    target = float(np.mean([dist(a, b) for a, b in zip(withs, withouts)]))
    if isinstance(natural_masks, (int, float)):
        natural = float(natural_masks)
    else:
        natural = mean_pairwise_hamming(natural_masks)
    return {
        "target_hamming": target,
        "natural_hamming": natural,
        "ratio": target / natural if natural > 0 else math.inf,
    }
