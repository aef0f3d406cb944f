"""The mask file: what a client sends and what the server writes back. A real protocol.

Format (safetensors, so no pickle and a bounded, checkable header):

* one ``uint8`` tensor ``mask:<layer>`` per prunable linear: the layer's mask flattened in
  row-major order and packed 8 weights per byte, least significant bit first; bit = 1 means
  the weight is **pruned** (the papers' convention M_ij = 1); padding bits are 0;
* optionally ``votes:<layer>`` (``uint8`` or ``int16``, shape of the layer): how many clients
  pruned each weight, in a server's global mask (needed for weight scaling);
* string metadata: ``format`` = ``fedlib-mask``, ``format_version``, ``model_fingerprint``,
  ``role`` (``client`` or ``global``), ``client_id``, ``method``, ``group``, ``sparsity``
  (the claimed target), ``allocation`` (``uniform`` or ``nonuniform`` per-layer sparsity),
  ``n_samples``, ``seed``, ``n_clients`` (global), ``fedlib_version`` and ``layers``: JSON list
  of ``{"name", "shape", "pruned"}`` in model order.

:func:`read_header` checks the metadata against the model without reading the bits;
:func:`MaskFile.layer_mask` checks each layer's bits against its claim as it is read.
Every error names the file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from fedlib import __version__
from fedlib.groups import GROUPS, expected_pruned, group_sparsity, parse_nm
from fedlib.io import SafetensorsWriter
from fedlib.models import LayerInfo

FORMAT = "fedlib-mask"
FORMAT_VERSION = 1
#: slack on the whole-model sparsity of a non-uniform allocation (OWL, BESA)
SPARSITY_TOLERANCE = 0.005


class MaskFileError(ValueError):
    """A mask file that is unreadable or does not match the model or its own claims."""

    def __init__(self, path: Path | str, field_name: str, message: str):
        self.path, self.field = str(path), field_name
        super().__init__(f"mask file {path}: field {field_name!r}: {message}")


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    flat = mask.detach().to("cpu", torch.bool).reshape(-1).numpy()
    return torch.from_numpy(np.packbits(flat, bitorder="little"))


def unpack_bits(packed: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    count = math.prod(shape)
    bits = np.unpackbits(packed.numpy(), count=count, bitorder="little")
    return torch.from_numpy(bits.astype(bool)).reshape(tuple(shape))


@dataclass
class MaskHeader:
    path: Path
    fingerprint: str
    role: str
    client_id: str
    method: str
    group: str
    sparsity: float
    allocation: str
    n_samples: int
    seed: int
    n_clients: int
    layers: list[dict]
    extra: dict = field(default_factory=dict)

    @property
    def total_weights(self) -> int:
        return sum(math.prod(layer["shape"]) for layer in self.layers)

    @property
    def total_pruned(self) -> int:
        return sum(layer["pruned"] for layer in self.layers)


def votes_dtype(n_clients: int) -> torch.dtype:
    return torch.uint8 if n_clients <= 255 else torch.int16


class MaskWriter:
    """A mask file written layer by layer, in any order: what a client streams block by block
    and the server layer by layer, so memory holds one layer whatever the model's size.

    ``layers`` are the file's layers (model order); ``votes`` adds ``votes:<layer>`` tensors
    (a server's global mask); ``tensors`` declares further tensors (name -> (dtype, shape); a
    FedSpaLLM upload's ``weight:<layer>``). Every declared tensor must be added before
    :meth:`close`; the header's metadata (module docstring) is written then. Used as a context
    manager, an exception leaves nothing behind.
    """

    def __init__(
        self,
        path: Path,
        layers: Sequence[LayerInfo],
        *,
        fingerprint: str,
        role: str,
        client_id: str,
        method: str,
        group: str,
        sparsity: float,
        allocation: str = "uniform",
        n_samples: int = 0,
        seed: int = 0,
        n_clients: int = 1,
        votes: bool = False,
        extra: Mapping[str, str] | None = None,
        tensors: Mapping[str, tuple[torch.dtype, Sequence[int]]] | None = None,
    ):
        clash = [k for k in (tensors or {}) if k.startswith(("mask:", "votes:"))]
        if clash:
            raise ValueError(f"extra tensor names may not start with 'mask:' or 'votes:': {clash[:3]}")
        self.path, self.layers, self.with_votes = Path(path), list(layers), votes
        self.votes_dtype = votes_dtype(n_clients)
        declared = dict(tensors or {})
        for info in self.layers:
            declared[f"mask:{info.name}"] = (torch.uint8, ((math.prod(info.shape) + 7) // 8,))
            if votes:
                declared[f"votes:{info.name}"] = (self.votes_dtype, info.shape)
        self.shapes = {info.name: info.shape for info in self.layers}
        self.pruned: dict[str, int] = {}
        self.metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "model_fingerprint": fingerprint,
            "role": role,
            "client_id": str(client_id),
            "method": method,
            "group": group,
            "sparsity": repr(float(sparsity)),
            "allocation": allocation,
            "n_samples": str(int(n_samples)),
            "seed": str(int(seed)),
            "n_clients": str(int(n_clients)),
            "fedlib_version": __version__,
        }
        self.metadata.update({f"x_{k}": str(v) for k, v in (extra or {}).items()})
        self.writer = SafetensorsWriter(self.path, declared)

    def add(self, name: str, mask: torch.Tensor, votes: torch.Tensor | None = None) -> None:
        if name not in self.shapes:
            raise KeyError(f"{self.path}: {name!r} is not one of the file's layers")
        if tuple(mask.shape) != self.shapes[name]:
            raise ValueError(f"{name}: mask shape {tuple(mask.shape)} != layer {self.shapes[name]}")
        if (votes is not None) != self.with_votes:
            raise ValueError(f"{name}: this file {'needs' if self.with_votes else 'has no'} vote counts")
        self.writer.add(f"mask:{name}", pack_bits(mask))
        self.pruned[name] = int(mask.sum())
        if votes is not None:
            self.writer.add(f"votes:{name}", votes.to("cpu", self.votes_dtype).contiguous())

    def add_tensor(self, name: str, tensor: torch.Tensor) -> None:
        self.writer.add(name, tensor)

    def close(self) -> None:
        layer_meta = [{"name": info.name, "shape": list(info.shape), "pruned": self.pruned.get(info.name)}
                      for info in self.layers]
        self.writer.close({**self.metadata, "layers": json.dumps(layer_meta, separators=(",", ":"))})

    def __enter__(self) -> "MaskWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.writer.abort()


def write_mask_file(
    path: Path,
    masks: Mapping[str, torch.Tensor],
    layers: Sequence[LayerInfo],
    *,
    votes: Mapping[str, torch.Tensor] | None = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
    **header,
) -> None:
    """Write a whole mask file at once (:class:`MaskWriter` for the header fields).
    ``tensors`` adds further named tensors to the same file (FedSpaLLM uploads carry
    ``weight:<layer>``); their names must not use the ``mask:``/``votes:`` prefixes, and
    checking them is the reader's business (``fedlib.weightfile``)."""
    payload = dict(tensors or {})
    declared = {name: (t.dtype, tuple(t.shape)) for name, t in payload.items()}
    with MaskWriter(path, layers, votes=votes is not None, tensors=declared, **header) as writer:
        for info in layers:
            writer.add(info.name, masks[info.name], None if votes is None else votes[info.name])
        for name, tensor in payload.items():
            writer.add_tensor(name, tensor)


def _field(meta: dict, key: str, path: Path, convert=str):
    if key not in meta:
        raise MaskFileError(path, key, "missing")
    try:
        return convert(meta[key])
    except (TypeError, ValueError):
        raise MaskFileError(path, key, f"cannot parse {meta[key]!r} as {convert.__name__}") from None


def read_header(
    path: Path,
    expected_fingerprint: str | None = None,
    expected_layers: Sequence[LayerInfo] | None = None,
    whole_model: bool = True,
) -> MaskHeader:
    """Parse and check a mask file's metadata (no bits are read). ``whole_model=False``: the
    file holds some blocks of the model (a round of iterative FedPrLLM), so a non-uniform
    allocation need not meet the sparsity budget over them."""
    path = Path(path)
    if not path.is_file():
        raise MaskFileError(path, "file", "not found")
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = dict(handle.metadata() or {})
            keys = set(handle.keys())
    except Exception as err:  # truncated or not safetensors at all
        raise MaskFileError(path, "file", f"not a readable safetensors file ({err})") from None
    if meta.get("format") != FORMAT:
        raise MaskFileError(path, "format", f"expected {FORMAT!r}, got {meta.get('format')!r}")
    version = _field(meta, "format_version", path, int)
    if version != FORMAT_VERSION:
        raise MaskFileError(path, "format_version", f"expected {FORMAT_VERSION}, got {version}")
    try:
        layers = json.loads(_field(meta, "layers", path))
        for layer in layers:
            layer["shape"] = [int(x) for x in layer["shape"]]
            layer["pruned"] = int(layer["pruned"])
            str(layer["name"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise MaskFileError(path, "layers", f"expected a JSON list of {{name, shape, pruned}} ({err})") from None
    header = MaskHeader(
        path=path,
        fingerprint=_field(meta, "model_fingerprint", path),
        role=_field(meta, "role", path),
        client_id=_field(meta, "client_id", path),
        method=_field(meta, "method", path),
        group=_field(meta, "group", path),
        sparsity=_field(meta, "sparsity", path, float),
        allocation=_field(meta, "allocation", path),
        n_samples=_field(meta, "n_samples", path, int),
        seed=_field(meta, "seed", path, int),
        n_clients=_field(meta, "n_clients", path, int),
        layers=layers,
        extra={k[2:]: v for k, v in meta.items() if k.startswith("x_")},
    )
    _check_header(header, keys, expected_fingerprint, expected_layers, whole_model)
    return header


def _check_header(header: MaskHeader, keys: set, fingerprint, expected_layers, whole_model: bool) -> None:
    path = header.path
    if header.role not in ("client", "global"):
        raise MaskFileError(path, "role", f"expected 'client' or 'global', got {header.role!r}")
    if header.group not in GROUPS:
        try:
            parse_nm(header.group)
        except ValueError as err:
            raise MaskFileError(path, "group", str(err)) from None
    if not 0.0 <= header.sparsity < 1.0:
        raise MaskFileError(path, "sparsity", f"expected a fraction in [0, 1), got {header.sparsity}")
    if header.allocation not in ("uniform", "nonuniform"):
        raise MaskFileError(path, "allocation", f"expected 'uniform' or 'nonuniform', got {header.allocation!r}")
    if fingerprint is not None and header.fingerprint != fingerprint:
        raise MaskFileError(
            path, "model_fingerprint",
            f"{header.fingerprint[:16]}... does not match the base model ({fingerprint[:16]}...): "
            "this mask was computed on a different model",
        )
    if expected_layers is not None:
        claimed = [(layer["name"], tuple(layer["shape"])) for layer in header.layers]
        wanted = [(info.name, info.shape) for info in expected_layers]
        if claimed != wanted:
            diff = next(
                (f"{c} vs model {w}" for c, w in zip(claimed, wanted) if c != w),
                f"{len(claimed)} layers vs model {len(wanted)}",
            )
            raise MaskFileError(path, "layers", f"do not match the model's prunable layers: {diff}")
    for layer in header.layers:
        numel = math.prod(layer["shape"])
        if f"mask:{layer['name']}" not in keys:
            raise MaskFileError(path, f"mask:{layer['name']}", "tensor missing")
        if not 0 <= layer["pruned"] <= numel:
            raise MaskFileError(path, "layers", f"{layer['name']}: pruned count {layer['pruned']} outside 0..{numel}")
        if header.allocation == "uniform":
            expected = expected_pruned(tuple(layer["shape"]), header.sparsity, header.group)
            if layer["pruned"] != expected:
                raise MaskFileError(
                    path, "sparsity",
                    f"{layer['name']} claims {layer['pruned']} pruned weights; a uniform "
                    f"{header.sparsity} {header.group} mask has exactly {expected}",
                )
    if not whole_model:  # uniform: every layer's count was checked above
        return
    target = group_sparsity(header.group, header.sparsity)
    actual = header.total_pruned / max(header.total_weights, 1)
    if abs(actual - target) > SPARSITY_TOLERANCE + _rounding_slack(header):
        raise MaskFileError(
            path, "sparsity",
            f"layers claim {actual:.4f} of weights pruned overall, the file claims {target:.4f}",
        )


def _rounding_slack(header: MaskHeader) -> float:
    # row/column groups floor per row/column: at most one weight per group below target
    if not header.layers:
        return 0.0
    return max(1.0 / min(layer["shape"]) for layer in header.layers)


class MaskFile:
    """An open, header-checked mask file; layers are read and checked one at a time so the
    server's memory does not grow with the number of clients."""

    def __init__(self, path: Path, expected_fingerprint: str | None = None,
                 expected_layers: Sequence[LayerInfo] | None = None, whole_model: bool = True):
        self.header = read_header(path, expected_fingerprint, expected_layers, whole_model)
        self.path = Path(path)
        self._shapes = {layer["name"]: layer for layer in self.header.layers}

    def _tensor(self, key: str) -> torch.Tensor:
        try:
            with safe_open(str(self.path), framework="pt") as handle:
                return handle.get_tensor(key)
        except Exception as err:
            raise MaskFileError(self.path, key, f"unreadable ({err})") from None

    def layer_mask(self, name: str) -> torch.Tensor:
        layer = self._shapes[name]
        shape = layer["shape"]
        packed = self._tensor(f"mask:{name}")
        nbytes = (math.prod(shape) + 7) // 8
        if packed.dtype != torch.uint8 or tuple(packed.shape) != (nbytes,):
            raise MaskFileError(
                self.path, f"mask:{name}",
                f"expected uint8 of {nbytes} bytes for shape {shape}, got {packed.dtype} {tuple(packed.shape)}",
            )
        mask = unpack_bits(packed, shape)
        spare = nbytes * 8 - math.prod(shape)
        if spare and int(packed[-1]) >> (8 - spare):
            raise MaskFileError(self.path, f"mask:{name}", "padding bits are not zero")
        pruned = int(mask.sum())
        if pruned != layer["pruned"]:
            raise MaskFileError(
                self.path, f"mask:{name}",
                f"has {pruned} pruned weights but the header claims {layer['pruned']}",
            )
        return mask

    def layer_votes(self, name: str) -> torch.Tensor:
        key = f"votes:{name}"
        votes = self._tensor(key)
        shape = tuple(self._shapes[name]["shape"])
        if tuple(votes.shape) != shape or votes.dtype not in (torch.uint8, torch.int16):
            raise MaskFileError(self.path, key, f"expected uint8/int16 of shape {shape}")
        if int(votes.min()) < 0 or int(votes.max()) > self.header.n_clients:
            raise MaskFileError(self.path, key, f"vote counts outside 0..{self.header.n_clients}")
        return votes.to(torch.int32)

    def has_votes(self) -> bool:
        with safe_open(str(self.path), framework="pt") as handle:
            return any(k.startswith("votes:") for k in handle.keys())

    def masks(self) -> dict[str, torch.Tensor]:
        return {layer["name"]: self.layer_mask(layer["name"]) for layer in self.header.layers}
