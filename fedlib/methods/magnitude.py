"""Magnitude pruning: score |W_ij|, no calibration data."""

from __future__ import annotations

import torch

from fedlib.methods.base import LayerPruner


class MagnitudePruner(LayerPruner):
    name = "magnitude"
    needs_calibration = False

    def scores(self) -> torch.Tensor:
        return self.layer.weight.detach().float().abs()
