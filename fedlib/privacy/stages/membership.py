"""Stage ``membership``: a real membership-inference attack, LiRA (Carlini et al. 2022) on the
agreement of the observed mask with the direction in which the target sample moves the mask,
estimated from shadow masks the attacker computes itself (it has the public model). Scored by
ROC AUC, TPR at low FPR and the empirical ε lower bound, also under randomized response."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np
import torch

from fedlib.client import Pruning
from fedlib.privacy.bits import flat_mask
from fedlib.privacy.stages.recompute import client_masks


def attack_summary(members, nonmembers, fprs=(0.01, 0.001), confidence: float = 0.95,
                   seed: int = 0, n_boot: int = 1000, delta: float = 0.0) -> dict:
    """AUC (+ bootstrap CI; the exact separated-AUC bound at AUC 1 or 0), ROC, TPR at each target FPR
    (+ Clopper-Pearson CI on the TPR, with the resolution caveat) and the ε lower bounds of one
    attack's scores (for a mechanism with this ``delta``: an (ε, δ)-DP one is audited at its δ)."""
    from fedlib.privacy.membership import (
        audit_epsilon, auc_ci, roc_auc, roc_curve, tpr_at_fpr,
    )
    from fedlib.stats import clopper_pearson

    m, n = np.asarray(members, float), np.asarray(nonmembers, float)
    fpr, tpr, _ = roc_curve(m, n)
    out = {
        "auc": roc_auc(m, n), "auc_ci": list(auc_ci(m, n, confidence, n_boot, seed)),
        "roc_fpr": fpr.tolist(), "roc_tpr": tpr.tolist(), "n_members": int(m.size),
        "n_nonmembers": int(n.size), "tpr_at_fpr": [],
    }
    for target in fprs:
        r = tpr_at_fpr(m, n, target)
        out["tpr_at_fpr"].append({
            "target_fpr": target, "tpr": r.tpr, "fpr": r.fpr, "tp": r.tp, "fp": r.fp,
            "tpr_ci": list(clopper_pearson(r.tp, r.n_members, confidence)),
            "resolvable": r.resolvable, "min_nonzero_fpr": r.min_nonzero_fpr, "note": r.note,
        })
    # a priori threshold: likelihood ratio 1 (LiRA score 0) on all scores
    out["epsilon_lr1"] = audit_epsilon(m, n, confidence, delta, threshold=0.0)
    try:  # threshold chosen on half of the scores, bound on the other half
        out["epsilon_split"] = audit_epsilon(m, n, confidence, delta, seed=seed)
    except ValueError as err:
        out["epsilon_split"] = {"epsilon_lb": None, "note": str(err)}
    return out


def shadow_pairs(mask_of, rng: np.random.Generator, others: np.ndarray, target: int, samples: int,
                 pairs: int) -> tuple[list, list]:
    """``pairs`` shadow (in, out) masks of data sets of ``samples`` rows drawn from ``others``:
    the two of a pair share all rows but one, which is ``target`` in the first and another row
    in the second (what LiRA's direction and fit are learned from)."""
    ins, outs = [], []
    for _ in range(pairs):
        pick = rng.choice(others, samples, replace=False)
        rest, swap = pick[: samples - 1].tolist(), int(pick[-1])
        ins.append(mask_of(rest + [target]))
        outs.append(mask_of(rest + [swap]))
    return ins, outs


def membership_audit(
    model,
    population: torch.Tensor,
    targets: int,
    samples: int,
    pairs: int,
    blocks: int | None,
    pruning: Pruning = Pruning(),
    epsilons: Sequence[float] = (),
    fprs: Sequence[float] = (0.01, 0.001),
    confidence: float = 0.95,
    natural: int = 12,
    dp=None,
) -> dict:
    """LiRA membership inference against a client's (block-restricted) mask.

    The game, per target t (the first ``targets`` rows of ``population``): the client's data
    set is t plus ``samples``-1 random other population rows (member) or ``samples`` random
    other rows (non-member); the attacker sees the client's mask of blocks ``0..blocks-1``.
    Every mask is computed as ``pruning`` says, whose seed also draws the game.
    The attacker knows the model, the method and the population. It computes ``pairs`` shadow
    pairs per target, (R + t, R + s) with R random and s a random replacement (replace-one
    neighbours): the first half give the direction d_t = mean(in) - mean(out)
    (:func:`fedlib.privacy.membership.target_direction`), the other half the in/out
    distributions of the statistic <d_t, mask> / |d_t|_1, fitted as Gaussians with a variance
    pooled over targets (Carlini et al.'s choice with few shadows). Score = log-likelihood
    ratio; one member and one non-member observation per target.

    Randomized response with per-bit ε (``epsilons``): the observation and the fitting
    shadows are noised (the attacker knows the mechanism), the direction comes from clean
    shadows. Only entries where d_t != 0 enter the statistic, so only those are noised (the
    others cannot change it): exact in distribution and cheap.

    Both attacks under randomized response are non-adaptive (fixed statistics), so their AUCs
    are lower bounds on what an attacker can reach. The second one, ``rr_llr``, knows the noise:
    per-bit log-likelihood ratio (:func:`fedlib.privacy.defence.rr_bit_llr`) of the noised
    observation, with per-bit member/non-member pruning rates from all ``pairs`` shadow pairs;
    its observation noise is its own draw of the same mechanism.

    ``dp`` (a :class:`fedlib.dp.gaussian.DPTarget`): every mask, observed and shadow, is the DP
    client's (:mod:`fedlib.dp.gaussian`, accounted over the blocks observed), each with its own
    noise seed (the client's secret: the attacker knows the mechanism, not the noise). The
    result then carries the proven guarantee beside the audited lower bounds.
    """
    from fedlib.groups import seeded_generator
    from fedlib.models import fingerprint
    from fedlib.privacy.defence import rr_bit_llr, rr_flip_probability
    from fedlib.privacy.membership import lira_scores, target_direction

    P = population.shape[0]
    if pairs < 2:
        raise ValueError("membership needs at least 2 shadow pairs per target (direction + fit)")
    if not 1 <= targets <= P:
        raise ValueError(f"targets must be in 1..{P} (population rows), got {targets}")
    if samples < 1 or samples + 1 > P:
        raise ValueError(f"samples must be in 1..{P - 1}, got {samples}")
    n_dir = pairs // 2
    n_fit = pairs - n_dir
    seed = pruning.seed
    rng = np.random.default_rng([seed, 0x4D1A])
    noise_seeds = np.random.default_rng([seed, 0xD9])  # apart from rng: the game's draws stay those without DP
    names: list[str] | None = None
    t0 = time.perf_counter()

    def mask_of(rows) -> torch.Tensor:
        nonlocal names
        masks = client_masks(model, population[list(rows)], pruning, blocks, dp=dp,
                             dp_noise_seed=int(noise_seeds.integers(2**62)))
        if names is None:
            names = list(masks)
        return flat_mask(masks, names)

    eps_list = [float(e) for e in epsilons]
    fit_in = np.zeros((targets, n_fit))
    fit_out = np.zeros((targets, n_fit))
    obs = np.zeros((targets, 2))
    rr_fit_in = np.zeros((len(eps_list), targets, n_fit))
    rr_fit_out = np.zeros((len(eps_list), targets, n_fit))
    rr_obs = np.zeros((len(eps_list), targets, 2))
    llr_obs = np.zeros((len(eps_list), targets, 2))
    target_hamming, naturals, support_sizes = [], [], []
    n_bits = None
    for t in range(targets):
        others = np.delete(np.arange(P), t)
        ins, outs = shadow_pairs(mask_of, rng, others, t, samples, pairs)
        member_obs = mask_of(rng.choice(others, samples - 1, replace=False).tolist() + [t])
        nonmember_obs = mask_of(rng.choice(others, samples, replace=False).tolist())
        n_bits = member_obs.numel()
        target_hamming += [float((a ^ b).sum()) / n_bits for a, b in zip(ins, outs)]
        if len(naturals) < natural:
            naturals.append(nonmember_obs)
        d = target_direction(ins[:n_dir], outs[:n_dir])
        support = torch.nonzero(d).flatten()
        support_sizes.append(int(support.numel()))
        ds = d[support]
        norm = float(ds.abs().sum())

        def stat(bits: torch.Tensor) -> float:
            return float(bits.to(torch.float64) @ ds) / norm if norm > 0 else 0.0

        fit_masks = ins[n_dir:] + outs[n_dir:]
        observed = [member_obs, nonmember_obs]
        sub_fit = [m[support] for m in fit_masks]
        sub_obs = [m[support] for m in observed]
        fit_in[t] = [stat(b) for b in sub_fit[:n_fit]]
        fit_out[t] = [stat(b) for b in sub_fit[n_fit:]]
        obs[t] = [stat(b) for b in sub_obs]
        for e, eps in enumerate(eps_list):
            q = rr_flip_probability(eps)
            gen = seeded_generator(seed, "membership-rr", eps, t)

            def noisy(bits, q=q, gen=gen):
                return stat(bits ^ (torch.rand(bits.shape, generator=gen) < q))

            rr_fit_in[e, t] = [noisy(b) for b in sub_fit[:n_fit]]
            rr_fit_out[e, t] = [noisy(b) for b in sub_fit[n_fit:]]
            rr_obs[e, t] = [noisy(b) for b in sub_obs]
        in_counts = torch.stack(ins).sum(0, dtype=torch.int32)
        out_counts = torch.stack(outs).sum(0, dtype=torch.int32)
        differ = torch.nonzero(in_counts != out_counts).flatten()
        for e, eps in enumerate(eps_list):
            q = rr_flip_probability(eps)
            gen = seeded_generator(seed, "membership-rr-llr", eps, t)
            llr_obs[e, t] = [rr_bit_llr(m[differ] ^ (torch.rand(differ.shape, generator=gen) < q),
                                        in_counts[differ], out_counts[differ], pairs, eps) for m in observed]
        if t % 8 == 0 or t == targets - 1:
            print(f"membership: target {t + 1}/{targets} ({time.perf_counter() - t0:.0f}s)")

    def scores(o, fi, fo):
        member = lira_scores(o[:, 0], fi, fo, global_variance=True)
        nonmember = lira_scores(o[:, 1], fi, fo, global_variance=True)
        return member, nonmember

    members, nonmembers = scores(obs, fit_in, fit_out)
    natural_pairs = [float((naturals[i] ^ naturals[j]).sum()) / n_bits
                     for i in range(len(naturals)) for j in range(i + 1, len(naturals))]
    natural_mean = float(np.mean(natural_pairs)) if natural_pairs else float("nan")
    th = float(np.mean(target_hamming))
    result = {
        "analysis": "membership", "model_fingerprint": fingerprint(model),
        "population": int(P), "targets": targets, "samples": samples, "pairs": pairs,
        "direction_pairs": n_dir, "fit_pairs": n_fit, "blocks": blocks,
        "seqlen": int(population.shape[1]), "observed_layers": len(names or []),
        "observed_bits": int(n_bits), "method": pruning.method, "group": pruning.group, "sparsity": pruning.sparsity,
        "seed": seed, "confidence": confidence, "fprs": list(fprs),
        "scores_members": members.tolist(), "scores_nonmembers": nonmembers.tolist(),
        "attack": attack_summary(members, nonmembers, fprs, confidence, seed,
                                 delta=dp.delta if dp is not None and dp.enabled else 0.0),
        "signal_strength": {
            "target_hamming": th, "target_hamming_std": float(np.std(target_hamming)),
            "natural_hamming": natural_mean, "natural_pairs": len(natural_pairs),
            "ratio": th / natural_mean if natural_mean > 0 else None,
        },
        "direction_support_mean": float(np.mean(support_sizes)),
        "rr": [],
    }
    if pruning.options:
        result["method_options"] = dict(pruning.options)
    if dp is not None and dp.enabled:
        result["dp"] = json.loads(dp.guarantee(names).header())
    for e, eps in enumerate(eps_list):
        m, n = scores(rr_obs[e], rr_fit_in[e], rr_fit_out[e])
        summary = attack_summary(m, n, fprs, confidence, seed)
        llr = attack_summary(llr_obs[e, :, 0], llr_obs[e, :, 1], fprs, confidence, seed)
        result["rr"].append({"epsilon": eps, "flip_probability": rr_flip_probability(eps), **summary,
                             "llr": llr})
    return result
