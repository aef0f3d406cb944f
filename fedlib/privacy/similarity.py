"""Mask similarity: normalised Hamming distance between masks (FedPrLLM App. C).

The paper reports ~4.96 % Hamming distance between Wanda masks from different random
calibration sets, and the same figure for data sets differing in one sample ("DP
sensitivity"). Both are :func:`hamming_total` between two mask dicts. Note that a small
Hamming distance is not a differential-privacy guarantee: DP bounds how *likely* each
output is under neighbouring data sets, not how far apart two outputs are, and a
deterministic mechanism (Wanda without noise) has no finite ε as soon as one sample can
change a single bit (see :mod:`fedlib.privacy.membership` for an empirical ε lower bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import numpy as np
import torch


def hamming_count(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of entries where two boolean masks differ."""
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    return int((a.to(torch.bool) ^ b.to(torch.bool)).sum())


def hamming_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of entries where two boolean masks differ (0 = identical, 1 = complement)."""
    if a.numel() == 0:
        raise ValueError("empty masks")
    return hamming_count(a, b) / a.numel()


def _check_keys(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> None:
    if set(a) != set(b):
        missing = sorted(set(a) ^ set(b))
        raise KeyError(f"mask dicts cover different layers: {missing[:5]}")


def hamming_per_layer(
    a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]
) -> dict[str, float]:
    """{layer: Hamming fraction} for two {layer_name: mask} dicts over the same layers."""
    _check_keys(a, b)
    return {name: hamming_fraction(a[name], b[name]) for name in a}


def hamming_total(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Hamming fraction over all entries of all layers (i.e. weighted by element count)."""
    _check_keys(a, b)
    diff = sum(hamming_count(a[n], b[n]) for n in a)
    size = sum(a[n].numel() for n in a)
    if size == 0:
        raise ValueError("empty masks")
    return diff / size


def _distance(a, b) -> float:
    if isinstance(a, Mapping):
        return hamming_total(a, b)
    return hamming_fraction(a, b)


def pairwise_hamming(masks: Sequence) -> np.ndarray:
    """Symmetric matrix of Hamming fractions between masks (tensors or mask dicts)."""
    n = len(masks)
    out = np.zeros((n, n))
    for i, j in combinations(range(n), 2):
        out[i, j] = out[j, i] = _distance(masks[i], masks[j])
    return out


def mean_pairwise_hamming(masks: Sequence) -> float:
    """Mean Hamming fraction over all unordered pairs (the paper's "natural variation"
    between masks from independently drawn calibration sets)."""
    if len(masks) < 2:
        raise ValueError("need at least two masks")
    d = pairwise_hamming(masks)
    return float(d[np.triu_indices(len(masks), k=1)].mean())
