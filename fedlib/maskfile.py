"""The mask file: what a client sends and what the server writes back. A real protocol.

Format (safetensors, so no pickle and a bounded, checkable header):

* one ``uint8`` tensor ``mask:<layer>`` per prunable linear: the layer's mask flattened in
  row-major order and packed 8 weights per byte, least significant bit first; bit = 1 means
  the weight is **pruned** (the papers' convention M_ij = 1); padding bits are 0;
* in a server's global mask, optionally ``votes:<layer>`` for every layer (``uint8``, or
  ``int16`` beyond 255 clients; shape of the layer): how many clients pruned each weight
  (needed for weight scaling);
* in a weight file (:mod:`fedlib.weightfile`, ``x_payload = "weights"``), ``weight:<layer>``;
* string metadata: ``format`` = ``fedlib-mask``, ``format_version``, ``model_fingerprint``,
  ``role`` (``client`` or ``global``), ``client_id`` (:data:`CLIENT_ID`), ``method``, ``group``, ``sparsity``
  (the claimed target), ``allocation`` (``uniform`` or ``nonuniform`` per-layer sparsity),
  ``n_samples``, ``seed``, ``n_clients`` (global; 1 in a client file), ``fedlib_version`` and
  ``layers``: JSON list of ``{"name", "shape", "pruned"}`` in model order; plus the ``x_``
  fields of the file's kind (:data:`EXTRAS`).

Format version 2 (client mask files only; ``--format-version 2``): ``mask:<layer>`` is the
layer's mask entropy-coded against a reference computed from the public model
(:mod:`fedlib.maskcode`), variable length; two more fields name the reference (``reference``)
and the sha256 of what it computes for the file's layers (``reference_sha256``). The reader
decodes a layer only with the same reference (:class:`MaskFile`'s ``reference``) and accepts
only the bytes the writer produces for the decoded bits; every other check is version 1's.

Reading is strict: a server takes files from parties it does not control, so a file is either
exactly what fedlib's writer produces for content the protocol allows, or refused with a
:class:`MaskFileError` naming the file and the field. :func:`read_header` (no bits read)
checks that the safetensors header is byte for byte the writer's (sorted compact JSON, ASCII
escapes, padded with spaces to 8 bytes, data contiguous and covering the file exactly); the
exact metadata key set of the file's kind; every value's type, range and canonical text
(integers in plain decimal, ``sparsity`` as ``repr(float)``, JSON as the writer dumps it,
``method`` a registered method or, for global files, ``<schedule>[<method>]<label>``); the
exact tensor set, dtypes and shapes the metadata implies; and every count the file claims
against the model and the method (uniform: exactly :func:`fedlib.groups.expected_pruned`;
nonuniform: within the range the method declares,
:meth:`fedlib.methods.base.LayerPruner.layer_sparsity_bounds`, and the whole-model budget).
:meth:`MaskFile.layer_mask` checks each layer's bits against its claims as it is read: the
count, zero padding, and the group's counts (each row/column, or N of every M).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedlib import __version__
from fedlib.groups import GROUPS, expected_pruned, group_sparsity, parse_nm, pruned_count
from fedlib.io import SafetensorsWriter, read_at, safetensors_code, safetensors_layout, write_safetensors
from fedlib.methods import METHODS
from fedlib.models import DTYPES, LayerInfo
from fedlib.protocol import CLIENT_ID, ROBUST_RULES, ROUNDINGS, SCHEDULES
from fedlib.protocol import client_id as check_client_id  # the writer's parameter is named client_id
from fedlib.protocol import show_value as _show

FORMAT = "fedlib-mask"
FORMAT_VERSION = 1
#: the versions this reader accepts; 2 is the coded client mask (:mod:`fedlib.maskcode`)
FORMAT_VERSIONS = (1, 2)
#: the fields a version 2 file adds to :data:`METADATA_FIELDS`
CODED_FIELDS = ("reference", "reference_sha256")
#: slack on the whole-model sparsity of a non-uniform allocation (OWL, BESA)
SPARSITY_TOLERANCE = 0.005
#: safetensors' own bound on a file's JSON header
MAX_HEADER_BYTES = 100_000_000
#: bound on a layer dimension, checked before any arithmetic on it
MAX_DIMENSION = 1 << 31
#: the payload of a weight file (:mod:`fedlib.weightfile`): ``x_payload`` and its tensors
PAYLOAD = "weights"
WEIGHT_PREFIX = "weight:"
WEIGHT_DTYPES = {"float16": torch.float16, "float32": torch.float32}


class MaskFileError(ValueError):
    """A mask file that is unreadable or does not match the model or its own claims."""

    def __init__(self, path: Path | str, field_name: str, message: str):
        self.path, self.field = str(path), field_name
        super().__init__(f"mask file {path}: field {field_name!r}: {message}")


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """The mask's bits packed (module docstring), on the host. A mask on a device is packed
    there, so that one eighth of it crosses to the host."""
    if mask.device.type != "cpu":
        return pack_bits_torch(mask).cpu()
    flat = mask.detach().to(torch.bool).reshape(-1).numpy()
    return torch.from_numpy(np.packbits(flat, bitorder="little"))


def pack_bits_torch(mask: torch.Tensor) -> torch.Tensor:
    """:func:`pack_bits` in torch operations, on the mask's device."""
    flat = mask.detach().reshape(-1).to(torch.uint8)
    octets = torch.nn.functional.pad(flat, (0, -flat.numel() % 8)).reshape(-1, 8)
    return (octets * _bit_places(flat.device)).sum(dim=1, dtype=torch.uint8)


def _bit_places(device: torch.device) -> torch.Tensor:
    """Each bit's value in a packed byte, least significant first (the module's bit order)."""
    return torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8).to(device=device)


def unpack_bits(packed: torch.Tensor, shape: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """The mask :func:`pack_bits` packed, of ``shape``: unpacked on the host, or on ``device``
    (only the packed eighth crosses to it)."""
    if device is not None and device.type != "cpu":
        return unpack_bits_torch(packed.to(device), shape)
    bits = np.unpackbits(packed.numpy(), count=math.prod(shape), bitorder="little")
    return torch.from_numpy(bits.view(bool)).reshape(tuple(shape))  # 0/1 bytes are bools: no copy


def unpack_bits_torch(packed: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """:func:`unpack_bits` in torch operations, on the packed bytes' device."""
    bits = (packed.reshape(-1, 1) & _bit_places(packed.device)) != 0
    return bits.reshape(-1)[: math.prod(shape)].reshape(tuple(shape))


def count_true(mask: torch.Tensor, dim: int | None = None):
    """How many entries of a boolean mask are true (an int), or along ``dim`` (a tensor). On the
    host this is numpy's count: torch's bool sum there is about 50x slower, which made reading
    a 7B mask file's checks cost more than the forward passes they guard."""
    if mask.device.type != "cpu":
        return int(mask.sum()) if dim is None else mask.sum(dim)
    bits = mask.numpy()
    return int(np.count_nonzero(bits)) if dim is None else torch.from_numpy(np.count_nonzero(bits, axis=dim))


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
    #: the ``x_`` metadata without the prefix (checked: :data:`EXTRAS`)
    extra: dict = field(default_factory=dict)
    #: "mask", or :data:`PAYLOAD` for a weight file
    payload: str = "mask"
    #: a global file's ``votes:`` tensors are present
    votes: bool = False
    #: every tensor: name -> (dtype, shape, offset of its bytes in the file)
    tensors: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    #: version 2: the reference's name and sha256 (:mod:`fedlib.maskcode`)
    reference: str = ""
    reference_sha256: str = ""

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

    ``format_version=2`` codes each layer against ``reference`` (a
    :class:`fedlib.maskcode.MagnitudeReference` of the public model): a client mask file only,
    no votes or further tensors. The coded layers (about a third of version 1's bytes) are held
    until :meth:`close`, whose header needs their lengths.
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
        format_version: int = FORMAT_VERSION,
        reference=None,
    ):
        if format_version not in FORMAT_VERSIONS:
            raise ValueError(f"format_version must be one of {FORMAT_VERSIONS}, got {format_version!r}")
        if format_version == 2 and (role != "client" or votes or tensors or reference is None):
            raise ValueError("format version 2 is a client's mask file (no votes or further tensors) coded "
                             "against a reference")
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
        self.group, self.reference = group, reference
        #: version 2: layer -> (coded payload, digest of the reference's buckets)
        self.coded: dict[str, tuple[torch.Tensor, bytes]] | None = {} if format_version == 2 else None
        self.metadata = {
            "format": FORMAT,
            "format_version": str(format_version),
            "model_fingerprint": fingerprint,
            "role": role,
            "client_id": check_client_id(str(client_id)),
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
        self.writer = SafetensorsWriter(self.path, declared) if self.coded is None else None

    def add(self, name: str, mask: torch.Tensor, votes: torch.Tensor | None = None) -> None:
        if name not in self.shapes:
            raise KeyError(f"{self.path}: {name!r} is not one of the file's layers")
        if tuple(mask.shape) != self.shapes[name]:
            raise ValueError(f"{name}: mask shape {tuple(mask.shape)} != layer {self.shapes[name]}")
        if (votes is not None) != self.with_votes:
            raise ValueError(f"{name}: this file {'needs' if self.with_votes else 'has no'} vote counts")
        if self.coded is None:
            self.writer.add(f"mask:{name}", pack_bits(mask))
        else:
            from fedlib.maskcode import encode_layer, layer_digest

            buckets = self.reference.buckets(name, self.group)
            self.coded[name] = (encode_layer(mask, buckets), layer_digest(name, self.group, buckets))
        self.pruned[name] = count_true(mask)
        if votes is not None:
            self.writer.add(f"votes:{name}", votes.to("cpu", self.votes_dtype).contiguous())

    def add_tensor(self, name: str, tensor: torch.Tensor) -> None:
        self.writer.add(name, tensor)

    def close(self) -> None:
        layer_meta = [{"name": info.name, "shape": list(info.shape), "pruned": self.pruned.get(info.name)}
                      for info in self.layers]
        metadata = {**self.metadata, "layers": json.dumps(layer_meta, separators=(",", ":"))}
        if self.coded is None:
            self.writer.close(metadata)
            return
        from fedlib.maskcode import combine_digests

        missing = [info.name for info in self.layers if info.name not in self.coded]
        if missing:
            raise ValueError(f"{self.path}: {len(missing)} layers never added, e.g. {missing[0]!r}")
        metadata["reference"] = self.reference.name
        metadata["reference_sha256"] = combine_digests([(info.name, self.coded[info.name][1]) for info in self.layers])
        write_safetensors(self.path, {f"mask:{name}": payload for name, (payload, _) in self.coded.items()}, metadata)

    def __enter__(self) -> "MaskWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            if self.writer is not None:
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


def write_without_votes(src: Path, dst: Path) -> None:
    """A copy of global mask file ``src`` without its ``votes:`` tensors, header otherwise the
    same: what a site continuing an iterative federation needs (the earlier blocks' masks) when
    it does not scale weights, without how many other sites pruned each weight."""
    from safetensors import safe_open

    with safe_open(str(src), "pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys() if not name.startswith("votes:")}
    write_safetensors(dst, tensors, metadata)


def _unique_keys(pairs: list) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _finite_number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {_show(text)} is not finite in float64")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str):
    """``json.loads`` without what Python's parser tolerates beyond JSON: NaN/Infinity, numbers
    that overflow to infinity (``-1e400``), duplicate keys (the last one silently winning),
    nesting deep enough to exhaust the stack. Every failure is a ``ValueError``."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_number,
                          object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _count(text: str) -> int:
    """A non-negative integer in canonical decimal (no sign, no leading zero, no spaces)."""
    if not re.fullmatch(r"0|[1-9][0-9]{0,17}", text):
        raise ValueError(f"expected a non-negative integer in canonical decimal, got {_show(text)}")
    return int(text)


def _float(text: str) -> float:
    """A finite float written as fedlib writes it: ``repr(float(x))``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or repr(value) != text:
        raise ValueError(f"expected a finite number written as repr(float), got {_show(text)}")
    return value


def _epsilon(text: str) -> float:
    """A privacy budget: positive, ``inf`` (no noise) included, as ``repr`` writes it."""
    value = math.inf if text == "inf" else _count(text) if text.isdigit() else _float(text)
    if not value > 0:
        raise ValueError(f"expected a positive epsilon, got {_show(text)}")
    return value


def _text(text: str, limit: int = 256) -> str:
    if not 0 < len(text) <= limit or not text.isprintable() or text != text.strip():
        raise ValueError(f"expected 1 to {limit} printable characters, no surrounding space, got {_show(text)}")
    return text


def _version(text: str) -> str:
    if len(text) > 64 or not re.fullmatch(r"[0-9][A-Za-z0-9.+-]*", text):
        raise ValueError(f"expected a version such as {__version__!r}, got {_show(text)}")
    return text


def _canonical_json(text: str, check, separators=(", ", ": ")):
    """``check(strict_json(text))``, and ``text`` must be exactly ``json.dumps`` of the value
    with ``separators`` (what the writer produced)."""
    value = check(strict_json(text))
    if json.dumps(value, separators=separators) != text:
        raise ValueError(f"not in canonical JSON form (json.dumps with separators {separators!r}): {_show(text)}")
    return value


def _json_object(value):
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {_show(value)}")
    return value


def _block_list(value):
    if not isinstance(value, list) or any(type(b) is not int or b < 0 for b in value) or value != sorted(set(value)):
        raise ValueError(f"expected an ascending JSON list of distinct block indices, got {_show(value)}")
    return value


def _client_list(value):
    if (not isinstance(value, list) or any(not isinstance(c, str) or not CLIENT_ID.fullmatch(c) for c in value)
            or value != sorted(set(value))):
        raise ValueError(f"expected an ascending JSON list of distinct client ids, got {_show(value)}")
    return value


def _robust_rule(text: str) -> str:
    """``<rule>:k=<k>`` of :data:`fedlib.protocol.ROBUST_RULES`, as the robust server writes it."""
    match = re.fullmatch(r"([a-z]+):k=(.+)", text)
    if match is None or match.group(1) not in ROBUST_RULES:
        raise ValueError(f"expected <rule>:k=<k> with a rule of {sorted(ROBUST_RULES)}, got {_show(text)}")
    k = _float(match.group(2))
    if not k > 0:
        raise ValueError(f"expected k > 0, got {_show(text)}")
    return text


def _group(text: str) -> str:
    if text in GROUPS:
        return text
    try:
        n, m = parse_nm(text)
    except ValueError as err:
        raise ValueError(str(err)) from None
    if text != f"{n}:{m}":
        raise ValueError(f"expected N:M written as {n}:{m}, got {_show(text)}")
    return text


def _one_of(*choices: str):
    def check(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {list(choices)}, got {_show(text)}")
        return text
    return check


def _release_digest(text: str) -> str:
    """``sha256:<64 hex digits>``: the noisy sums a DP mask was estimated from
    (:func:`fedlib.dp.public.release_digest`)."""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", text):
        raise ValueError(f"expected sha256:<64 hex digits> (the noisy sums' digest), got {_show(text)}")
    return text


def _sha256(text: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise ValueError(f"expected a sha256 in 64 lowercase hex digits, got {_show(text)}")
    return text


def _layers(text: str) -> list[dict]:
    value = strict_json(text)
    if not isinstance(value, list) or not value:
        raise ValueError(f"expected a non-empty JSON list of {{name, shape, pruned}}, got {_show(value)}")
    layers, seen = [], set()
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or list(entry) != ["name", "shape", "pruned"]:
            keys = list(entry) if isinstance(entry, dict) else entry
            raise ValueError(f"entry {i}: expected exactly the keys name, shape, pruned (in that order), got {_show(keys)}")
        name, shape, pruned = entry["name"], entry["shape"], entry["pruned"]
        if not isinstance(name, str) or not name.isprintable() or not 0 < len(name) <= 256 or name in seen:
            raise ValueError(f"entry {i}: name {_show(name)} is not a distinct printable layer name")
        seen.add(name)
        if (not isinstance(shape, list) or len(shape) != 2
                or not all(type(x) is int and 1 <= x <= MAX_DIMENSION for x in shape)):
            raise ValueError(f"{name}: shape must be 2 integers in 1..{MAX_DIMENSION}, got {_show(shape)}")
        if type(pruned) is not int or not 0 <= pruned <= math.prod(shape):
            raise ValueError(f"{name}: pruned count {_show(pruned)} is not an integer in 0..{math.prod(shape)}")
        layers.append({"name": name, "shape": shape, "pruned": pruned})
    if json.dumps(layers, separators=(",", ":")) != text:
        raise ValueError("not in canonical JSON form (no whitespace, as fedlib writes it)")
    return layers


def _dp_guarantee(value):
    """A DP client's ``x_dp``: exactly the fields of its mechanism in order (the Gaussian one of
    :class:`fedlib.dp.gaussian.DPGuarantee` names none; :mod:`fedlib.dp.public` and
    :mod:`fedlib.dp.distributed` name theirs), each of its type and range (``releases``
    and the accounting are checked against the layers later)."""
    from fedlib.dp import accountant, gaussian, public, samplers, unit

    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object (the mechanism's guarantee), got {_show(value)}")
    mechanism = value.get("mechanism")
    fields = {None: gaussian.GUARANTEE_FIELDS, public.NORMALISED: public.NORMALISED_FIELDS,
              accountant.DISTRIBUTED: accountant.DISTRIBUTED_FIELDS}.get(mechanism)
    if fields is None:
        raise ValueError(f"mechanism: expected {public.NORMALISED!r} or {accountant.DISTRIBUTED!r} (or none: "
                         f"the Gaussian mechanism), got {_show(mechanism)}")
    # files written before x_dp named its unit and noise source (one window; seeded in the studies),
    # and before that its estimator (the threshold, the only one then)
    before_unit = tuple(f for f in fields if f not in gaussian.RELEASE_FIELDS)
    legacy = (before_unit, tuple(f for f in before_unit if f != "estimator"))
    if tuple(value) not in (fields, *legacy):
        raise ValueError(f"expected a JSON object with exactly the keys {list(fields)} in that order, "
                         f"got {_show(list(value))}")
    positive = (lambda v: type(v) is float and 0 < v, "a positive finite float")
    count = (lambda v: type(v) is int and 1 <= v <= MAX_DIMENSION, f"an integer in 1..{MAX_DIMENSION}")
    named_accountant = accountant.ACCOUNTANT if mechanism == accountant.DISTRIBUTED else gaussian.ACCOUNTANT
    checks = {  # key -> (check, what is expected)
        "epsilon": positive,
        "delta": (lambda v: type(v) is float and 0 < v < 1, "a float in (0, 1)"),
        "clip": positive,
        "sigma": positive,
        "accountant": (lambda v: v == named_accountant, repr(named_accountant)),
        "neighbours": (lambda v: v == gaussian.NEIGHBOURS, repr(gaussian.NEIGHBOURS)),
        "releases": count,
        "unit": (lambda v: v in unit.UNITS, " or ".join(map(repr, unit.UNITS))),
        "windows_per_unit": (lambda v: type(v) is int and 1 <= v <= MAX_DIMENSION
                             and (v == 1 or value.get("unit") in unit.TEXT_UNITS),
                             f"an integer in 1..{MAX_DIMENSION} (1 for a client or window unit)"),
        "noise": (lambda v: v in samplers.NOISE_MODES, " or ".join(map(repr, samplers.NOISE_MODES))),
    }
    if mechanism is not None:
        checks.update({
            "basis": (lambda v: type(v) is int and 0 <= v <= MAX_DIMENSION, f"an integer in 0..{MAX_DIMENSION}"),
            # a signed (centred) statistic moves by up to 2 clip when one sample is replaced
            "sensitivity": (lambda v: v == public.SIGNED_SENSITIVITY * value.get("windows_per_unit", 1),
                            f"{public.SIGNED_SENSITIVITY} x windows_per_unit (x clip: the statistic is signed)"),
            "public": (lambda v: isinstance(v, str) and re.fullmatch(r"\d+x\d+:sha256:[0-9a-f]{64}", v) is not None,
                       "<windows>x<tokens>:sha256:<64 hex digits> (the public text)"),
        })
    if mechanism == accountant.DISTRIBUTED:
        checks.update({"clients": count, "grid": count})
    if "estimator" in value:
        checks["estimator"] = (lambda v: v in public.ESTIMATORS, " or ".join(map(repr, public.ESTIMATORS)))
    for key, (check, expected) in checks.items():
        if key in value and not check(value[key]):
            raise ValueError(f"{key}: expected {expected}, got {_show(value[key])}")
    return value


#: the metadata every mask file carries (module docstring)
METADATA_FIELDS = ("format", "format_version", "model_fingerprint", "role", "client_id", "method", "group",
                   "sparsity", "allocation", "n_samples", "seed", "n_clients", "fedlib_version", "layers")
_PARSE = {
    "model_fingerprint": _text, "role": _one_of("client", "global"), "client_id": check_client_id, "method": _text,
    "group": _group, "sparsity": _float, "allocation": _one_of("uniform", "nonuniform"), "n_samples": _count,
    "seed": _count, "n_clients": _count, "fedlib_version": _version, "layers": _layers,
    "reference": _one_of("magnitude"), "reference_sha256": _sha256,
}
#: the ``x_`` metadata each kind of file carries, by (role, payload): (always, optional), and how
#: each value is checked. Client masks: ``fedlib client-mask`` records the method's options and the
#: compute dtype (other writers, e.g. the simulations' tests, record neither), a DP client its
#: guarantee (:mod:`fedlib.dp.gaussian`). Global masks: the
#: randomized-response defence records its epsilon and what its votes are; the robust server
#: (:mod:`fedlib.server.robust`) its rule and the clients whose votes it did not count. Weight files
#: (:mod:`fedlib.weightfile`): payload, weight dtype and round; a global one also the blocks no
#: upload covered and (``fedlib aggregate``) the expansion rounding. A global file of a networked
#: round (``flower/``) names the federation's clients whose upload it lacks (``absent_clients``: no
#: answer by the round's deadline, or refused).
EXTRAS = {
    ("client", "mask"): ((), ("method_options", "dtype", "dp", "dp_release")),
    ("global", "mask"): ((), ("rr_epsilon_per_bit", "votes", "robust", "excluded_clients", "absent_clients")),
    ("client", PAYLOAD): (("payload", "weight_dtype", "round"), ()),
    ("global", PAYLOAD): (("payload", "weight_dtype", "round", "uncovered_blocks"), ("rounding", "absent_clients")),
}
#: optional fields a writer records together or not at all
PAIRED_EXTRAS = (("robust", "excluded_clients"),)
_PARSE_EXTRA = {
    "method_options": lambda t: _canonical_json(t, _json_object),
    "dtype": _one_of(*DTYPES),
    "rr_epsilon_per_bit": _epsilon,
    "votes": _text,
    "robust": _robust_rule,
    "excluded_clients": lambda t: _canonical_json(t, _client_list),
    "absent_clients": lambda t: _canonical_json(t, _client_list),
    "payload": _one_of(PAYLOAD),
    "weight_dtype": _one_of(*WEIGHT_DTYPES),
    "round": _count,
    "uncovered_blocks": lambda t: _canonical_json(t, _block_list),
    "rounding": _one_of(*ROUNDINGS),
    "dp": lambda t: _canonical_json(t, _dp_guarantee, separators=(",", ":")),
    "dp_release": lambda t: _release_digest(t),
}


def _global_method(text: str) -> str | None:
    """A global file's method: ``random`` (``fedlib random-mask``), or a server schedule
    (:data:`fedlib.protocol.SCHEDULES`) optionally followed by ``[<client method>]<label>`` (a
    vote hook's label, e.g. ``+rr``). Returns the client method, if named."""
    match = re.fullmatch(r"([a-z][a-z0-9-]*)(?:\[([a-z0-9_]+)\]([A-Za-z0-9_.+-]*))?", text)
    if text == "random":
        return None
    if match is None or match[1] not in SCHEDULES or (match[2] is not None and match[2] not in METHODS):
        raise ValueError(f"expected 'random', or one of {sorted(SCHEDULES)} with an optional "
                         f"[<method>]<label>, <method> one of {sorted(METHODS)}; got {_show(text)}")
    return match[2]


def _safetensors_header(path: Path) -> tuple[dict, bytes, int]:
    """(parsed JSON header, its bytes with the 8-byte length prefix, the file's size)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise MaskFileError(path, "file", f"not a readable safetensors file: {size} bytes, shorter than the 8-byte header length")
        length = int.from_bytes(prefix, "little")
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise MaskFileError(path, "file", f"not a readable safetensors file: header length {length} beyond the file's "
                                              f"{size} bytes (or safetensors' limit {MAX_HEADER_BYTES})")
        raw = handle.read(length)
    try:
        parsed = strict_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise MaskFileError(path, "file", f"not a readable safetensors file: its header is not JSON ({err})") from None
    if not isinstance(parsed, dict):
        raise MaskFileError(path, "file", "not a readable safetensors file: its header is not a JSON object")
    return parsed, prefix + raw, size


def read_header(
    path: Path,
    expected_fingerprint: str | None = None,
    expected_layers: Sequence[LayerInfo] | None = None,
    whole_model: bool = True,
) -> MaskHeader:
    """Parse and check a mask file's header (no bits are read): the safetensors header exactly
    as fedlib writes it, the metadata (module docstring), the tensors the metadata implies and
    the counts it claims. ``whole_model=False``: the file holds some blocks of the model (a
    round of iterative FedPrLLM), so a non-uniform allocation need not meet the sparsity
    budget over them."""
    path = Path(path)
    if not path.is_file():
        raise MaskFileError(path, "file", "not found")
    parsed, head, size = _safetensors_header(path)
    meta = parsed.get("__metadata__")
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise MaskFileError(path, "format", f"expected {FORMAT!r} in string metadata, the file has none")
    header = _parse_metadata(path, meta)
    _check_tensors(header, {k: v for k, v in parsed.items() if k != "__metadata__"}, meta, head, size)
    _check_header(header, expected_fingerprint, expected_layers, whole_model)
    return header


def _parse_metadata(path: Path, meta: dict) -> MaskHeader:
    if meta.get("format") != FORMAT:
        raise MaskFileError(path, "format", f"expected {FORMAT!r}, got {_show(meta.get('format'))}")
    versions = [str(v) for v in FORMAT_VERSIONS]
    if meta.get("format_version") not in versions:
        raise MaskFileError(path, "format_version", f"expected one of {versions}, got {_show(meta.get('format_version'))}")
    version = int(meta["format_version"])
    coded = CODED_FIELDS if version == 2 else ()
    values = {}
    for key in METADATA_FIELDS[2:] + coded:
        if key not in meta:
            raise MaskFileError(path, key, "missing")
        try:
            values[key] = _PARSE[key](meta[key])
        except ValueError as err:
            raise MaskFileError(path, key, str(err)) from None
    role, payload = values["role"], PAYLOAD if "x_payload" in meta else "mask"
    always, optional = EXTRAS[(role, payload)]
    allowed = set(METADATA_FIELDS) | set(coded) | {f"x_{k}" for k in always + optional}
    unknown = sorted(set(meta) - allowed)
    if unknown:
        raise MaskFileError(path, unknown[0], f"not a field of a {role} {payload} file; its x_ fields are "
                                              f"{sorted(always + optional)}")
    extra = {}
    for key in always + optional:
        if f"x_{key}" not in meta:
            if key in always:
                raise MaskFileError(path, f"x_{key}", f"missing (a {role} {payload} file carries it)")
            continue
        try:
            _PARSE_EXTRA[key](meta[f"x_{key}"])
        except ValueError as err:
            raise MaskFileError(path, f"x_{key}", str(err)) from None
        extra[key] = meta[f"x_{key}"]
    for together in PAIRED_EXTRAS:
        if 0 < sum(key in extra for key in together) < len(together):
            missing = next(key for key in together if key not in extra)
            raise MaskFileError(path, f"x_{missing}", f"missing (written together with {sorted(set(together) & set(extra))})")
    header = MaskHeader(
        path=path, fingerprint=values["model_fingerprint"], role=role, client_id=values["client_id"],
        method=values["method"], group=values["group"], sparsity=values["sparsity"],
        allocation=values["allocation"], n_samples=values["n_samples"], seed=values["seed"],
        n_clients=values["n_clients"], layers=values["layers"], extra=extra, payload=payload,
        format_version=version, reference=values.get("reference", ""),
        reference_sha256=values.get("reference_sha256", ""),
    )
    if version == 2 and (role, payload) != ("client", "mask"):
        raise MaskFileError(path, "format_version", f"version 2 is a client's mask file, this is a {role} {payload} file")
    if not 0.0 <= header.sparsity < 1.0:
        raise MaskFileError(path, "sparsity", f"expected a fraction in [0, 1), got {header.sparsity}")
    _check_method(header)
    return header


def _check_method(header: MaskHeader) -> None:
    """The method is one fedlib knows, and the allocation is the one it makes."""
    path = header.path
    if header.role == "client":
        if header.method not in METHODS:
            raise MaskFileError(path, "method", f"expected one of {sorted(METHODS)}, got {_show(header.method)}")
        if header.n_clients != 1:
            raise MaskFileError(path, "n_clients", f"a client file is one client's: expected 1, got {header.n_clients}")
        method = header.method
    else:
        try:
            method = _global_method(header.method)
        except ValueError as err:
            raise MaskFileError(path, "method", str(err)) from None
        if header.n_clients < 1:
            raise MaskFileError(path, "n_clients", "a global file aggregates at least 1 client, got 0")
    # a weight file's allocation is measured by its writer (Eq. 7's ceil makes it nonuniform)
    if method is not None and header.payload == "mask" and header.allocation != METHODS[method].allocation:
        raise MaskFileError(path, "allocation", f"{method} allocates {METHODS[method].allocation}ly, "
                                                f"the file claims {header.allocation!r}")
    if "dp_release" in header.extra and "dp" not in header.extra:
        raise MaskFileError(path, "x_dp_release", "a release digest without the guarantee it belongs to (x_dp)")
    if "dp" in header.extra:
        from fedlib.dp.gaussian import count_releases, gaussian_delta
        from fedlib.dp.accountant import DISTRIBUTED, rdp_epsilon

        if header.method != "wanda" or json.loads(header.extra.get("method_options", "{}")):
            raise MaskFileError(path, "x_dp", f"DP masks are plain Wanda's, the file's method is {header.method!r} "
                                              f"with options {header.extra.get('method_options', '{}')}")
        dp, releases = json.loads(header.extra["dp"]), count_releases(layer["name"] for layer in header.layers)
        if dp["releases"] != releases:
            raise MaskFileError(path, "x_dp", f"releases: the file's layers read {releases} distinct inputs, "
                                              f"the guarantee claims {dp['releases']}")
        if dp.get("mechanism") == DISTRIBUTED:
            proven = rdp_epsilon(dp["sigma"], releases, dp["delta"], dp["clients"], dp["grid"])
            if proven > dp["epsilon"] * (1 + 1e-9):
                raise MaskFileError(path, "x_dp", f"sigma {dp['sigma']} over {releases} releases of {dp['clients']} "
                                                  f"clients' discrete Gaussian sum is ({proven}, {dp['delta']})-DP by "
                                                  f"RDP, not the claimed epsilon {dp['epsilon']}")
        elif gaussian_delta(dp["epsilon"], dp["sigma"], releases) > dp["delta"] * (1 + 1e-9):
            raise MaskFileError(path, "x_dp", f"sigma {dp['sigma']} over {releases} releases is not "
                                              f"({dp['epsilon']}, {dp['delta']})-DP (exact Gaussian composition)")
    if header.role == "client" and header.allocation == "nonuniform" and header.group not in GROUPS:
        raise MaskFileError(path, "group", f"a nonuniform allocation needs an unstructured group {GROUPS}, "
                                           f"got {header.group!r}")


def _check_tensors(header: MaskHeader, entries: dict, meta: dict, head: bytes, size: int) -> None:
    """The file holds exactly the tensors its metadata implies (``mask:`` per layer; ``votes:``
    per layer or none in a global file; ``weight:`` per layer in a weight file), with their
    dtypes and shapes, laid out and written exactly as :class:`MaskWriter` does."""
    path = header.path
    header.votes = any(name.startswith("votes:") for name in entries)
    if header.votes and header.role != "global":
        name = next(name for name in sorted(entries) if name.startswith("votes:"))
        raise MaskFileError(path, name, "a client file carries no vote counts")
    declared = {}
    for layer in header.layers:
        shape = tuple(layer["shape"])
        declared[f"mask:{layer['name']}"] = (torch.uint8, (_payload_bytes(header, layer, entries, path),))
        if header.votes:
            declared[f"votes:{layer['name']}"] = (votes_dtype(header.n_clients), shape)
        if header.payload == PAYLOAD:
            declared[f"{WEIGHT_PREFIX}{layer['name']}"] = (WEIGHT_DTYPES[header.extra["weight_dtype"]], shape)
    for name in sorted(entries):
        if name not in declared:
            raise MaskFileError(path, name, f"unexpected tensor: a {header.role} {header.payload} file holds "
                                            f"mask:{'/votes:' * header.votes}"
                                            f"{'/' + WEIGHT_PREFIX if header.payload == PAYLOAD else ''}<layer> "
                                            "for its layers only")
    canonical, spans = safetensors_layout(declared, meta, path)
    for name, (dtype, shape) in declared.items():
        entry = entries.get(name)
        if entry is None:
            raise MaskFileError(path, name, "tensor missing")
        offset, nbytes = spans[name]
        wanted = {"dtype": safetensors_code(dtype), "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        if entry != wanted:
            raise MaskFileError(path, name, f"expected {_show(wanted, 120)}, got {_show(entry, 120)}")
    if head != canonical:
        raise MaskFileError(path, "file", "safetensors header not in the form fedlib writes (sorted keys, no "
                                          "whitespace, ASCII escapes, padded with spaces to 8 bytes)")
    expected_size = len(canonical) + sum(nbytes for _, nbytes in spans.values())
    if size != expected_size:
        raise MaskFileError(path, "file", f"{size} bytes, its header describes {expected_size}")
    header.tensors = {name: (dtype, shape, len(canonical) + spans[name][0]) for name, (dtype, shape) in declared.items()}


def _payload_bytes(header: MaskHeader, layer: dict, entries: dict, path: Path) -> int:
    """The length of a layer's ``mask:`` tensor: its packed bits (version 1), or what the file
    says (version 2's coded layers vary), if it says it as a 1-D length within the file: at
    least the layer's probability table (2 bytes per bucket), so an empty layer is refused here."""
    if header.format_version == 1:
        return (math.prod(layer["shape"]) + 7) // 8
    from fedlib.maskcode import n_buckets

    name = f"mask:{layer['name']}"
    shape = entries.get(name, {}).get("shape") if isinstance(entries.get(name), dict) else None
    low, high = 2 * n_buckets(tuple(layer["shape"]), header.group), math.prod(layer["shape"]) + 1024
    if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int and low <= shape[0] <= high
            and shape[0] <= MAX_HEADER_BYTES):
        raise MaskFileError(path, name, f"expected a coded layer: uint8 of shape [bytes], bytes in "
                                        f"{low}..{high}, got {_show(entries.get(name), 120)}")
    return shape[0]


def _check_header(header: MaskHeader, fingerprint, expected_layers, whole_model: bool) -> None:
    path = header.path
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
    if header.group not in GROUPS:
        m = parse_nm(header.group)[1]
        odd = next((layer for layer in header.layers if layer["shape"][1] % m), None)
        if odd is not None:
            raise MaskFileError(path, "group", f"{header.group}: {odd['name']} has {odd['shape'][1]} input columns, "
                                               f"not a multiple of {m}")
    bounds = _layer_bounds(header)
    if header.allocation == "nonuniform" and header.payload == PAYLOAD and all(
            layer["pruned"] == expected_pruned(tuple(layer["shape"]), header.sparsity, header.group)
            for layer in header.layers):
        # the writer measures a weight file's allocation: uniform counts are written "uniform"
        raise MaskFileError(path, "allocation", "'nonuniform', but every layer prunes exactly the uniform count")
    for layer in header.layers:
        shape = tuple(layer["shape"])
        if header.allocation == "uniform":
            expected = expected_pruned(shape, header.sparsity, header.group)
            if layer["pruned"] != expected:
                raise MaskFileError(
                    path, "sparsity",
                    f"{layer['name']} claims {layer['pruned']} pruned weights; a uniform "
                    f"{header.sparsity} {header.group} mask has exactly {expected}",
                )
        elif bounds is not None:
            lo, hi, ceil = bounds
            low = expected_pruned(shape, lo, header.group)
            high = (ceil_pruned if ceil else expected_pruned)(shape, hi, header.group)
            if not low <= layer["pruned"] <= high:
                raise MaskFileError(
                    path, "layers",
                    f"{layer['name']} claims {layer['pruned']} of {math.prod(shape)} weights pruned; "
                    f"{header.method} at {header.sparsity} gives a layer {low}..{high} ({header.group} groups)",
                )
    if not whole_model:  # uniform: every layer's count was checked above
        return
    target = group_sparsity(header.group, header.sparsity)
    actual = header.total_pruned / header.total_weights
    if abs(actual - target) > SPARSITY_TOLERANCE + _rounding_slack(header):
        raise MaskFileError(
            path, "sparsity",
            f"layers claim {actual:.4f} of weights pruned overall, the file claims {target:.4f}",
        )


def _layer_bounds(header: MaskHeader) -> tuple[float, float, bool] | None:
    """The fractions (lo, hi) a client's nonuniform layer may be pruned at, and whether a group
    may round up (a weight file: Eq. 7's ceil): what its method declares
    (:meth:`fedlib.methods.base.LayerPruner.layer_sparsity_bounds`) for the file's options.
    None for a global file: the server's own allocation, bounded by the whole-model budget."""
    if header.role != "client":
        return None
    options = json.loads(header.extra.get("method_options", "{}"))
    try:
        lo, hi = METHODS[header.method].layer_sparsity_bounds(header.sparsity, options)
    except (TypeError, ValueError) as err:
        raise MaskFileError(header.path, "x_method_options", str(err)) from None
    # the method's ratios are float64 arithmetic: a hair of slack before counts are floored
    return max(0.0, lo - 1e-9), min(1.0, hi + 1e-9), header.payload == PAYLOAD


def ceil_pruned(shape: tuple[int, int], sparsity: float, group: str) -> int:
    """Like :func:`fedlib.groups.expected_pruned`, each group rounding ``s·d`` up (Eq. 7)."""
    rows, cols = shape
    if group not in GROUPS:
        return expected_pruned(shape, sparsity, group)  # N of every M: no rounding
    groups, size = {"layer": (1, rows * cols), "row": (rows, cols), "column": (cols, rows)}[group]
    return groups * min(size, math.ceil(size * sparsity - 1e-9))


def _rounding_slack(header: MaskHeader) -> float:
    # row/column groups floor per row/column: at most one weight per group below target
    return max(1.0 / min(layer["shape"]) for layer in header.layers)



class MaskFile:
    """An open, header-checked mask file; layers are read and checked one at a time so the
    server's memory does not grow with the number of clients.

    ``reference`` (a :class:`fedlib.maskcode.MagnitudeReference` of the model the file claims)
    decodes a version 2 file; it must compute the digest the file records."""

    def __init__(self, path: Path, expected_fingerprint: str | None = None,
                 expected_layers: Sequence[LayerInfo] | None = None, whole_model: bool = True,
                 reference=None):
        self.header = read_header(path, expected_fingerprint, expected_layers, whole_model)
        self.path = Path(path)
        self._shapes = {layer["name"]: layer for layer in self.header.layers}
        self.reference = reference
        if self.header.format_version == 2:
            self._check_reference()

    def _check_reference(self) -> None:
        header = self.header
        if self.reference is None:
            raise MaskFileError(self.path, "format_version", "a version 2 file is coded against the public model's "
                                                             "weights; this reader was given no reference to decode it")
        if header.reference != self.reference.name:
            raise MaskFileError(self.path, "reference", f"{header.reference!r}; the server computes "
                                                        f"{self.reference.name!r}")
        digest = self.reference.digest([layer["name"] for layer in header.layers], header.group)
        if header.reference_sha256 != digest:
            raise MaskFileError(self.path, "reference_sha256",
                                f"{header.reference_sha256[:16]}... but the server's model gives {digest[:16]}...: the "
                                "file was coded against other weights (another checkpoint, or a client that computed "
                                "in another dtype)")

    def _tensor(self, key: str) -> torch.Tensor:
        """A tensor's bytes where the checked header put them (a file changed since is caught
        by its length here and by the checks on the values)."""
        dtype, shape, offset = self.header.tensors[key]
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        buffer = read_at(self.path, offset, nbytes)
        if len(buffer) != nbytes:
            raise MaskFileError(self.path, key, f"{len(buffer)} of its {nbytes} bytes: the file changed since its "
                                                "header was read")
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape)

    def layer_mask(self, name: str, device: torch.device | None = None) -> torch.Tensor:
        """The layer's mask, checked; unpacked on ``device`` (default: the host) where the file
        holds packed bits, so that a GPU evaluation moves and checks one eighth of it."""
        layer = self._shapes[name]
        shape = layer["shape"]
        packed = self._tensor(f"mask:{name}")  # uint8, (numel + 7) // 8 bytes (v1): the header says so
        if self.header.format_version == 2:
            from fedlib.maskcode import decode_layer

            try:
                mask = decode_layer(packed, self.reference.buckets(name, self.header.group), self.header.group)
            except ValueError as err:
                raise MaskFileError(self.path, f"mask:{name}", str(err)) from None
            mask = mask.to(device) if device is not None else mask
        else:
            spare = packed.numel() * 8 - math.prod(shape)
            if spare and int(packed[-1]) >> (8 - spare):
                raise MaskFileError(self.path, f"mask:{name}", "padding bits are not zero")
            mask = unpack_bits(packed, shape, device)
        pruned = count_true(mask)
        if pruned != layer["pruned"]:
            raise MaskFileError(
                self.path, f"mask:{name}",
                f"has {pruned} pruned weights but the header claims {layer['pruned']}",
            )
        self._check_groups(name, mask)
        return mask

    def _check_groups(self, name: str, mask: torch.Tensor) -> None:
        """The comparison group's claim, group by group: a uniform mask prunes
        :func:`fedlib.groups.pruned_count` of every row (column); N:M prunes N of every M; a
        client's per-layer ratio is one ratio for the whole layer, so every row (column) of a
        nonuniform client layer prunes the same count."""
        header = self.header
        group, rows = header.group, mask.shape[0]
        if group not in GROUPS:
            n, m = parse_nm(group)
            counts, want, what = count_true(mask.reshape(rows, -1, m), -1).reshape(-1), n, f"{group} prunes {n} of every {m}"
        elif group == "layer" or (header.allocation == "nonuniform" and header.role != "client"):
            return  # one group, or the server's own per-group expansion (FedSpaLLM)
        else:
            counts = count_true(mask, 1 if group == "row" else 0)
            if header.allocation == "uniform":
                want = pruned_count(mask.shape[1] if group == "row" else rows, header.sparsity)
                what = f"a uniform {header.sparsity} mask prunes {want} in every {group}"
            else:
                want = int(counts[0])
                what = f"one ratio per layer prunes the same count ({want}) in every {group}"
        odd = (counts != want).nonzero()
        if len(odd):
            index = int(odd[0, 0])
            raise MaskFileError(self.path, f"mask:{name}", f"{group} group {index} prunes {int(counts[index])} "
                                                           f"weights; {what}")

    def layer_votes(self, name: str, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's vote counts, checked: 0..n_clients, and ``mask`` (read when not given)
        prunes the most-voted weights of every group, as both servers select them (FedPrLLM's
        top-k, FedSpaLLM's expansion; a defence records a monotone map of the counts it saw)."""
        key = f"votes:{name}"
        votes = self._tensor(key)  # votes_dtype(n_clients), the layer's shape: the header says so
        votes = votes if mask is None else votes.to(mask.device)  # checked where the mask is
        if int(votes.min()) < 0 or int(votes.max()) > self.header.n_clients:
            raise MaskFileError(self.path, key, f"vote counts outside 0..{self.header.n_clients}")
        mask = self.layer_mask(name) if mask is None else mask
        group = self.header.group
        if group in GROUPS:
            by_group = {"layer": lambda t: t.reshape(1, -1), "row": lambda t: t, "column": lambda t: t.T}[group]
        else:
            by_group = lambda t: t.reshape(-1, parse_nm(group)[1])  # noqa: E731
        v, m = by_group(votes), by_group(mask)
        # in the stored dtype (a 7B layer's counts are 90 MB as int16): n_clients fits it
        fewest_pruned = torch.where(m, v, torch.iinfo(v.dtype).max).amin(1)
        most_kept = torch.where(m, 0, v).amax(1)
        odd = (fewest_pruned < most_kept).nonzero()
        if len(odd):
            index = int(odd[0, 0])
            raise MaskFileError(self.path, key, f"{group} group {index}: a pruned weight has "
                                                f"{int(fewest_pruned[index])} votes, a kept one {int(most_kept[index])}; "
                                                "a global mask prunes the most-voted weights")
        return votes.to(torch.int32)

    def has_votes(self) -> bool:
        return self.header.votes

    def masks(self) -> dict[str, torch.Tensor]:
        return {layer["name"]: self.layer_mask(layer["name"]) for layer in self.header.layers}
