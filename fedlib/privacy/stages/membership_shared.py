"""Stage ``membership_shared``: membership inference against a client's whole mask at the sizes
clients use (up to FedSpaLLM's 32 samples per client), with shadow masks shared by every target.

Why not the replace-one game of :mod:`.membership`: it computes 2 x pairs shadow masks per target,
and one whole-model mask of 32 x 512 tokens costs minutes on a CPU, so 16 targets take hours.
Here every mask serves every target, as in Carlini et al. (2022)'s evaluation of LiRA: each mask
comes from a subset of a population of N rows, and every population row is a target of every mask.

The statistic is model-based. Wanda keeps, in each row, the weights with the largest
|W_ij| sqrt(S_j), S_j the sum over the data set's rows w of s_j(w), the row's per-channel sum
of squared inputs. A member t adds s_j(t) to S_j, so columns where t's statistic is above the
population's mean are kept in more rows. The attacker computes s(w) for every population row
through a reference recursion (blocks pruned by the mask of the whole population, which it can
compute: :func:`row_statistics`), takes x_j(t) = s_j(t) / mean_w s_j(w) - 1 and scores a mask m
by ``stat(m, t) = sum over linears and columns j of x_j(t) * kept_j(m)``, kept_j the fraction of
rows that keep column j (:func:`kept_columns`). LiRA (online): per target, Gaussians fitted to the
statistic on the shadow masks with and without it (variance pooled over targets); the score is
the log-likelihood ratio. For other methods the statistic is the same, a fixed (weaker) attack.

The game (:func:`membership_shared_audit`): the attacker computes ``shadows`` masks of data sets
drawn as random partitions of the population into groups of ``samples`` rows (every row is in
exactly ``shadows * samples / N`` of them). The client computes ``clients`` masks; for each, a
designated target t_k and a fair coin: heads, its data set is t_k plus ``samples`` - 1 random other
rows; tails, ``samples`` random rows without t_k. Every (client mask, target) pair is scored.
Given the shadows, client masks are independent: the AUC and TPR over all pairs get a cluster
bootstrap over client masks (:func:`pair_summary`), and the ε lower bounds use the designated
pairs only (independent trials). A data set with t_k and one without are mixtures of replace-one neighbours
over the same draws, so the ε lower bounds bound the mask's sample-level ε.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fedlib.client import Pruning
from fedlib.privacy.stages.membership import attack_summary


def row_statistics(model, population: torch.Tensor, pruning: Pruning = Pruning()) -> dict[str, torch.Tensor]:
    """Per linear, a (rows, in_features) float64 matrix: each population row's per-channel sum
    of squared inputs, through the recursion of the population's own mask (the attacker's
    reference for the client's pruned blocks). Linears that share their input tensor with an
    earlier one and take its statistics (q/k/v, gate/up under SparseGPT) get that one's rows."""
    from fedlib.client import prune_locally
    from fedlib.dp.gaussian import input_key

    factory = pruning.factory
    recorded: dict[str, list[torch.Tensor]] = {}

    def add_batch(self, inp: torch.Tensor) -> None:
        if inp.dim() != 3:
            raise ValueError(f"{self.layer_name}: per-row statistics need inputs (rows, tokens, channels), "
                             f"got shape {tuple(inp.shape)}")
        x = inp.detach().to("cpu", torch.float64)
        recorded.setdefault(self.layer_name, []).append((x * x).sum(dim=1))
        factory.add_batch(self, inp)

    recorder = type(f"RowRecording{factory.__name__}", (factory,), {"add_batch": add_batch})
    names: list[str] = []
    prune_locally(model, population, dataclasses.replace(pruning, method=recorder),
                  on_block=lambda _i, decision: names.extend(decision.masks), keep=False)
    by_input = {input_key(n): n for n in reversed(names) if n in recorded}
    stats = {}
    for name in names:
        source = name if name in recorded else by_input.get(input_key(name))
        if source is None:
            raise RuntimeError(f"{name}: no input statistics were recorded (method {factory.name!r})")
        rows = torch.cat(recorded[source])
        if rows.shape[0] != population.shape[0]:
            raise RuntimeError(f"{name}: recorded {rows.shape[0]} rows, the population has {population.shape[0]}")
        stats[name] = rows
    return stats


def kept_columns(model, rows: torch.Tensor, pruning: Pruning = Pruning()) -> dict[str, torch.Tensor]:
    """The client's whole mask for calibration ``rows`` (:func:`fedlib.client.prune_locally`),
    reduced to what the statistic reads: per linear, the fraction of rows keeping each column
    (float32). The masks themselves are dropped block by block."""
    from fedlib.client import prune_locally

    kept = {}

    def on_block(_index, decision) -> None:
        for name, mask in decision.masks.items():
            rows = mask.shape[0]  # column counts: no float copy of the whole mask
            kept[name] = (rows - mask.sum(dim=0)).to("cpu", torch.float32) / rows

    prune_locally(model, rows, pruning, on_block=on_block, keep=False)
    return kept


def relative_deviations(stats: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """(rows, columns) float64: x_j(t) = s_j(t) / mean_w s_j(w) - 1 over the linears ``names``
    concatenated (0 in channels no row reaches)."""
    parts = []
    for name in names:
        s = stats[name]
        mean = s.mean(dim=0, keepdim=True)
        parts.append(torch.where(mean > 0, s / mean.clamp_min(torch.finfo(torch.float64).tiny) - 1, 0.0))
    return torch.cat(parts, dim=1)


def balanced_partitions(n_rows: int, samples: int, masks: int, rng: np.random.Generator) -> list[list[int]]:
    """``masks`` data sets of ``samples`` rows: random partitions of the rows into groups, so
    every row is in exactly ``masks * samples / n_rows`` of them."""
    if n_rows % samples:
        raise ValueError(f"a population of {n_rows} rows does not split into data sets of {samples} rows")
    per_partition = n_rows // samples
    if masks % per_partition:
        raise ValueError(f"{masks} shadow masks: need a multiple of {per_partition} (population / samples) "
                         "so that every row is in as many of them")
    sets = []
    for _ in range(masks // per_partition):
        order = rng.permutation(n_rows)
        sets += [sorted(order[i : i + samples].tolist()) for i in range(0, n_rows, samples)]
    return sets


def designated_sets(n_rows: int, samples: int, clients: int, rng: np.random.Generator
                    ) -> tuple[list[list[int]], list[int], list[bool]]:
    """The client masks' data sets: per mask a designated target and a fair coin (member or
    not); the other rows drawn at random."""
    sets, targets, member = [], [], []
    for _ in range(clients):
        t, heads = int(rng.integers(n_rows)), bool(rng.integers(2))
        others = np.delete(np.arange(n_rows), t)
        rest = rng.choice(others, samples - 1 if heads else samples, replace=False).tolist()
        sets.append(sorted(rest + [t] if heads else rest))
        targets.append(t)
        member.append(heads)
    return sets, targets, member


def shared_lira(shadow_stats: np.ndarray, shadow_labels: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """LiRA scores of observed masks for every target: ``shadow_stats`` (shadows, targets) with
    ``shadow_labels`` (shadows, targets) True where the target is in the shadow's data set;
    ``observed`` (masks, targets). Per target, Gaussians on its in- and out-shadows with the
    variance pooled over targets (:func:`fedlib.privacy.membership.lira_scores`)."""
    from fedlib.privacy.membership import lira_scores

    if (shadow_labels.sum(0) < 1).any() or ((~shadow_labels).sum(0) < 1).any():
        raise ValueError("every target needs at least one shadow with it and one without")
    s_in = np.where(shadow_labels, shadow_stats, np.nan).T
    s_out = np.where(~shadow_labels, shadow_stats, np.nan).T
    return np.stack([lira_scores(row, s_in, s_out, global_variance=True) for row in observed])


def pair_summary(scores: np.ndarray, labels: np.ndarray, fprs: Sequence[float] = (0.01, 0.001),
                 confidence: float = 0.95, n_boot: int = 1000, seed: int = 0) -> dict:
    """AUC and TPR at each FPR over all (mask, target) pairs (``scores``, ``labels``: (masks,
    targets)), with intervals from a cluster bootstrap over masks: pairs of one mask share it,
    masks are independent. At perfect separation the bootstrap is degenerate; the AUC's lower end
    is then :func:`~fedlib.privacy.membership.separated_auc_bound` over one disjoint (member,
    non-member) pair per mask (independent trials)."""
    from fedlib.privacy.membership import roc_auc, separated_auc_bound, tpr_at_fpr

    def figures(s, lab):
        return [roc_auc(s[lab], s[~lab])] + [tpr_at_fpr(s[lab], s[~lab], f).tpr for f in fprs]

    point = figures(scores, labels)
    at = [tpr_at_fpr(scores[labels], scores[~labels], f) for f in fprs]
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(n_boot):
        pick = rng.integers(scores.shape[0], size=scores.shape[0])
        s, lab = scores[pick], labels[pick]
        if lab.any() and (~lab).any():
            boot.append(figures(s, lab))
    alpha = 1.0 - confidence
    lo, hi = np.quantile(np.array(boot), [alpha / 2, 1 - alpha / 2], axis=0)
    auc_ci = [float(lo[0]), float(hi[0])]
    if point[0] in (0.0, 1.0):
        mixed = int((labels.any(1) & (~labels).any(1)).sum())
        bound = separated_auc_bound(mixed, mixed, confidence)
        auc_ci = [bound, 1.0] if point[0] == 1.0 else [0.0, 1.0 - bound]
    return {
        "n_members": int(labels.sum()), "n_nonmembers": int((~labels).sum()), "masks": int(scores.shape[0]),
        "auc": point[0], "auc_ci": auc_ci,
        "tpr_at_fpr": [{"target_fpr": f, "tpr": r.tpr, "fpr": r.fpr, "resolvable": r.resolvable,
                        "tpr_ci": [float(lo[i + 1]), float(hi[i + 1])]} for i, (f, r) in enumerate(zip(fprs, at))],
    }


def membership_shared_audit(
    model,
    population: torch.Tensor,
    samples: int,
    shadows: int,
    clients: int,
    pruning: Pruning = Pruning(),
    fprs: Sequence[float] = (0.01, 0.001),
    confidence: float = 0.95,
) -> dict:
    """The shared-shadow membership game against the client's whole mask (module docstring):
    ``shadows`` attacker masks and ``clients`` client masks of ``samples`` population rows each;
    each computed as ``pruning`` says, whose seed also draws the data sets."""
    from fedlib.models import fingerprint

    n_rows = int(population.shape[0])
    if not 1 <= samples < n_rows:
        raise ValueError(f"samples must be in 1..{n_rows - 1} (population rows), got {samples}")
    if clients < 2:
        raise ValueError(f"clients must be >= 2, got {clients}")
    seed = pruning.seed
    rng = np.random.default_rng([seed, 0x5A4D])
    shadow_sets = balanced_partitions(n_rows, samples, shadows, rng)
    client_sets, designated, member = designated_sets(n_rows, samples, clients, rng)
    t0 = time.perf_counter()
    stats = row_statistics(model, population, pruning)
    names = list(stats)
    x = relative_deviations(stats, names)
    del stats
    print(f"membership_shared: row statistics of {n_rows} rows ({time.perf_counter() - t0:.0f}s)")

    def statistic(rows: list[int]) -> np.ndarray:
        kept = kept_columns(model, population[rows], pruning)
        return (torch.cat([kept[n].to(torch.float64) for n in names]) @ x.T).numpy()

    def labels(sets) -> np.ndarray:
        lab = np.zeros((len(sets), n_rows), dtype=bool)
        for i, rows in enumerate(sets):
            lab[i, rows] = True
        return lab

    stats_of = {}
    for kind, sets in (("shadow", shadow_sets), ("client", client_sets)):
        out = []
        for i, rows in enumerate(sets):
            out.append(statistic(rows))
            print(f"membership_shared: {kind} mask {i + 1}/{len(sets)} ({time.perf_counter() - t0:.0f}s)")
        stats_of[kind] = np.stack(out)
    shadow_labels, client_labels = labels(shadow_sets), labels(client_sets)
    scores = shared_lira(stats_of["shadow"], shadow_labels, stats_of["client"])
    designated_scores = scores[np.arange(clients), designated]
    member = np.asarray(member)
    # effect size of the statistic: per target, (mean in - mean out) over the shadows' pooled sd
    s_in = np.where(shadow_labels, stats_of["shadow"], np.nan)
    s_out = np.where(~shadow_labels, stats_of["shadow"], np.nan)
    gap = np.nanmean(s_in, 0) - np.nanmean(s_out, 0)
    resid = np.concatenate([(s_in - np.nanmean(s_in, 0))[shadow_labels], (s_out - np.nanmean(s_out, 0))[~shadow_labels]])
    pooled_sd = float(np.sqrt(np.sum(resid**2) / max(resid.size - 2 * n_rows, 1)))
    result = {
        "analysis": "membership_shared", "model_fingerprint": fingerprint(model),
        "population": n_rows, "samples": samples, "seqlen": int(population.shape[1]), "shadows": shadows,
        "clients": clients, "shadow_sets": shadow_sets, "client_sets": client_sets, "designated": designated,
        "designated_member": member.tolist(), "observed_layers": len(names), "observed_columns": int(x.shape[1]),
        "method": pruning.method, "group": pruning.group, "sparsity": pruning.sparsity, "seed": seed,
        "confidence": confidence,
        "fprs": list(fprs), "shadow_statistics": stats_of["shadow"].tolist(),
        "client_statistics": stats_of["client"].tolist(), "scores": scores.tolist(),
        "client_labels": client_labels.tolist(),
        "pairs": pair_summary(scores, client_labels, fprs, confidence, seed=seed),
        "effect_size": {"mean": float(np.mean(gap) / pooled_sd) if pooled_sd > 0 else None,
                        "pooled_sd": pooled_sd},
        "seconds": time.perf_counter() - t0,
    }
    if member.any() and (~member).any():
        result["attack"] = attack_summary(designated_scores[member], designated_scores[~member], fprs, confidence,
                                          seed)
    else:  # every coin fell the same way: no designated member (or non-member) to score
        result["attack"] = None
    if pruning.options:
        result["method_options"] = dict(pruning.options)
    return result
