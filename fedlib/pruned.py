"""A pruned model is the base model plus a global mask (plus vote counts for scaling), or plus
a FedSpaLLM weight file.

A :class:`PrunedModel` reads what it applies block by block (:meth:`PrunedModel.decision`), so
evaluation streams it onto each block as the block becomes resident (:mod:`fedlib.runner`);
nothing ever writes a full pruned copy except ``fedlib export`` (:func:`export_checkpoint`,
which also streams, tensor by tensor).
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

from fedlib.maskcode import MagnitudeReference
from fedlib.maskfile import MaskFile, MaskFileError
from fedlib.models import ModelHandle, linear_by_name, prunable_layers
from fedlib.runner import BlockDecision
from fedlib.server.fedprllm import scale_factors


class PrunedModel:
    """The base model with a mask file (optionally with weight scaling) or a FedSpaLLM weight
    file applied; both files are checked against the base model's fingerprint and layers.
    ``device``: where masks are unpacked and checked (the evaluation's device)."""

    def __init__(self, handle: ModelHandle, mask: str | Path | None = None, scale: bool = False,
                 weights: str | Path | None = None, device: torch.device | None = None):
        if scale and not mask:
            raise ValueError("--scale needs --mask (a global mask file with vote counts)")
        if mask and weights:
            raise ValueError("give either --mask or --weights, not both")
        self.scale, self.device = scale, device
        self.mask_file = self.weight_file = None
        self.by_block: dict[int, list[str]] = defaultdict(list)
        layers = handle.layers()
        block_of = {info.name: info.block for info in layers}
        if mask:
            self.mask_file = MaskFile(Path(mask), handle.fingerprint(), layers,
                                      reference=MagnitudeReference.of_model(handle))
            if scale and not self.mask_file.has_votes():
                raise MaskFileError(mask, "votes", "weight scaling needs vote counts (a global mask file from fedlib aggregate)")
            names = [info.name for info in layers]
        elif weights:
            from fedlib.weightfile import open_weight_file

            self.weight_file = open_weight_file(Path(weights), handle.fingerprint(), layers)
            names = self.weight_file.layer_names
        else:
            names = []
        for name in names:
            self.by_block[block_of[name]].append(name)
        self.names = set(names)

    def decision(self, index: int) -> BlockDecision | None:
        """What the variant applies to block ``index`` (None: the block stays as it is)."""
        names = self.by_block.get(index)
        return self.decide(names) if names else None

    def covers(self, name: str) -> bool:
        return name in self.names

    def decide(self, names: list[str]) -> BlockDecision:
        """What the variant applies to the linears ``names`` (read from its file now)."""
        if self.weight_file is not None:
            return BlockDecision(masks={}, weights={n: self.weight_file.layer_weight(n) for n in names})
        decision = BlockDecision(masks={n: self.mask_file.layer_mask(n, self.device) for n in names})
        if self.scale:
            n_clients = self.mask_file.header.n_clients
            decision.factors = {n: scale_factors(self.mask_file.layer_votes(n, decision.masks[n]), n_clients)
                                for n in names}
        return decision

    def summary(self) -> dict | None:
        """The applied file's header, as the result records state it."""
        if self.mask_file is not None:
            h = self.mask_file.header
            return {"role": h.role, "method": h.method, "group": h.group, "sparsity": h.sparsity,
                    "n_clients": h.n_clients, "scaled": self.scale}
        if self.weight_file is not None:
            h = self.weight_file.header
            return {"role": h.role, "method": h.method, "group": h.group, "sparsity": h.sparsity,
                    "n_clients": h.n_clients, "layers": len(self.weight_file.layer_names),
                    "round": self.weight_file.round,
                    "uncovered_blocks": json.loads(h.extra.get("uncovered_blocks", "[]"))}
        return None


@torch.no_grad()
def apply_masks(model: nn.Module, masks: dict[str, torch.Tensor], factors: dict[str, torch.Tensor] | None = None) -> None:
    """Zero masked weights of a model held in memory, in place (and multiply survivors by
    per-weight factors)."""
    for name, mask in masks.items():
        weight = linear_by_name(model, name).weight
        weight[mask.to(weight.device)] = 0
        if factors is not None and name in factors:
            weight.mul_(factors[name].to(weight.device, weight.dtype))


def apply_mask_file(model: nn.Module, path: Path, scale: bool = False) -> dict:
    """Apply a (client or global) mask file to a model held in memory, in place; returns the
    header summary."""
    handle = ModelHandle.of(model)
    variant = PrunedModel(handle, path, scale)
    for index in range(handle.n_blocks):
        decision = variant.decision(index)
        if decision is not None:
            apply_masks(model, decision.masks, decision.factors or None)
    return variant.summary()


def zero_fraction(linears) -> tuple[int, int]:
    """(exactly-zero weights, weights) of some linears: a check of what was applied, not a claim."""
    zeros = total = 0
    for linear in linears:
        zeros += int((linear.weight == 0).sum())
        total += linear.weight.numel()
    return zeros, total


def measured_sparsity(model: nn.Module) -> float:
    """Fraction of exactly-zero weights over the prunable linears of a model in memory."""
    zeros, total = zero_fraction(linear_by_name(model, info.name) for info in prunable_layers(model))
    return zeros / total


@torch.no_grad()
def export_checkpoint(handle: ModelHandle, variant: PrunedModel, out: Path, tokenizer_source: str | None) -> dict:
    """Write the pruned model as an ordinary Hugging Face checkpoint: every tensor of the base
    checkpoint copied in its stored dtype, the variant applied to the prunable linears, shard
    by shard (host memory holds one shard). Needs a checkpoint folder (``open_model`` of a
    safetensors folder)."""
    from fedlib.checkpoint import INDEX
    from fedlib.io import atomic_folder, write_safetensors, write_text_atomic

    if handle.checkpoint is None:
        raise ValueError(f"{handle.source}: export needs a safetensors model folder "
                         "(fedlib materialize-model turns an embedded alias into one)")
    checkpoint = handle.checkpoint
    shards: dict[str, list[str]] = defaultdict(list)
    for name, stored in checkpoint.tensors.items():
        shards[stored.file.name].append(name)
    with atomic_folder(Path(out)) as tmp:  # a killed export leaves no half-written file in ``out``
        for shard, names in sorted(shards.items()):
            tensors = {}
            for name in names:
                tensor = checkpoint.read(name)
                layer = name.removesuffix(".weight")
                if name.endswith(".weight") and variant.covers(layer):
                    decision = variant.decide([layer])
                    if layer in decision.weights:
                        tensor = decision.weights[layer].to(tensor.dtype)
                    tensor = tensor.clone()
                    if layer in decision.masks:
                        tensor[decision.masks[layer]] = 0
                    if layer in decision.factors:
                        tensor = (tensor.float() * decision.factors[layer]).to(tensor.dtype)
                tensors[name] = tensor
            write_safetensors(tmp / shard, tensors, {"format": "pt"})
        for path in sorted(checkpoint.folder.iterdir()):  # config, index, generation config, tokenizer
            if path.is_file() and not path.name.endswith(".safetensors") and path.name != "fedlib_model.json":
                shutil.copyfile(path, tmp / path.name)
        if tokenizer_source and not (tmp / "tokenizer_config.json").exists():
            from fedlib.models import load_tokenizer

            load_tokenizer(tokenizer_source).save_pretrained(tmp)
        record = {"base_model": handle.source, "index": (checkpoint.folder / INDEX).is_file(),
                  **(variant.summary() or {})}
        write_text_atomic(tmp / "fedlib_export.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
