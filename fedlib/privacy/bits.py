"""Mask bits as the privacy stages read them: layer names, flat and packed bit vectors,
exact bit counts, and header-checked client mask files read layer by layer as packed bits."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch


def layer_type(name: str) -> str:
    """``model.layers.3.self_attn.q_proj`` -> ``q_proj``."""
    return name.rsplit(".", 1)[-1]


def block_of(name: str) -> int:
    """The decoder block of a layer name (its first numeric part), -1 if none."""
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return -1


def flat_mask(masks: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """One flat bool vector of the masks in the given layer order."""
    return torch.cat([masks[n].reshape(-1).to(torch.bool) for n in names])


def packed_bits(mask: torch.Tensor) -> np.ndarray:
    """A mask as little-endian packed bits (the mask file's layout), padding bits 0."""
    return np.packbits(mask.detach().cpu().reshape(-1).numpy().astype(bool), bitorder="little")


def popcount(a: np.ndarray) -> int:
    """Set bits of a packed array."""
    return int(np.bitwise_count(a).sum())


@contextlib.contextmanager
def open_mask_files(paths: Sequence[Path], handle):
    """Mask files header-checked against the model ``handle`` (a
    :class:`fedlib.models.ModelHandle`: its fingerprint and layers; its weights decode format
    version 2 files) and a reader of each layer's packed bits: ``packed(i, name) -> uint8
    array`` (padding bits are 0, as the format requires, so XOR + popcount over packed arrays
    counts exact differences)."""
    from safetensors import safe_open

    from fedlib.maskcode import MagnitudeReference
    from fedlib.maskfile import MaskFile, MaskFileError

    layers = handle.layers()
    reference = MagnitudeReference.of_model(handle)
    files = [MaskFile(Path(p), handle.fingerprint(), layers, reference=reference) for p in paths]
    sizes = {info.name: math.prod(info.shape) for info in layers}
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f.path), framework="np")) for f in files]

        def packed(i: int, name: str) -> np.ndarray:
            if files[i].header.format_version == 2:  # coded: the reader decodes (and checks) the bits
                return packed_bits(files[i].layer_mask(name))
            arr = handles[i].get_tensor(f"mask:{name}")
            if arr.dtype != np.uint8 or arr.shape != ((sizes[name] + 7) // 8,):
                raise MaskFileError(files[i].path, f"mask:{name}", f"unexpected packed shape {arr.shape}")
            return arr

        yield files, packed
