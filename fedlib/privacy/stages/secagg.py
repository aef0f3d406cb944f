"""Stage ``secagg``: membership inference against what the server sees under secure aggregation,
the sum of m clients' masks (the votes; a published global mask file holds them too), and
against the published global mask bits, for several m: how leakage falls with the cohort."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from fedlib.client import Pruning
from fedlib.privacy.bits import flat_mask
from fedlib.privacy.stages.membership import attack_summary, shadow_pairs
from fedlib.privacy.stages.recompute import client_masks


def secagg_membership_audit(
    model,
    population: torch.Tensor,
    targets: int,
    samples: int,
    pairs: int,
    blocks: int,
    cohorts: Sequence[int],
    pool: int,
    draws: int = 2,
    pruning: Pruning = Pruning(),
    server_group: str = "layer",
    fprs: Sequence[float] = (0.01, 0.001),
    confidence: float = 0.95,
) -> dict:
    """LiRA on the sum of m client masks and on the global mask of that sum, per m in ``cohorts``.

    The game of :func:`fedlib.privacy.stages.membership.membership_audit` (targets are the first
    ``targets`` population rows; a member client holds the target + ``samples`` - 1 others, a
    non-member ``samples`` others), except that the attacker observes the target client's mask
    plus m - 1 other clients' masks (``votes``), or FedPrLLM's global mask of those votes
    (``server_group`` top-k at ``sparsity``, ties by ``seed``). Other clients hold ``samples``
    rows drawn from the non-target rows; their masks come from a pool of ``pool`` such clients
    (m - 1 drawn without replacement per observation). The attacker knows the model, the method
    and the population: it takes the target's direction from half of its ``pairs`` shadow pairs
    (clean single masks, as the single-mask attack), and fits the in/out Gaussians of the
    statistic on its own sums / global masks: each remaining shadow mask plus m - 1 masks from a
    second, disjoint pool of ``pool`` clients it computed itself, ``draws`` times. The direction
    of a sum is that of each of its masks, so m = 1 is the single-mask attack.
    """
    from fedlib.models import fingerprint
    from fedlib.privacy.membership import lira_scores, target_direction
    from fedlib.server.fedprllm import global_mask_from_votes

    P = population.shape[0]
    cohorts = sorted({int(m) for m in cohorts})
    if not cohorts or cohorts[0] < 1:
        raise ValueError(f"cohort sizes must be >= 1, got {cohorts}")
    if pool < cohorts[-1] - 1:
        raise ValueError(f"a pool of {pool} other clients cannot fill a cohort of {cohorts[-1]}")
    if pairs < 2 or not 1 <= targets < P or samples < 1 or targets + samples > P:
        raise ValueError("need pairs >= 2, 1 <= targets < population rows and enough non-target rows")
    n_dir = pairs // 2
    n_fit = pairs - n_dir
    sparsity, seed = pruning.sparsity, pruning.seed
    rng = np.random.default_rng([seed, 0x5EC4])
    names: list[str] = []
    shapes: dict[str, torch.Size] = {}
    t0 = time.perf_counter()

    def mask_of(rows) -> torch.Tensor:
        masks = client_masks(model, population[list(rows)], pruning, blocks)
        if not names:
            names.extend(masks)
            shapes.update({n: m.shape for n, m in masks.items()})
        return flat_mask(masks, names)

    non_targets = np.arange(targets, P)
    real_pool = torch.stack([mask_of(rng.choice(non_targets, samples, replace=False).tolist()) for _ in range(pool)])
    shadow_pool = torch.stack([mask_of(rng.choice(non_targets, samples, replace=False).tolist())
                               for _ in range(pool)])
    print(f"secagg: pools of {pool} + {pool} client masks ({time.perf_counter() - t0:.0f}s)")
    sizes = [int(np.prod(shapes[n])) for n in names]

    def global_bits(votes: torch.Tensor) -> torch.Tensor:
        parts = torch.split(votes, sizes)
        return torch.cat([global_mask_from_votes(v.reshape(shapes[n]), sparsity, server_group, seed, n).reshape(-1)
                          for n, v in zip(names, parts)])

    views = ("votes", "global")
    obs = {(v, m): np.zeros((targets, 2)) for v in views for m in cohorts}
    fit_in = {(v, m): np.zeros((targets, n_fit * draws)) for v in views for m in cohorts}
    fit_out = {(v, m): np.zeros((targets, n_fit * draws)) for v in views for m in cohorts}
    for t in range(targets):
        others = np.delete(np.arange(P), t)
        ins, outs = shadow_pairs(mask_of, rng, others, t, samples, pairs)
        observed = [mask_of(rng.choice(others, samples - 1, replace=False).tolist() + [t]),
                    mask_of(rng.choice(others, samples, replace=False).tolist())]
        d = target_direction(ins[:n_dir], outs[:n_dir])
        norm = float(d.abs().sum())

        def stat(x: torch.Tensor) -> float:
            return float(x.to(torch.float64) @ d) / norm if norm > 0 else 0.0

        for m in cohorts:
            def with_others(mask, from_pool):
                picks = rng.choice(from_pool.shape[0], m - 1, replace=False)
                return mask.to(torch.int16) + from_pool[torch.as_tensor(picks)].sum(0, dtype=torch.int16)

            for i, mask in enumerate(observed):
                votes = with_others(mask, real_pool)
                obs["votes", m][t, i] = stat(votes)
                obs["global", m][t, i] = stat(global_bits(votes))
            for side, fits in ((fit_in, ins[n_dir:]), (fit_out, outs[n_dir:])):
                for k, mask in enumerate([mask for mask in fits for _ in range(draws)]):
                    votes = with_others(mask, shadow_pool)
                    side["votes", m][t, k] = stat(votes)
                    side["global", m][t, k] = stat(global_bits(votes))
        if t % 8 == 0 or t == targets - 1:
            print(f"secagg: target {t + 1}/{targets} ({time.perf_counter() - t0:.0f}s)")

    result = {
        "analysis": "secagg", "model_fingerprint": fingerprint(model), "population": int(P), "targets": targets,
        "samples": samples, "pairs": pairs, "direction_pairs": n_dir, "fit_pairs": n_fit, "draws": draws,
        "pool": pool, "blocks": blocks, "seqlen": int(population.shape[1]), "observed_layers": len(names),
        "observed_bits": int(sum(sizes)), "method": pruning.method, "group": pruning.group, "server_group": server_group,
        "sparsity": sparsity, "seed": seed, "confidence": confidence, "fprs": list(fprs), "cohorts": [],
    }
    if pruning.options:
        result["method_options"] = dict(pruning.options)
    for m in cohorts:
        entry = {"m": m}
        for v in views:
            member = lira_scores(obs[v, m][:, 0], fit_in[v, m], fit_out[v, m], global_variance=True)
            nonmember = lira_scores(obs[v, m][:, 1], fit_in[v, m], fit_out[v, m], global_variance=True)
            entry[v] = attack_summary(member, nonmember, fprs, confidence, seed)
        result["cohorts"].append(entry)
    return result
