"""Empirical entropy of shared masks versus the weights they come from (FedPrLLM App. C).

The paper compares the information a 50 % mask "holds" (1.0 bit per entry) with the
float16 weights (13.75 bits per entry, LLaMA-7B block-0 ``q_proj``). Both figures are
*zero-order empirical entropies*: each entry is treated as an independent draw from the
histogram of the tensor. Read them with that in mind:

* ``binary_entropy_bits`` is an upper bound on the per-entry information of a mask only
  under that i.i.d. model; it says nothing about how much of it depends on the private data.
  A mask is largely a function of the *public* weights, so the information about the
  calibration data is far smaller (see :func:`mask_ensemble_entropy_bits`, which measures the
  per-entry entropy *across* masks computed on different data sets), but a small leak per
  entry over 10^8 entries can still identify data; entropy is not a privacy guarantee.
* ``fp16_entropy_bits`` is the entropy of the bit-pattern histogram, at most 16 bits.
  Weights that were dequantized from a 4-bit format have fewer distinct values than
  genuine fp16 weights, so their figure is lower than the paper's 13.75.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch


def bernoulli_entropy_bits(p: float) -> float:
    """Binary entropy in bits of a Bernoulli(p)."""
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log2(p) + (1.0 - p) * math.log2(1.0 - p))


def histogram_entropy_bits(counts: torch.Tensor) -> float:
    """Shannon entropy (bits) of the empirical distribution given by a count histogram."""
    counts = counts.to(torch.float64).flatten()
    total = counts.sum()
    if total <= 0:
        raise ValueError("empty histogram")
    p = counts[counts > 0] / total
    return float(-(p * torch.log2(p)).sum())


def binary_entropy_bits(mask: torch.Tensor) -> float:
    """Empirical entropy per entry (bits) of a binary mask from its density:
    H(p) = -p log2 p - (1-p) log2 (1-p), p = fraction of True entries (0 for an all-equal
    mask, 1.0 at 50 % sparsity)."""
    if mask.numel() == 0:
        raise ValueError("empty mask")
    p = float(mask.to(torch.bool).sum()) / mask.numel()
    return bernoulli_entropy_bits(p)


def fp16_entropy_bits(weight: torch.Tensor) -> float:
    """Empirical Shannon entropy (bits per entry) of the weight's float16 bit patterns:
    the tensor is cast to float16 and the histogram over all 65 536 patterns is used
    (so +0 and -0 count as different patterns, as they are different bits on the wire)."""
    if weight.numel() == 0:
        raise ValueError("empty weight")
    bits = weight.detach().to("cpu", torch.float16).contiguous().view(torch.int16)
    patterns = bits.to(torch.int32).flatten() & 0xFFFF
    return histogram_entropy_bits(torch.bincount(patterns, minlength=65536))


def mask_ensemble_entropy_bits(masks: Sequence[torch.Tensor]) -> float:
    """Mean over entries of the binary entropy of each entry *across* masks of the same
    layer computed on different data sets: for entry e with pruning frequency f_e over the
    ensemble, mean_e H(f_e). 0 when every data set gives the same mask. This isolates the
    data-dependent part of the mask (under an entry-independence model); it is an estimate
    that shrinks with few masks (use many)."""
    if len(masks) < 2:
        raise ValueError("need at least two masks")
    stack = torch.stack([m.to(torch.bool) for m in masks]).to(torch.float64)
    f = stack.mean(dim=0)
    h = torch.zeros_like(f)
    inner = (f > 0) & (f < 1)
    fi = f[inner]
    h[inner] = -(fi * torch.log2(fi) + (1 - fi) * torch.log2(1 - fi))
    return float(h.mean())


def layer_entropies(
    tensors: Mapping[str, torch.Tensor], kind: str = "mask"
) -> dict[str, float]:
    """Per-layer entropy: ``kind="mask"`` uses :func:`binary_entropy_bits`,
    ``kind="fp16"`` uses :func:`fp16_entropy_bits`."""
    fn = {"mask": binary_entropy_bits, "fp16": fp16_entropy_bits}.get(kind)
    if fn is None:
        raise ValueError(f"kind must be 'mask' or 'fp16', got {kind!r}")
    return {name: fn(t) for name, t in tensors.items()}


def weighted_mean(values: Mapping[str, float], sizes: Mapping[str, int]) -> float:
    """Element-count weighted mean of per-layer values (bits per entry over the model)."""
    total = sum(sizes[n] for n in values)
    if total == 0:
        raise ValueError("no elements")
    return sum(values[n] * sizes[n] for n in values) / total


def model_entropy_bits(tensors: Mapping[str, torch.Tensor], kind: str = "mask") -> float:
    """Per-entry entropy over a whole model: per-layer entropies weighted by element count.

    This is the mean of per-layer zero-order entropies, not the entropy of the pooled
    histogram (for masks at one common sparsity the two agree)."""
    per_layer = layer_entropies(tensors, kind)
    return weighted_mean(per_layer, {n: t.numel() for n, t in tensors.items()})


def entropy_comparison(mask: torch.Tensor, weight: torch.Tensor) -> dict[str, float]:
    """The paper's comparison for one layer: mask bits, fp16 weight bits, their ratio and
    the "reduction" 1 - ratio (paper: 1.0 vs 13.75 bits, 7.3 %, 92.7 %)."""
    if mask.shape != weight.shape:
        raise ValueError(f"shape mismatch {tuple(mask.shape)} vs {tuple(weight.shape)}")
    hm = binary_entropy_bits(mask)
    hw = fp16_entropy_bits(weight)
    ratio = hm / hw if hw > 0 else math.inf
    return {
        "mask_bits": hm,
        "fp16_bits": hw,
        "ratio": ratio,
        "reduction": 1.0 - ratio,
        "mask_total_bits": hm * mask.numel(),
        "fp16_total_bits": hw * weight.numel(),
    }

