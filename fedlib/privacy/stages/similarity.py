"""Stage ``similarity``: Hamming distance between masks computed on disjoint random calibration
sets: every pair of the workflow's client masks (each client's shard is a disjoint random part
of the pool), and optionally masks from independently seeded calibration draws (paper: 4.96 %)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from fedlib.client import Pruning
from fedlib.privacy.bits import layer_type, open_mask_files, packed_bits, popcount
from fedlib.privacy.stages.recompute import client_masks


def _pairwise(packed_sets: Sequence[Callable[[str], np.ndarray]], names: Sequence[str]) -> list[dict]:
    """Differing bits per layer type for every pair of mask sets (each a name -> packed reader)."""
    n = len(packed_sets)
    pairs = [{"i": i, "j": j, "diff": {}} for i in range(n) for j in range(i + 1, n)]
    for name in names:
        arrays = [get(name) for get in packed_sets]
        t = layer_type(name)
        for pair in pairs:
            d = popcount(np.bitwise_xor(arrays[pair["i"]], arrays[pair["j"]]))
            pair["diff"][t] = pair["diff"].get(t, 0) + d
    return pairs


def _type_sizes(layers) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for info in layers:
        sizes[layer_type(info.name)] = sizes.get(layer_type(info.name), 0) + math.prod(info.shape)
    return sizes


def similarity_audit(
    model,
    mask_paths: Sequence[Path],
    seed_windows: Sequence[torch.Tensor] = (),
    seed_values: Sequence[int] = (),
    pruning: Pruning = Pruning(),
) -> dict:
    """Hamming distances between every pair of the given client mask files, and (optional)
    between whole-model masks computed here from independently seeded calibration draws
    ``seed_windows`` (one token tensor per seed) as ``pruning`` says."""
    from fedlib.models import ModelHandle

    handle = ModelHandle.of(model)
    layers, fp = handle.layers(), handle.fingerprint()
    names = [info.name for info in layers]
    sizes = _type_sizes(layers)
    out = {"analysis": "similarity", "model_fingerprint": fp, "type_sizes": sizes,
           "total_entries": sum(sizes.values())}
    if mask_paths:
        with open_mask_files(mask_paths, handle) as (files, packed):
            readers = [lambda name, i=i: packed(i, name) for i in range(len(files))]
            pairs = _pairwise(readers, names)
            h = files[0].header
            out["clients"] = {
                "client_ids": [f.header.client_id for f in files],
                "n_samples": [f.header.n_samples for f in files],
                "method": h.method, "group": h.group, "sparsity": h.sparsity,
                "pairs": pairs,
            }
    if seed_windows:
        t0 = time.perf_counter()
        sets = []
        for value, ids in zip(seed_values, seed_windows):
            masks = client_masks(model, ids, pruning)
            sets.append({n: packed_bits(masks[n]) for n in names})
            print(f"similarity: mask for calibration seed {value} ({tuple(ids.shape)})")
        pairs = _pairwise([lambda name, s=s: s[name] for s in sets], names)
        out["seeds"] = {"seeds": list(seed_values), "n_samples": int(seed_windows[0].shape[0]),
                        "seqlen": int(seed_windows[0].shape[1]), "method": pruning.method, "group": pruning.group,
                        "sparsity": pruning.sparsity, "pairs": pairs}
        print(f"similarity: {len(sets)} seeded masks and their pairs in {time.perf_counter() - t0:.1f}s")
        if pruning.options:
            out["seeds"]["method_options"] = dict(pruning.options)
    return out
