"""Stage ``attribute``: attribute (property) inference against a client's mask. Does the client's
data contain a window of a given domain, or a window containing a given term?

The game mirrors the membership game (:mod:`.membership`), with a property in place of a known
target text: the attacker does not know which row gives the client the property, only what
kind of row it is. Rows with and without the property are each split at random into the
attacker's half (public text of the same kinds) and the client's half, so no attacker shadow
holds a client row.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import numpy as np
import torch

from fedlib.client import Pruning
from fedlib.privacy.bits import flat_mask
from fedlib.privacy.stages.membership import attack_summary, shadow_pairs
from fedlib.privacy.stages.recompute import client_masks


def term_rows(texts: Sequence[str], term: str) -> torch.Tensor:
    """Bool per text: does it contain ``term`` as a whole word, in any case?"""
    pattern = re.compile(rf"\b{re.escape(term)}\b", re.IGNORECASE)
    return torch.tensor([bool(pattern.search(t)) for t in texts], dtype=torch.bool)


def attribute_audit(
    model,
    with_rows: torch.Tensor,
    without_rows: torch.Tensor,
    trials: int,
    samples: int,
    pairs: int,
    blocks: int | None = None,
    pruning: Pruning = Pruning(),
    fprs: Sequence[float] = (0.01, 0.001),
    confidence: float = 0.95,
) -> dict:
    """Attribute inference: is one of the client's ``samples`` rows a row with the property?

    The game, per trial: a client data set with the property is ``samples`` - 1 rows without
    it plus one row with it; one without the property is ``samples`` rows without it, all drawn
    from the client's halves of ``with_rows`` / ``without_rows``. The attacker sees the client's
    mask of blocks ``0..blocks-1`` (``None`` = all). It knows the model, the method and rows of
    both kinds (its halves), and computes ``pairs`` shadow pairs R + a / R + b, R of ``samples``
    - 1 rows without the property, a a row with it, b one more without (replace-one
    neighbours, as in membership). The first half of the pairs give the direction
    d = mean(with) - mean(without), the other half the with / without distributions of
    <d, mask> / |d|_1, fitted as Gaussians; score = log-likelihood ratio.

    The two data sets of a trial differ in one row, so the ε lower bounds are lower bounds on
    the sample-level ε of the client's mask (with the property's row as the changed sample).
    """
    from fedlib.models import fingerprint
    from fedlib.privacy.membership import lira_scores

    if pairs < 4:
        raise ValueError(f"attribute inference needs at least 4 shadow pairs (2 direction + 2 fit), got {pairs}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    seed = pruning.seed
    rng = np.random.default_rng([seed, 0xA771])
    halves = {}
    for kind, rows, need in (("with", with_rows, 1), ("without", without_rows, samples)):
        order = rng.permutation(rows.shape[0])
        halves[kind] = {"attacker": order[: rows.shape[0] // 2], "client": order[rows.shape[0] // 2 :]}
        for side, picked in halves[kind].items():
            if picked.size < need:
                raise ValueError(f"{rows.shape[0]} rows {kind} the property: the {side}'s half has {picked.size}, "
                                 f"a data set of {samples} samples needs {need}")
    # one population: the without-rows, then the with-rows
    population = torch.cat([without_rows, with_rows])
    offset = without_rows.shape[0]
    names: list[str] | None = None
    t0 = time.perf_counter()
    computed = 0

    def mask_of(rows) -> torch.Tensor:
        nonlocal names, computed
        masks = client_masks(model, population[list(rows)], pruning, blocks)
        names = names or list(masks)
        computed += 1
        if computed % 8 == 0:
            print(f"attribute: {computed} masks ({time.perf_counter() - t0:.0f}s)")
        return flat_mask(masks, names)

    att_without, att_with = halves["without"]["attacker"], halves["with"]["attacker"] + offset
    cli_without, cli_with = halves["without"]["client"], halves["with"]["client"] + offset

    def shadow_pair() -> tuple[torch.Tensor, torch.Tensor]:
        ins, outs = shadow_pairs(mask_of, rng, att_without, int(rng.choice(att_with)), samples, 1)
        return ins[0], outs[0]

    n_dir = pairs // 2
    # target_direction over stacked float64 masks would hold 8 bytes per bit per mask (~10^8 bits each):
    # the same direction from running counts
    count_in = count_out = None
    pair_hamming = []
    for _ in range(n_dir):
        a, b = shadow_pair()
        count_in = a.to(torch.int32) if count_in is None else count_in.add_(a)
        count_out = b.to(torch.int32) if count_out is None else count_out.add_(b)
        pair_hamming.append(float((a ^ b).sum()) / a.numel())
    direction = (count_in.to(torch.float64) - count_out.to(torch.float64)) / n_dir
    del count_in, count_out
    support = torch.nonzero(direction).flatten()
    ds = direction[support]
    norm = float(ds.abs().sum())

    def stat(bits: torch.Tensor) -> float:
        return float(bits[support].to(torch.float64) @ ds) / norm if norm > 0 else 0.0

    fit_in, fit_out = [], []
    for _ in range(pairs - n_dir):
        a, b = shadow_pair()
        fit_in.append(stat(a))
        fit_out.append(stat(b))
        pair_hamming.append(float((a ^ b).sum()) / a.numel())
    observed = np.zeros((trials, 2))
    for t in range(trials):
        with_set = rng.choice(cli_without, samples - 1, replace=False).tolist() + [int(rng.choice(cli_with))]
        with_mask = mask_of(with_set)
        observed[t] = [stat(with_mask), stat(mask_of(rng.choice(cli_without, samples, replace=False).tolist()))]
    scores = [lira_scores(observed[:, i], np.array(fit_in), np.array(fit_out)) for i in (0, 1)]
    return {
        "analysis": "attribute", "model_fingerprint": fingerprint(model),
        "rows_with": int(with_rows.shape[0]), "rows_without": int(without_rows.shape[0]),
        "attacker_rows": {k: int(h["attacker"].size) for k, h in halves.items()},
        "client_rows": {k: int(h["client"].size) for k, h in halves.items()},
        "trials": trials, "samples": samples, "pairs": pairs, "direction_pairs": n_dir, "fit_pairs": pairs - n_dir,
        "blocks": blocks, "seqlen": int(population.shape[1]), "observed_layers": len(names or []),
        "observed_bits": int(direction.numel()), "method": pruning.method, "group": pruning.group,
        "sparsity": pruning.sparsity, "seed": seed,
        "confidence": confidence, "fprs": list(fprs), "masks_computed": computed,
        "scores_with": scores[0].tolist(), "scores_without": scores[1].tolist(),
        "attack": attack_summary(scores[0], scores[1], fprs, confidence, seed),
        "pair_hamming": float(np.mean(pair_hamming)), "direction_support": int(support.numel()),
        **({"method_options": dict(pruning.options)} if pruning.options else {}),
    }
