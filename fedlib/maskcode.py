"""Format version 2 of the mask file: each layer's mask entropy-coded against a public reference.

A client's mask is mostly predictable from the public model alone: a weight of small magnitude
is likely pruned by any method. The *reference* (:class:`MagnitudeReference`) ranks every weight
by ``|W|`` of the public checkpoint within its comparison group (row, column, layer or the M of
N:M; ties by position) and puts it in one of ``min(64, group size)`` equal rank buckets. The
coder then codes the mask with one probability per bucket (the layer's fraction of pruned
weights in that bucket, quantized to 16 bits) with ``constriction``'s ANS coder: a context
model, which beats XOR with a reference mask because a weight of the 3rd bucket is pruned far
more surely than one near the group's cut.

A layer's payload (``mask:<layer>``, ``uint8``, variable length) is the probability table
(``uint16`` little-endian, one per bucket, in 1..65535 of 65536) followed by the ANS words
(``uint32`` little-endian). The weights are coded bucket by bucket, each bucket's weights in
row-major order. Both ends compute the buckets from the same public weights, so the file
records the reference's name and a sha256 of its buckets (:meth:`MagnitudeReference.digest`);
a server whose model gives another digest refuses the file instead of decoding garbage.

Its size against version 1's bit packing is measured by ``benchmarks/bench_mask_compression.py``
(``benchmarks/results/mask_compression.json``, rendered in docs/reference/mask-format.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fedlib.groups import GROUPS, parse_nm

#: rank buckets per comparison group (fewer when the group is smaller)
MAX_BUCKETS = 64
#: probabilities are written as integers of 1..2**PROBABILITY_BITS - 1 over 2**PROBABILITY_BITS
PROBABILITY_BITS = 16
_ONE = 1 << PROBABILITY_BITS


def group_view(tensor: torch.Tensor, group: str) -> torch.Tensor:
    """``tensor`` (a layer's shape) as (groups, group size): one comparison group a row."""
    if group == "row":
        return tensor
    if group == "column":
        return tensor.T
    if group == "layer":
        return tensor.reshape(1, -1)
    return tensor.reshape(-1, parse_nm(group)[1])


def n_buckets(shape: Sequence[int], group: str) -> int:
    rows, cols = shape
    size = {"row": cols, "column": rows, "layer": rows * cols}[group] if group in GROUPS else parse_nm(group)[1]
    return min(MAX_BUCKETS, size)


def magnitude_buckets(weight: torch.Tensor, group: str) -> torch.Tensor:
    """Each weight's rank bucket (``uint8``, the weight's shape): its rank by ``|w|`` within
    its group, ascending, ties broken by position (a stable sort, so bit-identical anywhere),
    times the bucket count over the group size."""
    scores = group_view(weight.detach().to("cpu", torch.float32).abs(), group).contiguous()
    size = scores.shape[1]
    buckets = n_buckets(tuple(weight.shape), group)
    # a non-negative float's bits order like its value: (bits, position) is a unique int64 key, so
    # any sort gives the stable order (numpy's is ~3x faster than a stable torch.argsort)
    keys = (scores.view(torch.int32).to(torch.int64) << 32) | torch.arange(size)
    order = torch.from_numpy(np.argsort(keys.numpy(), axis=1))
    by_rank = (torch.arange(size) * buckets // size).to(torch.uint8).expand(scores.shape[0], size)
    out = torch.empty(scores.shape, dtype=torch.uint8).scatter_(1, order, by_rank)
    return out.T.contiguous() if group == "column" else out.reshape(weight.shape)


class MagnitudeReference:
    """The public model's rank buckets (module docstring), computed from ``weight_of(layer)``
    (the layer's stored weight). Buckets are kept up to ``cache_bytes`` (one byte a weight;
    a 135M model's fit), so the server's digest pass and its decoding sort each layer once;
    beyond, the last layer's are kept: a server decodes every client's copy of a layer before
    the next."""

    name = "magnitude"

    def __init__(self, weight_of: Callable[[str], torch.Tensor], cache_bytes: int = 1 << 30):
        self._weight_of = weight_of
        self._cache: dict[tuple[str, str], torch.Tensor] = {}
        self._cache_left = cache_bytes
        self._last: tuple[tuple[str, str], torch.Tensor] | None = None
        self._digests: dict[tuple[tuple[str, ...], str], str] = {}

    @classmethod
    def of_model(cls, handle) -> "MagnitudeReference":
        """From a :class:`fedlib.models.ModelHandle`: its checkpoint's stored weights when it has
        one (what a server without weights also reads), else the model's own parameters."""
        blocks = {info.name: info.block for info in handle.layers()}
        cache: dict[int, dict[str, torch.Tensor]] = {}

        def weight_of(name: str) -> torch.Tensor:
            if handle.checkpoint is not None:
                return handle.checkpoint.read(f"{name}.weight")
            block = blocks[name]
            if block not in cache:  # one block at a time
                cache.clear()
                cache[block] = handle.block_tensors(block)
            return cache[block][f"{name[len(handle.prefix) + len(str(block)) + 2:]}.weight"]

        return cls(weight_of)

    def buckets(self, layer: str, group: str) -> torch.Tensor:
        key = (layer, group)
        if key in self._cache:
            return self._cache[key]
        if self._last is None or self._last[0] != key:
            self._last = (key, magnitude_buckets(self._weight_of(layer), group))
            if self._last[1].numel() <= self._cache_left:
                self._cache[key] = self._last[1]
                self._cache_left -= self._last[1].numel()
        return self._last[1]

    def digest(self, layers: Sequence[str], group: str) -> str:
        """sha256 over the layers' buckets (what :func:`layer_digest` gives per layer)."""
        key = (tuple(layers), group)
        if key not in self._digests:
            self._digests[key] = combine_digests(
                [(name, layer_digest(name, group, self.buckets(name, group))) for name in layers])
        return self._digests[key]


def layer_digest(layer: str, group: str, buckets: torch.Tensor) -> bytes:
    return hashlib.sha256(f"{layer}\0{group}\0".encode() + buckets.numpy().tobytes()).digest()


def combine_digests(per_layer: Sequence[tuple[str, bytes]]) -> str:
    """The file's ``reference_sha256``: sha256 of the per-layer digests in the file's layer order."""
    return hashlib.sha256(b"".join(digest for _, digest in per_layer)).hexdigest()


def _probability_table(bits: np.ndarray, keys: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(weights per bucket, quantized probability of "pruned" per bucket)."""
    counts = np.bincount(keys, minlength=buckets)
    pruned = np.bincount(keys[bits], minlength=buckets)
    # every bucket is non-empty (buckets <= group size); never 0 or 1: both outcomes stay codable
    table = np.clip((pruned * _ONE + counts // 2) // counts, 1, _ONE - 1)
    return counts, table.astype("<u2")


def _models(table: np.ndarray):
    import constriction

    return [constriction.stream.model.Bernoulli(float(q) / _ONE, perfect=False) for q in table]


def encode_layer(mask: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
    """A layer's payload (module docstring): ``uint8``, 1-D."""
    import constriction

    bits = mask.detach().to("cpu", torch.bool).reshape(-1).numpy()
    keys = buckets.reshape(-1).numpy()
    n = int(keys.max()) + 1 if keys.size else 0
    counts, table = _probability_table(bits, keys, n)
    ordered = bits[np.argsort(keys, kind="stable")].astype(np.int32)
    ends = np.cumsum(counts)
    coder = constriction.stream.stack.AnsCoder()
    models = _models(table)
    for b in reversed(range(n)):  # a stack: the last bucket first, so the decoder reads bucket 0 first
        coder.encode_reverse(ordered[ends[b] - counts[b]:ends[b]], models[b])
    words = coder.get_compressed().astype("<u4")
    return torch.from_numpy(np.concatenate([table.view(np.uint8), words.view(np.uint8)]))


def decode_layer(payload: torch.Tensor, buckets: torch.Tensor, group: str) -> torch.Tensor:
    """The mask a payload codes (True = pruned), or ValueError: malformed, or not exactly the
    bytes :func:`encode_layer` writes for the decoded mask (one file, one encoding)."""
    import constriction

    shape = tuple(buckets.shape)
    n = n_buckets(shape, group)
    data = payload.numpy()
    if data.size < 2 * n or (data.size - 2 * n) % 4:
        raise ValueError(f"{data.size} bytes: expected a {n}-entry table of 2-byte probabilities, then 4-byte words")
    table = data[:2 * n].view("<u2")
    if int(table.min()) < 1:
        raise ValueError("a probability of 0 in the table: the writer never writes one")
    keys = buckets.reshape(-1).numpy()
    counts = np.bincount(keys, minlength=n)
    words = data[2 * n:].view("<u4").astype(np.uint32)
    try:
        coder = constriction.stream.stack.AnsCoder(words)
        decoded = [coder.decode(model, int(count)) for model, count in zip(_models(table), counts)]
    except ValueError as err:
        raise ValueError(f"not a valid ANS stream ({err})") from None
    if not coder.is_empty():
        raise ValueError("words left over after the layer's last weight")
    bits = np.empty(keys.size, dtype=bool)
    bits[np.argsort(keys, kind="stable")] = np.concatenate(decoded).astype(bool) if decoded else []
    mask = torch.from_numpy(bits).reshape(shape)
    if not np.array_equal(encode_layer(mask, buckets).numpy(), data):
        raise ValueError("not the coding fedlib writes for the bits it decodes to (probability table or words)")
    return mask
