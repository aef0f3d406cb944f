"""Comparison groups: which weights compete with each other when the lowest scores are pruned.

Every selection in fedlib (client metrics, server vote counts, N:M) goes through
:func:`prune_lowest`, so tie-breaking is defined once: among equal scores the order is a
seeded random permutation. The embedded model is dequantized from 4-bit weights and server
vote counts are small integers, so ties are the rule, not the exception; an index-order
tie-break (a plain stable sort) would systematically prune low-index columns.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

GROUPS = ("layer", "row", "column")


def seeded_generator(seed: int, *names: object) -> torch.Generator:
    """A torch CPU generator whose state depends only on ``seed`` and ``names``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_seed_value(seed, *names) & ((1 << 63) - 1))
    return gen


def _seed_value(seed: int, *names: object) -> int:
    text = ":".join(str(x) for x in (seed, *names))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def tie_break_keys(flat_index: np.ndarray, seed: int, *names: object) -> np.ndarray:
    """The secondary sort key of each weight (by its row-major flat index in the layer).

    splitmix64 of (index XOR a base derived from seed and names): a bijection on 64-bit
    integers, so keys are distinct and define a total order; they depend only on the seed,
    the names and the index, never on visiting order or process.
    """
    x = flat_index.astype(np.uint64) ^ np.uint64(_seed_value(seed, *names))
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def pruned_count(size: int, sparsity: float) -> int:
    """How many of ``size`` weights a group prunes at ``sparsity`` (floor, as Wanda/SparseGPT)."""
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    # the small epsilon keeps e.g. 0.7 * 10 = 6.999... from flooring to 6
    return int(size * sparsity + 1e-9)


def sparsity_for_count(count: int, size: int) -> float:
    """A sparsity at which :func:`pruned_count` of ``size`` is exactly ``count``: for callers
    that know how many weights to prune (a SparseGPT column block's share of the layer budget,
    FedSpaLLM's expansion target) and select them with :func:`prune_lowest`."""
    if count >= size:
        return 1.0
    return (count + 0.5) / size


def _lowest_k_per_row(scores: np.ndarray, index: np.ndarray, k: int, seed: int, names: tuple) -> np.ndarray:
    """Mask of the k lowest (score, key) of each row of ``scores``; ``index`` gives each
    entry's flat index in the layer (for its tie-break key).

    Selection (numpy's introselect) instead of a full sort: ties only matter at each row's
    threshold, and only the tied entries there get keys. numpy's partition is several times
    faster than torch's sort or kthvalue on CPU.
    """
    groups, size = scores.shape
    if k <= 0:
        return np.zeros(scores.shape, dtype=bool)
    if k >= size:
        return np.ones(scores.shape, dtype=bool)
    threshold = np.partition(scores, k - 1, axis=1)[:, k - 1 : k]
    mask = scores < threshold
    equal = scores == threshold
    need = k - mask.sum(axis=1)
    n_equal = equal.sum(axis=1)
    mask |= equal & (n_equal <= need)[:, None]
    tied = np.nonzero(n_equal > need)[0]
    if tied.size:
        sub_equal = equal[tied]
        keys = np.where(sub_equal, tie_break_keys(index[tied], seed, *names), np.iinfo(np.uint64).max)
        kth_key = np.take_along_axis(np.sort(keys, axis=1), (need[tied] - 1)[:, None], axis=1)
        mask[tied] |= sub_equal & (keys <= kth_key)
    return mask


def prune_lowest(
    scores: torch.Tensor,
    sparsity: float,
    group: str,
    seed: int,
    name: str = "",
) -> torch.Tensor:
    """Boolean mask (True = pruned) of the lowest-scoring weights of a 2-D score matrix.

    ``group`` is ``layer`` (lowest fraction of the whole matrix), ``row`` (of each output
    row), ``column`` (of each input column) or ``N:M`` (N of every M consecutive input
    weights of each row, e.g. ``2:4``). Among equal scores the weight with the smaller
    :func:`tie_break_keys` key (from ``seed``, ``name`` and ``group``) is pruned first, so
    the result is bit-identical across runs and machines.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be 2-D, got shape {tuple(scores.shape)}")
    values = scores.detach().to("cpu").numpy()
    if np.isnan(values).any():
        raise ValueError(f"{name}: scores contain NaN")
    rows, cols = values.shape
    index = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    names = (name, group)
    if group == "layer":
        k = pruned_count(rows * cols, sparsity)
        mask = _lowest_k_per_row(values.reshape(1, -1), index.reshape(1, -1), k, seed, names)
    elif group == "row":
        mask = _lowest_k_per_row(values, index, pruned_count(cols, sparsity), seed, names)
    elif group == "column":
        k = pruned_count(rows, sparsity)
        mask = _lowest_k_per_row(np.ascontiguousarray(values.T), np.ascontiguousarray(index.T), k, seed, names).T
    else:
        n, m = parse_nm(group)
        if cols % m:
            raise ValueError(f"{name}: {cols} input columns are not divisible by M={m} for {group}")
        mask = _lowest_k_per_row(values.reshape(-1, m), index.reshape(-1, m), n, seed, names)
    return torch.from_numpy(np.ascontiguousarray(mask.reshape(rows, cols)))


def parse_nm(group: str) -> tuple[int, int]:
    """``"2:4"`` -> (2, 4): prune N of every M consecutive weights in a row."""
    try:
        n_text, m_text = group.split(":")
        n, m = int(n_text), int(m_text)
    except ValueError:
        raise ValueError(
            f"unknown comparison group {group!r}: expected one of {GROUPS} or N:M such as 2:4"
        ) from None
    if not 0 < n < m:
        raise ValueError(f"N:M group {group!r} needs 0 < N < M")
    return n, m


def group_sparsity(group: str, sparsity: float) -> float:
    """The sparsity a group actually imposes: N/M for N:M groups, else ``sparsity``."""
    if group in GROUPS:
        return sparsity
    n, m = parse_nm(group)
    return n / m


def expected_pruned(shape: tuple[int, int], sparsity: float, group: str) -> int:
    """Exact number of pruned weights :func:`prune_lowest` gives for this shape."""
    rows, cols = shape
    if group == "layer":
        return pruned_count(rows * cols, sparsity)
    if group == "row":
        return rows * pruned_count(cols, sparsity)
    if group == "column":
        return cols * pruned_count(rows, sparsity)
    n, m = parse_nm(group)
    return rows * (cols // m) * n
