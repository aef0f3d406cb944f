"""The layer-by-layer recursion every client-side method shares.

For each decoder block l: run the block densely over the client's calibration activations
with hooks that feed each linear's input to its method object (statistics pass), let the
methods decide masks, then run the block again with those masks applied (propagation pass):
its outputs are the inputs of block l+1. So block l+1 sees block l already pruned, as in
Wanda and SparseGPT. Iterative federated pruning uses the same runner but propagates through
the *global* mask the server sent back instead of the client's own.

Block inputs and the keyword arguments each block receives (attention mask, rotary
``position_embeddings``, ...) are captured from the model's own forward, so blocks run one by
one get exactly what they get inside the model; a test checks this against the full forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from fedlib.methods import LayerPruner, get_method
from fedlib.models import block_linears, block_path, decoder_blocks


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


@contextlib.contextmanager
def _blocks_replaced(model: nn.Module, sink: dict, stop_at: int) -> Iterator[None]:
    blocks = decoder_blocks(model)
    originals = list(blocks)
    for i in range(len(blocks)):
        blocks[i] = _Recorder(i, sink, stop_at)
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
def capture_block_kwargs(model: nn.Module, seqlen: int) -> list[dict]:
    """The keyword arguments each block receives for a batch of one ``seqlen`` sequence.

    Their batch dimension is 1 and broadcasts over larger batches (causal masks, rotary
    tables); models whose blocks get different arguments (Gemma's sliding and global
    attention) get theirs per block.
    """
    sink: dict = {}
    n_blocks = len(decoder_blocks(model))
    dummy = torch.zeros(1, seqlen, dtype=torch.long)
    with _blocks_replaced(model, sink, stop_at=n_blocks - 1):
        try:
            model(input_ids=dummy, use_cache=False)
        except _StopForward:
            pass
    return [_clean_kwargs(sink[i][1]) for i in range(n_blocks)]


@torch.no_grad()
def embed_inputs(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The hidden states entering block 0 (embedding plus any model-specific scaling)."""
    sink: dict = {}
    with _blocks_replaced(model, sink, stop_at=0):
        try:
            model(input_ids=input_ids, use_cache=False)
        except _StopForward:
            pass
    return sink[0][0]


def run_block(block: nn.Module, hidden: torch.Tensor, kwargs: dict) -> torch.Tensor:
    out = block(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


@contextlib.contextmanager
def weights_replaced(
    linears: Mapping[str, nn.Linear],
    masks: Mapping[str, torch.Tensor] | None = None,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> Iterator[None]:
    """Temporarily give linears new weights and/or zero their masked entries.

    The base model object stays unchanged afterwards, so several clients (and the server)
    can share one loaded model.
    """
    saved = {}
    try:
        for name, linear in linears.items():
            new = None
            if weights is not None and name in weights:
                new = weights[name].to(linear.weight.dtype).clone()
            if masks is not None and name in masks:
                new = (linear.weight.data if new is None else new).clone()
                new[masks[name].to(new.device)] = 0
            if new is not None:
                saved[name] = linear.weight.data
                linear.weight.data = new
        yield
    finally:
        for name, data in saved.items():
            linears[name].weight.data = data


@dataclass
class BlockDecision:
    """What a client decided for one block: masks (True = pruned) and, for methods with a
    weight update, the updated weights of the surviving entries."""

    masks: dict[str, torch.Tensor]
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the sparsity each layer was pruned at (differs per layer for OWL and BESA)
    layer_sparsity: dict[str, float] = field(default_factory=dict)


class LayerwiseRunner:
    """Carries one client's calibration activations through the decoder blocks, one block
    at a time: :meth:`collect` (statistics of block l), then :meth:`advance` (propagate
    through block l pruned by whichever masks the caller passes)."""

    def __init__(self, model: nn.Module, input_ids: torch.Tensor, batch_size: int = 8):
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (n, seqlen), got {tuple(input_ids.shape)}")
        self.model = model
        self.blocks = decoder_blocks(model)
        self.prefix = block_path(model)
        self.index = 0
        self.n_tokens = input_ids.numel()
        self.block_kwargs = capture_block_kwargs(model, input_ids.shape[1])
        self.hidden = [
            embed_inputs(model, chunk.long()) for chunk in input_ids.split(batch_size, dim=0)
        ]

    def linears(self, index: int | None = None) -> dict[str, nn.Linear]:
        """Full module name -> linear for block ``index`` (default: the current block)."""
        index = self.index if index is None else index
        return {
            f"{self.prefix}.{index}.{local}": linear
            for local, linear in block_linears(self.blocks[index]).items()
        }

    @torch.no_grad()
    def collect(self, pruners: Mapping[str, LayerPruner]) -> None:
        """Dense forward of the current block, feeding each linear's input to its pruner."""
        linears = self.linears()
        handles = [
            linears[name].register_forward_hook(
                lambda _mod, inp, _out, p=pruner: p.add_batch(inp[0])
            )
            for name, pruner in pruners.items()
        ]
        try:
            block, kwargs = self.blocks[self.index], self.block_kwargs[self.index]
            for hidden in self.hidden:
                run_block(block, hidden, kwargs)
        finally:
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def advance(self, decision: BlockDecision | None = None) -> None:
        """Propagate through the current block with ``decision`` applied; move to the next."""
        block, kwargs = self.blocks[self.index], self.block_kwargs[self.index]
        masks = decision.masks if decision else None
        weights = decision.weights if decision else None
        with weights_replaced(self.linears(), masks, weights):
            self.hidden = [run_block(block, hidden, kwargs) for hidden in self.hidden]
        self.index += 1


def decide_block(
    pruners: Mapping[str, LayerPruner],
    sparsity: float | Mapping[str, float],
    group: str,
    seed: int,
) -> BlockDecision:
    decision = BlockDecision(masks={})
    for name, pruner in pruners.items():
        ratio = sparsity[name] if isinstance(sparsity, Mapping) else sparsity
        decision.masks[name] = pruner.prune(ratio, group, seed)
        decision.layer_sparsity[name] = float(ratio)
        if pruner.updated_weight is not None:
            decision.weights[name] = pruner.updated_weight
    return decision


def plan_sparsity(
    factory: type[LayerPruner],
    model: nn.Module,
    input_ids: torch.Tensor | None,
    sparsity: float | Mapping[str, float],
    group: str,
    options: Mapping,
    batch_size: int = 8,
) -> float | Mapping[str, float]:
    """Per-layer ratios for methods that plan them before pruning (OWL's dense pre-pass, a
    ``plan`` classmethod); otherwise ``sparsity`` unchanged. An explicit per-layer mapping is
    always used as given. Call once per client, before its :class:`LayerwiseRunner`."""
    plan = getattr(factory, "plan", None)
    if plan is None or isinstance(sparsity, Mapping):
        return sparsity
    return plan(model, input_ids, sparsity, group=group, options=options, batch_size=batch_size)


def block_sparsity(
    factory: type[LayerPruner],
    runner: LayerwiseRunner,
    pruners: Mapping[str, LayerPruner],
    sparsity: float | Mapping[str, float],
    group: str,
    seed: int,
    options: Mapping,
) -> float | Mapping[str, float]:
    """The ratios to prune the runner's current block at, after :meth:`LayerwiseRunner.collect`:
    learned on the block's inputs for methods with an ``allocate_block`` classmethod (BESA),
    otherwise ``sparsity`` unchanged."""
    allocate = getattr(factory, "allocate_block", None)
    if allocate is None or isinstance(sparsity, Mapping):
        return sparsity
    return allocate(runner, pruners, sparsity, group, seed, options)


def prune_locally(
    model: nn.Module,
    input_ids: torch.Tensor | None,
    method: str,
    sparsity: float | Mapping[str, float],
    group: str,
    seed: int,
    batch_size: int = 8,
    method_options: Mapping | None = None,
    on_block: Callable[[int, BlockDecision], None] | None = None,
) -> BlockDecision:
    """One client's local pruning of every block, layer by layer (one-shot FedPrLLM client,
    Centralized and Local-only baselines). Returns masks (and updated weights) for all
    prunable linears; the model itself is left unchanged."""
    factory = get_method(method)
    options = dict(method_options or {})
    result = BlockDecision(masks={})
    if not factory.needs_calibration:
        # data-free: no forward passes needed at all
        for index, block in enumerate(decoder_blocks(model)):
            prefix = f"{block_path(model)}.{index}"
            pruners = {
                f"{prefix}.{local}": factory(linear, f"{prefix}.{local}", **options)
                for local, linear in block_linears(block).items()
            }
            decision = decide_block(pruners, sparsity, group, seed)
            _merge(result, decision, on_block, index)
        return result
    if input_ids is None:
        raise ValueError(f"method {method!r} needs calibration data")
    sparsity = plan_sparsity(factory, model, input_ids, sparsity, group, options, batch_size)
    runner = LayerwiseRunner(model, input_ids, batch_size)
    for index in range(len(runner.blocks)):
        pruners = {name: factory(linear, name, **options) for name, linear in runner.linears().items()}
        runner.collect(pruners)
        ratios = block_sparsity(factory, runner, pruners, sparsity, group, seed, options)
        decision = decide_block(pruners, ratios, group, seed)
        del pruners
        if index + 1 < len(runner.blocks):
            runner.advance(decision)
        else:
            runner.index += 1
        _merge(result, decision, on_block, index)
    return result


def _merge(result: BlockDecision, decision: BlockDecision, on_block, index: int) -> None:
    result.masks.update(decision.masks)
    result.weights.update(decision.weights)
    result.layer_sparsity.update(decision.layer_sparsity)
    if on_block is not None:
        on_block(index, decision)
