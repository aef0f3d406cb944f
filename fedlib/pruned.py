"""A pruned model is the base model plus a global mask (plus vote counts for scaling).

Evaluation applies it in memory; only ``fedlib export`` writes a full checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedlib.maskfile import MaskFile, MaskFileError
from fedlib.models import fingerprint, linear_by_name, prunable_layers
from fedlib.server.fedprllm import scale_factors


@torch.no_grad()
def apply_masks(model: nn.Module, masks: dict[str, torch.Tensor], factors: dict[str, torch.Tensor] | None = None) -> None:
    """Zero masked weights in place (and multiply survivors by per-weight factors)."""
    for name, mask in masks.items():
        weight = linear_by_name(model, name).weight
        weight[mask.to(weight.device)] = 0
        if factors is not None and name in factors:
            weight.mul_(factors[name].to(weight.device, weight.dtype))


def apply_mask_file(model: nn.Module, path: Path, scale: bool = False, model_fingerprint: str | None = None) -> dict:
    """Apply a (client or global) mask file to ``model`` in place; returns its header summary."""
    layers = prunable_layers(model)
    mask_file = MaskFile(path, model_fingerprint or fingerprint(model), layers)
    if scale and not mask_file.has_votes():
        raise MaskFileError(path, "votes", "weight scaling needs vote counts (a global mask file from fedlib aggregate)")
    for info in layers:
        factors = None
        if scale:
            factors = {info.name: scale_factors(mask_file.layer_votes(info.name), mask_file.header.n_clients)}
        apply_masks(model, {info.name: mask_file.layer_mask(info.name)}, factors)
    header = mask_file.header
    return {"role": header.role, "method": header.method, "group": header.group,
            "sparsity": header.sparsity, "n_clients": header.n_clients, "scaled": scale}


def measured_sparsity(model: nn.Module) -> float:
    """Fraction of exactly-zero weights over the prunable linears (a check, not a claim)."""
    zeros = total = 0
    for info in prunable_layers(model):
        weight = linear_by_name(model, info.name).weight
        zeros += int((weight == 0).sum())
        total += weight.numel()
    return zeros / total


def load_variant(model_dir: str, mask: str | None = None, scale: bool = False, weights: str | None = None):
    """(model, tokenizer, base fingerprint, applied summary) for one evaluated variant: the base
    model with a mask file (optionally scaled) or a FedSpaLLM weight file applied in memory."""
    from fedlib.models import load_model

    if scale and not mask:
        raise ValueError("--scale needs --mask (a global mask file with vote counts)")
    if mask and weights:
        raise ValueError("give either --mask or --weights, not both")
    model, tokenizer = load_model(model_dir)
    base_fingerprint = fingerprint(model)
    applied = None
    if mask:
        applied = apply_mask_file(model, Path(mask), scale=scale, model_fingerprint=base_fingerprint)
    if weights:
        from fedlib.server.fedspallm import apply_weight_file

        applied = apply_weight_file(model, Path(weights), base_fingerprint)
    return model, tokenizer, base_fingerprint, applied
