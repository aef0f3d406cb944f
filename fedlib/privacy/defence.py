"""Randomized response on mask bits: a local-DP defence for shared masks.

What ε means here
-----------------
:func:`randomized_response` keeps each mask bit with probability p = e^ε / (1 + e^ε) and
flips it with probability q = 1 - p = 1 / (1 + e^ε), independently per bit. That makes the
report of **each single bit** ε-locally-differentially-private: for any true bit values
b, b' and any reported bit r, P(r | b) <= e^ε P(r | b').

A client's whole mask is many bits that all depend on its data. By basic composition the
released mask of n bits is (n·ε)-DP with respect to the *entire mask* (any two true masks
are indistinguishable up to e^(n·ε)); with respect to a single calibration sample it is
(Δ·ε)-DP if changing one sample can flip at most Δ mask bits (group privacy over bits).
Nothing bounds Δ for Wanda/SparseGPT (the FedPrLLM paper measures ~5 % of all bits), so a
meaningful per-sample guarantee needs ε per bit around (target ε)/Δ, which destroys the
mask — state per-bit ε, and do not present it as a per-sample or per-client budget.

Server side: with m clients, a weight's observed vote count C_obs (number of reports
"pruned") has E[C_obs] = C·p + (m - C)·q for true count C, so
Ĉ = (C_obs - m·q) / (p - q) is unbiased (:func:`debias_counts`). Because Ĉ is an
increasing affine function of C_obs (p > q for ε > 0), the server's top-k selection on
debiased counts equals top-k on raw counts; the debiased counts matter for weight
scaling (Ŵ ⊙ (m - M̂)/m) and for reporting vote statistics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from fedlib.groups import seeded_generator


def rr_keep_probability(epsilon: float) -> float:
    """p = e^ε / (1 + e^ε): the probability a bit is reported truthfully (ε = inf -> 1)."""
    if epsilon < 0 or math.isnan(epsilon):
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if math.isinf(epsilon):
        return 1.0
    return 1.0 / (1.0 + math.exp(-epsilon))


def rr_flip_probability(epsilon: float) -> float:
    """q = 1 / (1 + e^ε): the probability a bit is flipped (1/2 at ε = 0)."""
    return 1.0 - rr_keep_probability(epsilon)


def rr_epsilon(flip_probability: float) -> float:
    """The per-bit ε of randomized response with the given flip probability (< 1/2)."""
    if not 0.0 <= flip_probability <= 0.5:
        raise ValueError(f"flip probability must be in [0, 0.5], got {flip_probability}")
    if flip_probability == 0.0:
        return math.inf
    return math.log((1.0 - flip_probability) / flip_probability)


def randomized_response(
    mask: torch.Tensor,
    epsilon: float,
    seed: int | None = None,
    name: str = "",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The mask with each bit flipped independently with probability 1/(1+e^ε)
    (per-bit ε-local DP). Randomness comes from ``generator`` or, if not given, from a
    CPU generator seeded by (``seed``, ``name``) so that each layer has its own stream."""
    if generator is None:
        if seed is None:
            raise ValueError("give a seed or a generator")
        generator = seeded_generator(seed, "randomized_response", name)
    q = rr_flip_probability(epsilon)
    mask = mask.to(torch.bool)
    if q == 0.0:
        return mask.clone()
    u = torch.rand(mask.shape, generator=generator, device="cpu")
    return mask ^ (u < q).to(mask.device)


def randomized_response_masks(
    masks: Mapping[str, torch.Tensor], epsilon: float, seed: int
) -> dict[str, torch.Tensor]:
    """:func:`randomized_response` on every layer of a {layer_name: mask} dict, each layer
    with its own stream derived from (seed, layer name)."""
    return {name: randomized_response(m, epsilon, seed, name) for name, m in masks.items()}


def debias_counts(observed: torch.Tensor, n_clients: int, epsilon: float) -> torch.Tensor:
    """Unbiased estimate of the true vote counts from counts of randomized-response masks:
    (observed - m·q) / (p - q). Values may fall outside [0, m]; clip if a count is needed
    as a fraction (see module docstring: top-k is unaffected)."""
    p = rr_keep_probability(epsilon)
    q = 1.0 - p
    if p - q <= 0:
        raise ValueError("epsilon = 0: randomized response carries no signal to debias")
    return (observed.to(torch.float64) - n_clients * q) / (p - q)


def rr_bit_llr(reported: torch.Tensor, in_counts: torch.Tensor, out_counts: torch.Tensor, n_shadows: int,
               epsilon: float) -> float:
    """Membership score that knows the randomized-response noise: the log-likelihood ratio
    sum_e log P(r_e | member) / P(r_e | non-member) of the reported bits r, with each bit modelled
    as independent. P(bit pruned | member) is estimated from ``in_counts`` (how many of
    ``n_shadows`` member shadow masks prune it, Jeffreys-smoothed: (k + 1/2) / (n + 1)), likewise
    for non-members; the noise maps a true probability p to p·(1 − q) + (1 − p)·q. Entries where
    the two counts agree contribute 0, so pass only the entries where they differ."""
    q = rr_flip_probability(epsilon)
    if q == 0.0:
        raise ValueError("the noise-aware attack is for finite epsilon (no noise: use the clean attack)")

    def reported_one(counts):
        p = (counts.to(torch.float64) + 0.5) / (n_shadows + 1)
        return p * (1 - q) + (1 - p) * q

    p_in, p_out = reported_one(in_counts), reported_one(out_counts)
    r = reported.to(torch.bool)
    llr = torch.where(r, torch.log(p_in) - torch.log(p_out), torch.log1p(-p_in) - torch.log1p(-p_out))
    return float(llr.sum())


def mask_epsilon_composed(epsilon: float, n_bits: int) -> float:
    """Basic-composition ε of a whole released mask of ``n_bits`` bits (n_bits·ε)."""
    return epsilon * n_bits
