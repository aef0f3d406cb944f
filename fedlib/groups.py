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

from fedlib.protocol import GROUPS


def seeded_generator(seed: int, *names: object) -> torch.Generator:
    """A torch CPU generator whose state depends only on ``seed`` and ``names``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_seed_value(seed, *names) & ((1 << 63) - 1))
    return gen


def _seed_value(seed: int, *names: object) -> int:
    text = ":".join(str(x) for x in (seed, *names))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


#: splitmix64's constants as signed 64-bit integers (torch has no unsigned 64-bit arithmetic)
_GOLDEN, _MIX1, _MIX2 = (c - (1 << 64) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))
_INT64_MIN = -(1 << 63)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic on signed integers)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def tie_break_keys(flat_index: torch.Tensor, seed: int, *names: object) -> torch.Tensor:
    """The secondary sort key of each weight (by its row-major flat index in the layer, int64),
    on the index's device.

    splitmix64 of (index XOR a base derived from seed and names): a bijection on 64-bit
    integers, so keys are distinct and define a total order; they depend only on the seed,
    the names and the index, never on visiting order, process or device. Computed in int64
    (products wrap modulo 2^64 as unsigned ones do) and returned with the sign bit flipped, so
    that the signed order of the keys is the unsigned order of the splitmix64 values.
    """
    base = _seed_value(seed, *names)
    x = flat_index.to(torch.int64) ^ (base - (1 << 64) if base >= 1 << 63 else base)
    x = x + _GOLDEN
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return (x ^ _shift_right(x, 31)) ^ _INT64_MIN


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


def kth_smallest(values: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th smallest value (1-based) of each row of ``values``, as a column. An order
    statistic is the same number whichever algorithm finds it: numpy's introselect on the host
    (several times faster there than torch's kthvalue), torch's kthvalue on a device (no copy
    of the scores to the host)."""
    if values.device.type == "cpu":
        return torch.from_numpy(np.partition(values.numpy(), k - 1, axis=1)[:, k - 1 : k])
    return values.kthvalue(k, dim=1, keepdim=True).values


def _lowest_k_per_row(values: torch.Tensor, k: int, strides: tuple[int, int], seed: int,
                      names: tuple) -> torch.Tensor:
    """Mask of the k lowest (score, key) of each row of ``values``, on its device; entry (r, c)
    is the layer's weight of flat index ``r * strides[0] + c * strides[1]`` (for its key).

    Selection instead of a full sort: ties only matter at each row's threshold, and only the
    tied entries of the rows where they decide get keys.
    """
    groups, size = values.shape
    if k <= 0:
        return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    if k >= size:
        return torch.ones(values.shape, dtype=torch.bool, device=values.device)
    threshold = kth_smallest(values, k)
    mask = values < threshold
    equal = values == threshold
    need = k - mask.sum(dim=1)
    n_equal = equal.sum(dim=1)
    mask |= equal & (n_equal <= need)[:, None]
    tied = torch.nonzero(n_equal > need).flatten()
    if tied.numel():
        sub_equal = equal[tied]
        columns = torch.arange(size, device=values.device)
        keys = tie_break_keys(tied[:, None] * strides[0] + columns * strides[1], seed, *names)
        keys = keys.masked_fill(~sub_equal, torch.iinfo(torch.int64).max)
        kth_key = keys.sort(dim=1).values.gather(1, (need[tied] - 1)[:, None])
        mask[tied] |= sub_equal & (keys <= kth_key)
    return mask


def prune_lowest(
    scores: torch.Tensor,
    sparsity: float,
    group: str,
    seed: int,
    name: str = "",
) -> torch.Tensor:
    """Boolean mask (True = pruned) of the lowest-scoring weights of a 2-D score matrix, on
    the scores' device (a mask selected on a GPU never visits the host).

    ``group`` is ``layer`` (lowest fraction of the whole matrix), ``row`` (of each output
    row), ``column`` (of each input column) or ``N:M`` (N of every M consecutive input
    weights of each row, e.g. ``2:4``). Among equal scores the weight with the smaller
    :func:`tie_break_keys` key (from ``seed``, ``name`` and ``group``) is pruned first, so
    the result is bit-identical across runs, machines and devices for the same scores.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be 2-D, got shape {tuple(scores.shape)}")
    values = scores.detach()
    if bool(torch.isnan(values).any()):
        raise ValueError(f"{name}: scores contain NaN")
    rows, cols = values.shape
    names = (name, group)
    if group == "layer":
        mask = _lowest_k_per_row(values.reshape(1, -1), pruned_count(rows * cols, sparsity), (0, 1), seed, names)
    elif group == "row":
        mask = _lowest_k_per_row(values, pruned_count(cols, sparsity), (cols, 1), seed, names)
    elif group == "column":
        k = pruned_count(rows, sparsity)
        mask = _lowest_k_per_row(values.T.contiguous(), k, (1, cols), seed, names).T
    else:
        n, m = parse_nm(group)
        if cols % m:
            raise ValueError(f"{name}: {cols} input columns are not divisible by M={m} for {group}")
        mask = _lowest_k_per_row(values.reshape(-1, m), n, (m, 1), seed, names)
    return mask.reshape(rows, cols).contiguous()


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
