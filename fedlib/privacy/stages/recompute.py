"""Client masks recomputed by the auditor: shadow, neighbour and seeded masks are computed
in-process on one loaded model exactly as a client computes its shared mask."""

from __future__ import annotations

import torch

from fedlib.client import Pruning


def client_masks(
    model,
    input_ids: torch.Tensor,
    pruning: Pruning = Pruning(),
    blocks: int | None = None,
    *,
    dp=None,
    dp_noise_seed: int = 0,
) -> dict[str, torch.Tensor]:
    """The masks a client with calibration ``input_ids`` computes as ``pruning`` says
    (:func:`fedlib.client.prune_locally`), restricted to decoder blocks ``0..blocks-1``
    (``None`` = all). The forward pass stops after the last requested block, so the masks
    of the first blocks cost only the forward through those blocks. ``dp``: a
    :class:`fedlib.dp.gaussian.DPTarget` or :class:`fedlib.dp.public.PublicDP`, the
    client's DP mechanism accounted over the blocks computed, its noise drawn from ``dp_noise_seed``."""
    from fedlib.client import prune_locally

    if blocks is not None and blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    if dp is not None and dp.enabled:
        from fedlib.dp.samplers import NoiseSource

        # the audit's game redraws every mask's noise from its own seed: a simulation
        return dp.client_masks(model, input_ids, pruning, noise=NoiseSource(dp_noise_seed), blocks=blocks)
    return prune_locally(model, input_ids, pruning, blocks=blocks).masks
