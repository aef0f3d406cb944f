"""The client-side pruning method interface.

A method is a small object per linear layer, modelled on SparseGPT's: it sees the layer's
inputs batch by batch (:meth:`LayerPruner.add_batch`) and then decides the layer's mask
(:meth:`LayerPruner.prune`). The layer-by-layer recursion (``fedlib.runner``) owns the
forward passes and hooks; a method only turns statistics into a mask.
"""

from __future__ import annotations

import torch
from torch import nn


class LayerPruner:
    """Base class: subclasses set ``name`` and implement :meth:`scores` (and usually
    :meth:`add_batch`); methods with a weight update (SparseGPT) override :meth:`prune`."""

    name: str = ""
    #: False for data-free methods (magnitude): the runner then carries no activations.
    needs_calibration: bool = True

    def __init__(self, layer: nn.Linear, layer_name: str):
        self.layer = layer
        self.layer_name = layer_name
        self.updated_weight: torch.Tensor | None = None

    def add_batch(self, inp: torch.Tensor) -> None:
        """Accumulate statistics from ``inp`` (..., in_features), the layer's input."""

    def scores(self) -> torch.Tensor:
        """Importance of each weight (out_features, in_features); the lowest are pruned."""
        raise NotImplementedError

    def prune(self, sparsity: float, group: str, seed: int) -> torch.Tensor:
        """Boolean mask, True = pruned. Sets ``updated_weight`` if the method changes the
        surviving weights (the runner then propagates those)."""
        from fedlib.groups import prune_lowest

        return prune_lowest(self.scores(), sparsity, group, seed, self.layer_name)
