"""The Random pruning baseline of the FedSpaLLM tables: a global mask that no data decided."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fedlib.groups import prune_lowest, seeded_generator
from fedlib.models import LayerInfo


def random_masks(layers: Iterable[LayerInfo], sparsity: float, seed: int, group: str = "layer") -> dict[str, torch.Tensor]:
    """The Random pruning baseline: per layer, the lowest of seeded uniform random scores."""
    masks = {}
    for info in layers:
        scores = torch.rand(info.shape, generator=seeded_generator(seed, "random-pruning", info.name))
        masks[info.name] = prune_lowest(scores, sparsity, group, seed, f"random:{info.name}")
    return masks
