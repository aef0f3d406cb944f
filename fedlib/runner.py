"""The one loop that carries data through a model block by block, and the only place where
fedlib decides what lives on which device.

A :class:`BlockRunner` walks the decoder blocks in order. For each block it makes the block
*resident* (its weights on the compute device, in the compute dtype: read from the checkpoint
for a lazy :class:`~fedlib.models.ModelHandle`, copied from the host otherwise, or used as is
when they already are where they must be), hands the caller a :class:`BlockStep`, and drops the
device copy when the caller is done. Peak device memory is one block plus one batch of
activations (plus all activations, when they fit and ``activations="device"``).

What the caller does with a step is the method: collect statistics of each linear's inputs
(:meth:`BlockStep.collect`), decide masks, maybe let a server decide between clients, and
propagate each client's activations through the block pruned the way it should see it
(:meth:`BlockStep.propagate`: its own masks in one-shot, the global masks in iterative
FedPrLLM, its pruned weights or the dense weights in FedSpaLLM). One runner carries any number
of clients, so a block is made resident once per round for all of them. Everything that
prunes is built on it: :func:`fedlib.client.prune_locally` (one-shot clients, Centralized,
Local-only, the privacy audit's clients), :mod:`fedlib.federation` (iterative FedPrLLM, FedSpaLLM
clients), OWL's dense planning pass, BESA's allocation, and perplexity
(:func:`fedlib.evaluate.perplexity`). The runner knows nothing of pruning methods: they build on
it, not the other way round.

Block inputs and the keyword arguments each block receives (attention mask, rotary
``position_embeddings``, ...) are captured from the model's own forward on the host, so blocks
run one by one get exactly what they get inside the model (a test checks this against the full
forward); they go to the device with their block.

Precision: weights and activations are in :attr:`Placement.dtype`; the statistics that decide
masks are accumulated by the methods in float32/float64 whatever that dtype is, and masks are
selected on the host (:func:`fedlib.groups.prune_lowest`), so the same statistics give the same
mask on every device.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedlib import progress
from fedlib.models import ModelHandle, block_linears, owner_and_leaf, parse_dtype

if TYPE_CHECKING:
    from fedlib.methods.base import LayerPruner

# --------------------------------------------------------------------------- placement

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


@dataclass(frozen=True)
class Placement:
    """Where a model computes: a device and the dtype of its weights and activations."""

    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    @classmethod
    def resolve(cls, device: str = "auto", dtype: str | torch.dtype = "float32") -> "Placement":
        """``device``: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
        dtype = parse_dtype(dtype)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise ValueError(f"device must be {DEVICE_CHOICES}, got {device!r}") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(
                    f"device {device!r}: CUDA is not available here (torch {torch.__version__}); "
                    "use --device cpu, or auto to take CUDA only where it exists")
            index = torch.cuda.current_device() if dev.index is None else dev.index
            if index >= torch.cuda.device_count():
                raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
            dev = torch.device("cuda", index)
        elif dev.type != "cpu":
            raise ValueError(f"device must be {DEVICE_CHOICES}, got {device!r}")
        return cls(dev, dtype)

    @property
    def label(self) -> str:
        return f"{self.device}/{str(self.dtype).removeprefix('torch.')}"

    def move(self, value, non_blocking: bool = False):
        """``value`` (a tensor, or tuples / lists / dicts of them) on the device; floating
        tensors in the compute dtype, others keep theirs. Device objects are always passed as
        ``torch.device`` (a string would make torch initialise CUDA even under a fake mode).
        ``non_blocking``: a copy from pinned host memory does not wait for the device (only
        for host tensors that stay untouched until the device has read them)."""
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                return value.to(device=self.device, dtype=self.dtype, non_blocking=non_blocking)
            return value.to(device=self.device, non_blocking=non_blocking)
        if isinstance(value, tuple):
            return tuple(self.move(v, non_blocking) for v in value)
        if isinstance(value, list):
            return [self.move(v, non_blocking) for v in value]
        if isinstance(value, dict):
            return {k: self.move(v, non_blocking) for k, v in value.items()}
        return value

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` already is where (and as) this placement wants it."""
        return tensor.device == self.device and (not tensor.is_floating_point() or tensor.dtype == self.dtype)


CPU = Placement()


# --------------------------------------------------------------------------- residency


class BlockReader:
    """Block tensors read from a lazy handle's checkpoint one block ahead, on a background
    thread, while the current block computes (the read is disk time the device would otherwise
    idle through). For a CUDA placement they are read into pinned host memory, so that their
    copy to the device does not hold the host thread. Blocks held in memory are not read."""

    def __init__(self, handle: ModelHandle, placement: Placement, indices: Sequence[int]):
        self.handle, self.indices = handle, [i for i in indices if handle.is_lazy(i)]
        self.pinned = placement.device.type == "cuda" and torch.cuda.is_available()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedlib-block-reader") \
            if self.indices else None
        self.pending: dict[int, Future] = {}
        self._ahead(0)

    def _ahead(self, position: int) -> None:
        for index in self.indices[position : position + 1]:
            if index not in self.pending:
                self.pending[index] = self.pool.submit(self.handle.block_tensors, index, pinned=self.pinned)

    def tensors(self, index: int) -> dict[str, torch.Tensor] | None:
        """Block ``index``'s tensors when this reader reads that block (and the read of the
        next one started), else None."""
        if index not in self.indices:
            return None
        self._ahead(self.indices.index(index))
        tensors = self.pending.pop(index).result()
        self._ahead(self.indices.index(index) + 1)
        return tensors

    def close(self) -> None:
        if self.pool is not None:
            for future in self.pending.values():
                future.cancel()
            self.pool.shutdown(wait=True)


@contextlib.contextmanager
def resident_block(handle: ModelHandle, index: int, placement: Placement,
                   tensors: Mapping[str, torch.Tensor] | None = None) -> Iterator[nn.Module]:
    """Block ``index`` with its weights on ``placement`` for the duration of the context; the
    block object is the model's own (hooks and names work), its parameters are swapped for the
    device copies and back. Nothing is copied when the weights already are in place.
    ``tensors``: the block's tensors when already read (:class:`BlockReader`)."""
    block = handle.block(index)
    if not handle.is_lazy(index) and all(placement.holds(p) for p in block.parameters()) \
            and all(b.device == placement.device for b in block.buffers()):
        yield block
        return
    saved: list[tuple[nn.Module, str, str, torch.Tensor]] = []
    try:
        for name, tensor in (tensors if tensors is not None else handle.block_tensors(index)).items():
            module, leaf = owner_and_leaf(block, name)
            saved.append((module, "_parameters", leaf, module._parameters[leaf]))
            module._parameters[leaf] = nn.Parameter(placement.move(tensor, non_blocking=True), requires_grad=False)
        for name, buffer in list(block.named_buffers()):
            module, leaf = owner_and_leaf(block, name)
            saved.append((module, "_buffers", leaf, buffer))
            module._buffers[leaf] = buffer.to(device=placement.device)
        yield block
    finally:
        for module, kind, leaf, original in reversed(saved):
            getattr(module, kind)[leaf] = original


def _move_outside_blocks(handle: ModelHandle, placement: Placement) -> list:
    """Put the model's non-block parameters and buffers on ``placement``; returns what to put
    back. A tensor shared by several modules (a tied LM head) is moved once and stays shared."""
    model = handle.model
    prefix = handle.prefix + "."
    moved: dict[int, torch.Tensor] = {}
    saved = []
    for kind, items in (("_parameters", model.named_parameters(remove_duplicate=False)),
                        ("_buffers", model.named_buffers(remove_duplicate=False))):
        for name, tensor in list(items):
            if name.startswith(prefix) or tensor.is_meta or placement.holds(tensor):
                continue
            if id(tensor) not in moved:
                if kind == "_parameters":
                    moved[id(tensor)] = nn.Parameter(placement.move(tensor.detach()), requires_grad=False)
                else:  # buffers keep their dtype (rotary tables are float32 on purpose)
                    moved[id(tensor)] = tensor.to(device=placement.device)
            module, leaf = owner_and_leaf(model, name)
            saved.append((module, kind, leaf, tensor))
            getattr(module, kind)[leaf] = moved[id(tensor)]
    return saved


@contextlib.contextmanager
def resident_outside_blocks(handle: ModelHandle, placement: Placement) -> Iterator[nn.Module]:
    """The model's non-block modules (embeddings, final norm, LM head) on ``placement`` for
    the duration of the context."""
    saved = _move_outside_blocks(handle, placement)
    try:
        yield handle.model
    finally:
        for module, kind, leaf, original in reversed(saved):
            getattr(module, kind)[leaf] = original


def _replaced_weight(current: torch.Tensor, weight=None, mask=None, factor=None) -> torch.Tensor | None:
    """``current`` replaced by ``weight``, masked entries zeroed, multiplied by ``factor``
    (each on ``current``'s device and dtype); None when nothing changes."""
    new = None
    if weight is not None:
        new = weight.to(device=current.device, dtype=current.dtype).clone()
    if mask is not None or factor is not None:
        new = current.detach().clone() if new is None else new
        if mask is not None:
            new.masked_fill_(mask.to(device=current.device), 0)
        if factor is not None:
            new.mul_(factor.to(device=current.device, dtype=current.dtype))
    return new


@contextlib.contextmanager
def weights_replaced(
    linears: Mapping[str, nn.Linear],
    masks: Mapping[str, torch.Tensor] | None = None,
    weights: Mapping[str, torch.Tensor] | None = None,
    factors: Mapping[str, torch.Tensor] | None = None,
) -> Iterator[None]:
    """Temporarily give linears new weights, zero their masked entries and/or multiply them by
    per-weight factors (FedPrLLM's weight scaling). Replacements are moved to each linear's
    device and dtype; the linears get their own weights back afterwards, so several clients
    (and the server) can share one resident block."""
    saved = {}
    try:
        for name, linear in linears.items():
            new = _replaced_weight(
                linear.weight,
                weights.get(name) if weights is not None else None,
                masks.get(name) if masks is not None else None,
                factors.get(name) if factors is not None else None,
            )
            if new is not None:
                saved[name] = linear.weight
                linear._parameters["weight"] = nn.Parameter(new, requires_grad=False)
        yield
    finally:
        for name, original in saved.items():
            linears[name]._parameters["weight"] = original


@torch.no_grad()
def place_model(handle: ModelHandle, placement: Placement = None,
                variant: Callable[[int], "BlockDecision | None"] | None = None) -> nn.Module:
    """The whole model on ``placement`` with ``variant(block)`` applied to each block: for code
    that needs an ordinary module (lm-eval, the inversion attack). Blocks go to the device one
    at a time, read straight from the checkpoint when lazy, so the host never holds the whole
    model. The handle's model becomes that module (the handle is used up)."""
    placement = placement or CPU
    for index in range(handle.n_blocks):
        block = handle.block(index)
        decision = variant(index) if variant is not None else None
        linears = {f"{handle.prefix}.{index}.{local}": lin for local, lin in block_linears(block).items()}
        for name, tensor in handle.block_tensors(index).items():
            module, leaf = owner_and_leaf(block, name)
            module._parameters[leaf] = nn.Parameter(placement.move(tensor), requires_grad=False)
        for name, buffer in list(block.named_buffers()):
            module, leaf = owner_and_leaf(block, name)
            module._buffers[leaf] = buffer.to(device=placement.device)
        if decision is not None:
            for name, linear in linears.items():
                new = _replaced_weight(linear.weight, decision.weights.get(name), decision.masks.get(name),
                                       decision.factors.get(name))
                if new is not None:
                    linear._parameters["weight"] = nn.Parameter(new, requires_grad=False)
    _move_outside_blocks(handle, placement)
    handle.loaded_all()
    return handle.model


# --------------------------------------------------------------------------- capture


class _StopForward(Exception):
    pass


class _Recorder(nn.Module):
    """Stands in for a decoder block: records what the block would receive, passes through."""

    def __init__(self, index: int, sink: dict, stop_at: int):
        super().__init__()
        self.index, self.sink, self.stop_at = index, sink, stop_at

    def forward(self, hidden_states, *args, **kwargs):
        if args:
            raise RuntimeError("decoder block called with positional extras; cannot capture")
        self.sink[self.index] = (hidden_states, kwargs)
        if self.index == self.stop_at:
            raise _StopForward
        return hidden_states


class _Replay(nn.Module):
    """Stands in for the first decoder block and returns given hidden states (the last
    block's outputs), so the model's own code computes the final norm, head and softcapping."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden

    def forward(self, hidden_states, *args, **kwargs):
        return self.hidden


class _Pass(nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


@contextlib.contextmanager
def _blocks_replaced(handle: ModelHandle, make: Callable[[int], nn.Module]) -> Iterator[None]:
    blocks = handle.model.get_submodule(handle.prefix)
    originals = list(blocks)
    for i in range(len(blocks)):
        blocks[i] = make(i)
    try:
        yield
    finally:
        for i, block in enumerate(originals):
            blocks[i] = block


def _clean_kwargs(kwargs: dict) -> dict:
    kwargs = {k: v for k, v in kwargs.items() if k not in ("past_key_values", "past_key_value")}
    kwargs["use_cache"] = False
    return kwargs


@torch.no_grad()
def capture_block_kwargs(handle: ModelHandle, seqlen: int) -> list[dict]:
    """The keyword arguments each block receives for a batch of one ``seqlen`` sequence (on
    the host). Their batch dimension is 1 and broadcasts over larger batches (causal masks,
    rotary tables); models whose blocks get different arguments (Gemma's sliding and global
    attention) get theirs per block."""
    sink: dict = {}
    n = handle.n_blocks
    dummy = torch.zeros(1, seqlen, dtype=torch.long)
    with _blocks_replaced(handle, lambda i: _Recorder(i, sink, n - 1)):
        try:
            handle.model(input_ids=dummy, use_cache=False)
        except _StopForward:
            pass
    return [_clean_kwargs(sink[i][1]) for i in range(n)]


@torch.no_grad()
def embed_inputs(handle: ModelHandle, input_ids: torch.Tensor) -> torch.Tensor:
    """The hidden states entering block 0 (embedding plus any model-specific scaling), on
    the host."""
    sink: dict = {}
    with _blocks_replaced(handle, lambda i: _Recorder(i, sink, 0)):
        try:
            handle.model(input_ids=input_ids, use_cache=False)
        except _StopForward:
            pass
    return sink[0][0]


def run_block(block: nn.Module, hidden: torch.Tensor, kwargs: dict) -> torch.Tensor:
    out = block(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


# --------------------------------------------------------------------------- the runner


@dataclass
class BlockDecision:
    """What is applied to a block's linears when activations pass through it: masks (True =
    pruned), replacement weights (a weight update, FedSpaLLM's global weights), per-weight
    factors (FedPrLLM's weight scaling); and the sparsity each layer was pruned at."""

    masks: dict[str, torch.Tensor]
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the sparsity each layer was pruned at (differs per layer for OWL and BESA)
    layer_sparsity: dict[str, float] = field(default_factory=dict)
    factors: dict[str, torch.Tensor] = field(default_factory=dict)


class _DeviceBatches(Sequence):
    """One client's activation batches as the block sees them: each moved to the device
    when accessed (a no-op when they are stored there)."""

    def __init__(self, batches: list[torch.Tensor], placement: Placement):
        self.batches, self.placement = batches, placement

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i):
        return self.placement.move(self.batches[i])


class BlockStep:
    """One resident block and the clients' activations entering it."""

    def __init__(self, runner: "BlockRunner", index: int, block: nn.Module, kwargs: dict, last: bool):
        self.runner, self.index, self.block, self.kwargs, self.last = runner, index, block, kwargs, last
        self.prefix = f"{runner.handle.prefix}.{index}"
        #: full module name -> linear of this block
        self.linears = {f"{self.prefix}.{local}": lin for local, lin in block_linears(block).items()}

    def _check(self, client: int) -> None:
        at = self.runner.position[client]
        if at != self.index:
            raise RuntimeError(f"client {client}'s activations are at block {at}, not {self.index}")

    def inputs(self, client: int) -> Sequence[torch.Tensor]:
        """The client's activation batches entering this block, on the device."""
        self._check(client)
        return _DeviceBatches(self.runner.states[client], self.runner.placement)

    @torch.no_grad()
    def collect(self, client: int, pruners: Mapping[str, LayerPruner]) -> None:
        """Dense forward of the client's batches through the block (as it is now), feeding
        each linear's input to its pruner's ``add_batch``. A linear that receives the very same
        input tensor as an earlier one (q/k/v, gate/up) shares that one's statistics when its
        pruner allows it (:meth:`~fedlib.methods.base.LayerPruner.adopt_statistics`); the offer
        is made in every call, so pruners collected twice stay shared and fed once."""
        fed = dict(pruners)  # the pruners the hooks feed
        first_batch: list[tuple[str, weakref.ref]] | None = []  # weak: a freed tensor's id is reused

        def feed(name: str, x: torch.Tensor) -> None:
            if first_batch is not None:
                leader = next((n for n, ref in first_batch if ref() is x and n in fed), None)
                first_batch.append((name, weakref.ref(x)))
                if leader is not None and pruners[name].adopt_statistics(pruners[leader]):
                    del fed[name]
            if name in fed:
                fed[name].add_batch(x)

        handles = [
            self.linears[name].register_forward_hook(lambda _m, inp, _out, n=name: feed(n, inp[0]))
            for name in pruners
        ]
        try:
            for hidden in self.inputs(client):
                run_block(self.block, hidden, self.kwargs)
                first_batch = None
        finally:
            for handle in handles:
                handle.remove()

    def weights_replaced(self, decision: BlockDecision | None = None, *, masks=None, weights=None, factors=None):
        if decision is not None:
            masks, weights, factors = decision.masks, decision.weights, decision.factors
        return weights_replaced(self.linears, masks, weights, factors)

    @torch.no_grad()
    def propagate(self, client: int, decision: BlockDecision | None = None) -> None:
        """The client's activations through this block with ``decision`` applied (None =
        the block as it is); they then enter the next block. After the run's last block this
        only moves the client on, unless the runner keeps final outputs."""
        self._check(client)
        runner = self.runner
        if not self.last or runner.final_outputs:
            with self.weights_replaced(decision):
                runner.states[client] = [
                    runner.store(run_block(self.block, hidden, self.kwargs)) for hidden in self.inputs(client)
                ]
        runner.position[client] += 1


class BlockRunner:
    """Activations of one or more clients (``inputs``: one ``(n, seqlen)`` token tensor each,
    cut into batches of ``batch_size``) and the walk over the blocks (:meth:`steps`).

    ``activations``: where the batches wait between blocks: ``"device"``, ``"host"`` or
    ``"auto"`` (the device when they all fit in a quarter of its free memory, else the host;
    on a CPU the two are the same). ``final_outputs``: keep the last block's outputs
    (perplexity); by default the last block is only used for statistics.
    """

    def __init__(self, model: nn.Module | ModelHandle, inputs: Sequence[torch.Tensor],
                 placement: Placement = CPU, batch_size: int = 8, *, activations: str = "auto",
                 final_outputs: bool = False):
        self.handle = ModelHandle.of(model)
        self.placement = placement
        self.final_outputs = final_outputs
        self.n_blocks = self.handle.n_blocks
        for ids in inputs:
            if ids.dim() != 2:
                raise ValueError(f"input_ids must be (n, seqlen), got {tuple(ids.shape)}")
        lengths = {int(ids.shape[1]) for ids in inputs}
        if len(lengths) > 1:
            raise ValueError(f"all clients' samples must have one length, got {sorted(lengths)}")
        self.storage = self._storage(activations, inputs)
        self.host_kwargs = capture_block_kwargs(self.handle, lengths.pop()) if lengths else []
        self.states = [
            [self.store(embed_inputs(self.handle, chunk.long())) for chunk in ids.split(batch_size, dim=0)]
            for ids in inputs
        ]
        self.position = [0] * len(inputs)

    def _storage(self, activations: str, inputs: Sequence[torch.Tensor]) -> torch.device:
        if activations not in ("auto", "device", "host"):
            raise ValueError(f"activations must be auto, device or host, got {activations!r}")
        device = self.placement.device
        if activations == "host" or device.type == "cpu":
            return torch.device("cpu")
        if activations == "device":
            return device
        hidden = self.handle.model.config.hidden_size
        size = torch.empty((), dtype=self.placement.dtype).element_size()
        needed = sum(ids.numel() for ids in inputs) * hidden * size
        free, _ = torch.cuda.mem_get_info(device)
        return device if 2 * needed <= free // 4 else torch.device("cpu")

    def store(self, hidden: torch.Tensor) -> torch.Tensor:
        """Activations where they wait between blocks (the compute dtype)."""
        if hidden.is_floating_point():
            return hidden.to(device=self.storage, dtype=self.placement.dtype)
        return hidden.to(device=self.storage)

    @property
    def n_clients(self) -> int:
        return len(self.states)

    def steps(self, limit: int | None = None) -> Iterator[BlockStep]:
        """Blocks ``0..limit-1`` (all by default), each resident while its step is in use; the
        next block is read from the checkpoint meanwhile (:class:`BlockReader`), and each block
        done is reported to the active :func:`fedlib.progress.reporting` (if any)."""
        stop = self.n_blocks if limit is None else min(limit, self.n_blocks)
        reader = BlockReader(self.handle, self.placement, range(stop))
        try:
            for index in progress.track(range(stop), "block"):
                with resident_block(self.handle, index, self.placement, reader.tensors(index)) as block:
                    kwargs = self.placement.move(self.host_kwargs[index]) if self.host_kwargs else {}
                    yield BlockStep(self, index, block, kwargs, last=index == stop - 1)
        finally:
            reader.close()

    @torch.no_grad()
    def logits(self, client: int) -> Iterator[torch.Tensor]:
        """After the last block (``final_outputs``): the model's logits for each of the
        client's batches, computed by the model's own final norm / head code on the device."""
        if self.position[client] != self.n_blocks:
            raise RuntimeError(f"client {client} is at block {self.position[client]}, not past the last block")
        with resident_outside_blocks(self.handle, self.placement) as model:
            for hidden in _DeviceBatches(self.states[client], self.placement):
                ids = torch.zeros(hidden.shape[:2], dtype=torch.long).to(device=self.placement.device)
                with _blocks_replaced(self.handle, lambda i: _Replay(hidden) if i == 0 else _Pass()):
                    yield model(input_ids=ids, use_cache=False).logits
