"""Stage ``sensitivity``: masks from two data sets that differ in exactly one sample (a client's
shard with one sample replaced by another client's sample): the Hamming distribution. This is
a distance between outputs of a deterministic algorithm, not a privacy loss."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedlib.client import Pruning
from fedlib.privacy.bits import layer_type
from fedlib.privacy.stages.recompute import client_masks


def sensitivity_audit(
    model,
    input_ids: torch.Tensor,
    replacements: torch.Tensor,
    neighbours: int,
    pruning: Pruning = Pruning(),
    blocks: int | None = None,
    base_masks: Mapping[str, torch.Tensor] | None = None,
) -> dict:
    """Masks of D (``input_ids``) and of ``neighbours`` data sets D'_j that differ from D in
    exactly one sample (row j mod n of D replaced by ``replacements[j]``): per neighbour, the
    number and fraction of differing mask bits, overall and per layer type; masks as ``pruning``
    says. ``base_masks``:
    D's masks if already known (the client's shared mask file), else computed here."""
    from fedlib.models import fingerprint

    n = input_ids.shape[0]
    if replacements.shape[0] < neighbours:
        raise ValueError(f"{neighbours} neighbours need as many replacement samples, got {replacements.shape[0]}")
    if replacements.shape[1] != input_ids.shape[1]:
        raise ValueError("replacement samples must have the calibration samples' length")
    base = base_masks if base_masks is not None else client_masks(model, input_ids, pruning, blocks)
    names = list(base)
    sizes: dict[str, int] = {}
    for name in names:
        sizes[layer_type(name)] = sizes.get(layer_type(name), 0) + base[name].numel()
    rows = []
    for j in range(neighbours):
        ids = input_ids.clone()
        ids[j % n] = replacements[j]
        masks = client_masks(model, ids, pruning, blocks)
        diff: dict[str, int] = {}
        for name in names:
            t = layer_type(name)
            diff[t] = diff.get(t, 0) + int((masks[name] ^ base[name]).sum())
        rows.append({"replaced_row": j % n, "diff": diff, "changed_bits": sum(diff.values())})
        print(f"sensitivity: neighbour {j}: {sum(diff.values())} bits differ")
    total = sum(sizes.values())
    result = {
        "analysis": "sensitivity", "model_fingerprint": fingerprint(model),
        "n_samples": int(n), "seqlen": int(input_ids.shape[1]), "neighbours": rows,
        "blocks": blocks, "n_layers": len(names), "type_sizes": sizes, "total_entries": total,
        "method": pruning.method, "group": pruning.group, "sparsity": pruning.sparsity, "seed": pruning.seed,
    }
    if pruning.options:
        result["method_options"] = dict(pruning.options)
    return result
