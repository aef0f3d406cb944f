"""The client-side pruning method interface.

A method is a small object per linear layer, modelled on SparseGPT's: it sees the layer's
inputs batch by batch (:meth:`LayerPruner.add_batch`) and then decides the layer's mask
(:meth:`LayerPruner.prune`). The block loop (:mod:`fedlib.client` on :mod:`fedlib.runner`) owns
the forward passes and hooks; a method only turns statistics into a mask, and may plug into the
loop at the two points declared here (class methods, so they run before any layer object
exists): :meth:`LayerPruner.plan` once per client before its pass (OWL), and
:meth:`LayerPruner.allocate_block` once per block after its statistics are in (BESA). A method
that varies the sparsity per layer declares the range it can produce
(:meth:`LayerPruner.layer_sparsity_bounds`), which mask file readers enforce.
A new method is one module with a subclass, plus its entry in :data:`fedlib.methods.METHODS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedlib.groups import prune_lowest

if TYPE_CHECKING:
    from fedlib.models import ModelHandle
    from fedlib.runner import BlockStep, Placement


class LayerPruner:
    """Base class: subclasses set ``name`` and implement :meth:`scores` (and usually
    :meth:`add_batch`); methods with a weight update (SparseGPT) override :meth:`prune`."""

    name: str = ""
    #: False for data-free methods (magnitude): the runner then carries no activations.
    needs_calibration: bool = True
    #: "nonuniform" when the method's per-layer sparsity varies (it overrides :meth:`plan` or
    #: :meth:`allocate_block`): the client's mask file says so and the server follows the plan.
    allocation: str = "uniform"

    def __init__(self, layer: nn.Linear, layer_name: str):
        self.layer = layer
        self.layer_name = layer_name
        self.updated_weight: torch.Tensor | None = None

    @classmethod
    def plan(cls, model: "ModelHandle", input_ids: torch.Tensor | None, sparsity: float, *, group: str,
             options: Mapping, batch_size: int, placement: "Placement") -> float | Mapping[str, float]:
        """Per-linear ratios decided before the pruning pass, from the client's data (OWL's
        dense pre-pass); by default ``sparsity`` for every layer."""
        return sparsity

    @classmethod
    def allocate_block(cls, step: "BlockStep", client: int, pruners: Mapping[str, "LayerPruner"],
                       sparsity: float, group: str, seed: int,
                       options: Mapping) -> float | Mapping[str, float]:
        """Per-linear ratios of ``step``'s block for ``client``, once its statistics are
        collected (BESA learns them on the block's inputs); by default ``sparsity``."""
        return sparsity

    @classmethod
    def layer_sparsity_bounds(cls, sparsity: float, options: Mapping) -> tuple[float, float]:
        """The range (lo, hi) of the sparsity this method can give one linear when the client's
        target is ``sparsity`` and its options are ``options``: a reader refuses a mask file
        claiming a layer outside it (before rounding to whole weights per group). Uniform
        methods: exactly ``sparsity``. Raises ``ValueError`` on options the method rejects."""
        return sparsity, sparsity

    def add_batch(self, inp: torch.Tensor) -> None:
        """Accumulate statistics from ``inp`` (..., in_features), the layer's input."""

    def adopt_statistics(self, other: "LayerPruner") -> bool:
        """Use ``other``'s statistics (shared from now on) instead of accumulating its own:
        offered by the runner when this layer receives the very same input tensor as
        ``other``'s did just before, in the first batch (q/k/v, gate/up), so ``other`` already
        holds this input. True if adopted: the runner then feeds ``other`` only. By default
        statistics are not shared (False)."""
        return False

    def scores(self) -> torch.Tensor:
        """Importance of each weight (out_features, in_features); the lowest are pruned."""
        raise NotImplementedError

    def prune(self, sparsity: float, group: str, seed: int) -> torch.Tensor:
        """Boolean mask, True = pruned. Sets ``updated_weight`` if the method changes the
        surviving weights (the runner then propagates those)."""
        return prune_lowest(self.scores(), sparsity, group, seed, self.layer_name)
