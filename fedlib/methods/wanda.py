"""Wanda (Sun et al., 2024): score |W_ij| * ||X_j||_2, row comparison by default."""

from __future__ import annotations

import torch
from torch import nn

from fedlib.methods.base import LayerPruner


def wanda_scores(weight: torch.Tensor, mean_sq_input: torch.Tensor) -> torch.Tensor:
    """|W| * sqrt(mean over tokens of x_j^2), broadcast over output rows.

    ``mean_sq_input`` is per input feature; the mean (not the sum) matches the reference's
    ``scaler_row`` and only rescales a whole layer, which no comparison group is sensitive to.
    """
    return weight.abs() * torch.sqrt(mean_sq_input.to(weight.dtype)).reshape(1, -1)


class WandaPruner(LayerPruner):
    name = "wanda"

    def __init__(self, layer: nn.Linear, layer_name: str):
        super().__init__(layer, layer_name)
        # per-batch sums in float32 (fast), accumulated across batches in float64, where the
        # inputs are (a device's statistics never visit the host)
        self.sq_sum = torch.zeros(layer.in_features, dtype=torch.float64)
        self.n_tokens = 0

    def add_batch(self, inp: torch.Tensor) -> None:
        x = inp.detach().reshape(-1, inp.shape[-1]).float()
        if self.sq_sum.device != x.device:
            self.sq_sum = self.sq_sum.to(x.device)
        self.sq_sum += (x * x).sum(dim=0).to(torch.float64)
        self.n_tokens += x.shape[0]

    def mean_sq_input(self) -> torch.Tensor:
        if self.n_tokens == 0:
            raise RuntimeError(f"{self.layer_name}: Wanda needs calibration inputs, saw none")
        return (self.sq_sum / self.n_tokens).to(torch.float32)

    def scores(self) -> torch.Tensor:
        return wanda_scores(self.layer.weight.detach().float(), self.mean_sq_input())
