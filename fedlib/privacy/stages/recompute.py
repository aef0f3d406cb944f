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
) -> dict[str, torch.Tensor]:
    """The masks a client with calibration ``input_ids`` computes
    (:func:`fedlib.client.prune_locally`), restricted to decoder blocks ``0..blocks-1``
    (``None`` = all). The forward pass stops after the last requested block, so the masks
    of the first blocks cost only the forward through those blocks."""
    from fedlib.client import prune_locally
    from fedlib.runner import CPU

    if blocks is not None and blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    return prune_locally(model, input_ids, method, sparsity, group, seed, batch_size, method_options,
                         placement=placement or CPU, blocks=blocks).masks
