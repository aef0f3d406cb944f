"""Weight files: FedSpaLLM's uploads and global models, a mask file that also carries weights.

A weight file is a mask file (:mod:`fedlib.maskfile`: same header, same packed ``mask:<layer>``
bits, same checks, every error naming file and field) that also carries one tensor
``weight:<layer>`` per pruned linear (float16 or float32, the layer's shape, +0.0 where the
mask prunes) and the metadata ``x_payload = "weights"``, ``x_weight_dtype``, ``x_round`` (a
global file also ``x_uncovered_blocks``, the model's blocks it does not list, and from
``fedlib aggregate`` ``x_rounding``; :data:`fedlib.maskfile.EXTRAS`). A file
lists only the linears of the blocks the client pruned, in model order, whole blocks only. The
server's global file has the same format (role ``global``, plus ``votes:<layer>`` = ``C_j``) and
lists the blocks aggregated so far. Nothing here is unpickled: safetensors only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from fedlib.groups import expected_pruned
from fedlib.maskfile import PAYLOAD, WEIGHT_DTYPES, WEIGHT_PREFIX, MaskFile, MaskFileError, MaskWriter, read_header
from fedlib.models import LayerInfo, linear_by_name


class WeightFileWriter(MaskWriter):
    """An upload (``role="client"``) or a global result (``role="global"``) for ``layers`` (the
    pruned linears, whole blocks, model order), written layer by layer (:class:`MaskWriter`).
    Weights are stored in ``weight_dtype`` and must be finite; they are set to 0 where the mask
    prunes. ``allocation`` is ``uniform`` when every layer prunes exactly what
    :func:`fedlib.groups.expected_pruned` says, else ``nonuniform`` (Eq. 7's ceil can be one
    weight above the floor count)."""

    def __init__(self, path: Path, layers: Sequence[LayerInfo], *, weight_dtype: str = "float32",
                 round_index: int = 0, extra: Mapping[str, str] | None = None, **header):
        if weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype must be one of {sorted(WEIGHT_DTYPES)}, got {weight_dtype!r}")
        self.weight_dtype = WEIGHT_DTYPES[weight_dtype]
        meta = {"payload": PAYLOAD, "weight_dtype": weight_dtype, "round": str(int(round_index))}
        meta.update(extra or {})
        declared = {f"{WEIGHT_PREFIX}{info.name}": (self.weight_dtype, info.shape) for info in layers}
        super().__init__(path, layers, extra=meta, tensors=declared, **header)
        self.sparsity, self.group = float(header["sparsity"]), header["group"]
        self.uniform = True

    def add_layer(self, name: str, mask: torch.Tensor, weight: torch.Tensor, votes: torch.Tensor | None = None) -> None:
        shape = self.shapes.get(name)
        if shape is not None and tuple(weight.shape) != shape:
            raise ValueError(f"{name}: weight shape {tuple(weight.shape)} != layer {shape}")
        stored = weight.detach().to("cpu", self.weight_dtype).clone()
        if not torch.isfinite(stored).all():
            raise ValueError(f"{name}: weights are not finite in {self.weight_dtype}")
        stored[mask.to("cpu", torch.bool)] = 0
        self.add(name, mask, votes)
        self.add_tensor(f"{WEIGHT_PREFIX}{name}", stored)
        self.uniform &= self.pruned[name] == expected_pruned(shape, self.sparsity, self.group)

    def close(self) -> None:
        self.metadata["allocation"] = "uniform" if self.uniform else "nonuniform"
        super().close()


def write_weight_file(
    path: Path,
    masks: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    layers: Sequence[LayerInfo],
    *,
    votes: Mapping[str, torch.Tensor] | None = None,
    **header,
) -> None:
    """A whole weight file at once (:class:`WeightFileWriter` for the fields)."""
    with WeightFileWriter(path, layers, votes=votes is not None, **header) as writer:
        for info in layers:
            writer.add_layer(info.name, masks[info.name], weights[info.name],
                             None if votes is None else votes[info.name])


class WeightFile(MaskFile):
    """An open, header-checked weight file; layers are read and checked one at a time."""

    def __init__(self, path: Path, expected_fingerprint: str | None = None,
                 expected_layers: Sequence[LayerInfo] | None = None):
        super().__init__(path, expected_fingerprint, expected_layers)
        if self.header.payload != PAYLOAD:
            raise MaskFileError(self.path, "x_payload", f"missing: a mask file, not a weight file (x_payload={PAYLOAD!r})")
        # the reader checked both (maskfile.EXTRAS) and the weight tensors' dtype and shape
        self.round = int(self.header.extra["round"])
        self.weight_dtype = WEIGHT_DTYPES[self.header.extra["weight_dtype"]]

    @property
    def layer_names(self) -> list[str]:
        return [layer["name"] for layer in self.header.layers]

    def has_layer(self, name: str) -> bool:
        return name in self._shapes

    def layer_weight(self, name: str, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's weights as float32, checked: finite, +0.0 where pruned."""
        key = f"{WEIGHT_PREFIX}{name}"
        if not self.has_layer(name):
            raise MaskFileError(self.path, key, "layer not in this file")
        weight = self._tensor(key)  # x_weight_dtype, the layer's shape: the header says so
        if not torch.isfinite(weight).all():
            raise MaskFileError(self.path, key, "contains NaN or infinite values")
        mask = self.layer_mask(name) if mask is None else mask
        # +0.0 exactly, as the writer stores a pruned weight: -0.0 is another file for the same model
        bad = int(((weight != 0) | torch.signbit(weight))[mask].sum())
        if bad:
            raise MaskFileError(self.path, key, f"{bad} weights are not +0.0 where the mask prunes them")
        return weight.to(torch.float32)

    def blocks(self, model_layers: Sequence[LayerInfo]) -> list[int]:
        index = {info.name: info.block for info in model_layers}
        return sorted({index[n] for n in self.layer_names})


def open_weight_file(
    path: Path,
    fingerprint: str,
    model_layers: Sequence[LayerInfo],
    assigned_blocks: Sequence[int] | None = None,
) -> WeightFile:
    """Open a weight file listing a subset of the model's linears: the subset must be whole
    decoder blocks in model order (and exactly ``assigned_blocks`` when given)."""
    header = read_header(path, fingerprint)
    by_name = {info.name: info for info in model_layers}
    unknown = [layer["name"] for layer in header.layers if layer["name"] not in by_name]
    if unknown:
        raise MaskFileError(path, "layers", f"{unknown[0]!r} is not a prunable layer of the model")
    blocks = sorted({by_name[layer["name"]].block for layer in header.layers})
    subset = [info for info in model_layers if info.block in blocks]
    if assigned_blocks is not None and blocks != sorted(assigned_blocks):
        raise MaskFileError(path, "layers", f"covers blocks {blocks}, the server assigned {sorted(assigned_blocks)}")
    if "uncovered_blocks" in header.extra:  # a global file: the model's blocks it does not list
        uncovered = sorted({info.block for info in model_layers} - set(blocks))
        if json.loads(header.extra["uncovered_blocks"]) != uncovered:
            raise MaskFileError(path, "x_uncovered_blocks", f"{header.extra['uncovered_blocks']}, but the file "
                                                            f"lists every block except {uncovered}")
    return WeightFile(path, fingerprint, subset)  # checks whole blocks, order and shapes


@torch.no_grad()
def apply_weights(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Replace the listed linears' weights in place (a FedSpaLLM global model)."""
    for name, weight in weights.items():
        linear = linear_by_name(model, name)
        linear.weight.copy_(weight.to(linear.weight.device, linear.weight.dtype))


def apply_weight_file(model: nn.Module, path: Path, model_fingerprint: str) -> dict:
    """Load a (global or client) weight file into ``model`` in place; linears it does not list
    keep their base weights. ``model_fingerprint`` is the *base* model's fingerprint."""
    from fedlib.models import prunable_layers

    wf = open_weight_file(path, model_fingerprint, prunable_layers(model))
    for name in wf.layer_names:
        apply_weights(model, {name: wf.layer_weight(name)})
    header = wf.header
    return {"role": header.role, "method": header.method, "group": header.group,
            "sparsity": header.sparsity, "n_clients": header.n_clients, "layers": len(wf.layer_names),
            "round": wf.round, "uncovered_blocks": json.loads(header.extra.get("uncovered_blocks", "[]"))}
