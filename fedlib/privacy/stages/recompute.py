"""Client masks recomputed by the auditor: shadow, neighbour and seeded masks are computed
in-process on one loaded model exactly as a client computes its shared mask."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def client_masks(
    model,
    input_ids: torch.Tensor,
    method: str = "wanda",
    sparsity: float = 0.5,
    group: str = "row",
    seed: int = 0,
    blocks: int | None = None,
    batch_size: int = 8,
    method_options: Mapping | None = None,
    placement=None,
    dp=None,
    dp_noise_seed: int = 0,
) -> dict[str, torch.Tensor]:
    """The masks a client with calibration ``input_ids`` computes
    (:func:`fedlib.client.prune_locally`), restricted to decoder blocks ``0..blocks-1``
    (``None`` = all). The forward pass stops after the last requested block, so the masks
    of the first blocks cost only the forward through those blocks. ``dp``: a
    :class:`fedlib.privacy.dp.DPTarget` or :class:`fedlib.privacy.dp_public.PublicDP`, the
    client's DP mechanism accounted over the blocks computed, its noise drawn from ``dp_noise_seed``."""
    from fedlib.client import prune_locally
    from fedlib.runner import CPU

    if blocks is not None and blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    if dp is not None and hasattr(dp, "client_masks"):
        if method != "wanda" or method_options:
            raise ValueError(f"DP masks are plain Wanda's, not {method!r} with options {method_options}")
        return dp.client_masks(model, input_ids, sparsity, group, seed, noise_seed=dp_noise_seed, blocks=blocks,
                               batch_size=batch_size, placement=placement or CPU)
    if dp is not None and dp.enabled:
        from fedlib.models import prunable_layers
        from fedlib.privacy.dp import dp_method

        names = [info.name for info in prunable_layers(model) if blocks is None or info.block < blocks]
        method, _ = dp_method(method, dp, names, dp_noise_seed)
    return prune_locally(model, input_ids, method, sparsity, group, seed, batch_size, method_options,
                         placement=placement or CPU, blocks=blocks).masks
