"""A client's local pruning: a method (a :class:`~fedlib.methods.LayerPruner` subclass) run block
by block on a :class:`~fedlib.runner.BlockRunner`.

The runner carries activations and knows nothing of methods; methods turn one layer's statistics
into a mask and may plug into the loop at the points :class:`~fedlib.methods.LayerPruner`
declares (``plan`` before the pass, ``allocate_block`` per block). This module joins the two:
:func:`prune_locally` is the one-shot FedPrLLM client, the Centralized and Local-only baselines
and the privacy audit's clients; :mod:`fedlib.federation` uses the same pieces (``decide_block``,
``plan_sparsity``, ``block_sparsity``) for the iterative and FedSpaLLM clients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from fedlib.methods import LayerPruner, get_method
from fedlib.models import ModelHandle
from fedlib.runner import CPU, BlockDecision, BlockRunner, BlockStep, Placement


def resolve_method(method: str | type[LayerPruner]) -> type[LayerPruner]:
    """A registered method name or the method class itself."""
    return get_method(method) if isinstance(method, str) else method


def decide_block(
    pruners: Mapping[str, LayerPruner],
    sparsity: float | Mapping[str, float],
    group: str,
    seed: int,
    *,
    upload_weights: bool = False,
) -> BlockDecision:
    """Each pruner's mask at its ratio (and its updated weights, for methods with an update),
    on the compute device: what leaves the device is the caller's choice (a mask file packs the
    bits there first). ``upload_weights``: every layer gets a weight in the decision, the
    masked current weights (float32) for methods without an update (FedSpaLLM uploads weights
    for every layer)."""
    decision = BlockDecision(masks={})
    for name, pruner in pruners.items():
        ratio = sparsity[name] if isinstance(sparsity, Mapping) else sparsity
        decision.masks[name] = pruner.prune(ratio, group, seed)
        decision.layer_sparsity[name] = float(ratio)
        if pruner.updated_weight is not None:
            decision.weights[name] = pruner.updated_weight
        elif upload_weights:
            current = pruner.layer.weight.detach().to(torch.float32)
            decision.weights[name] = current.masked_fill(decision.masks[name], 0.0)
    return decision


def plan_sparsity(method: type[LayerPruner], handle: ModelHandle, input_ids: torch.Tensor | None,
                  sparsity: float | Mapping[str, float], group: str, options: Mapping,
                  batch_size: int = 8, placement: Placement = CPU) -> float | Mapping[str, float]:
    """The method's per-layer ratios from its planning pass (:meth:`LayerPruner.plan`, OWL's
    dense pre-pass); an explicit per-layer mapping is always used as given. Call once per
    client, before its pruning pass."""
    if isinstance(sparsity, Mapping):
        return sparsity
    return method.plan(handle, input_ids, sparsity, group=group, options=options, batch_size=batch_size,
                       placement=placement)


def block_sparsity(method: type[LayerPruner], step: BlockStep, client: int, pruners: Mapping[str, LayerPruner],
                   sparsity: float | Mapping[str, float], group: str, seed: int,
                   options: Mapping) -> float | Mapping[str, float]:
    """The ratios to prune the step's block at for ``client``, after :meth:`BlockStep.collect`
    (:meth:`LayerPruner.allocate_block`, BESA's learned allocation); an explicit per-layer
    mapping is always used as given."""
    if isinstance(sparsity, Mapping):
        return sparsity
    return method.allocate_block(step, client, pruners, sparsity, group, seed, options)


def prune_locally(
    model: nn.Module | ModelHandle,
    input_ids: torch.Tensor | None,
    method: str | type[LayerPruner],
    sparsity: float | Mapping[str, float],
    group: str,
    seed: int,
    batch_size: int = 8,
    method_options: Mapping | None = None,
    on_block: Callable[[int, BlockDecision], None] | None = None,
    *,
    placement: Placement = CPU,
    blocks: int | None = None,
    keep: bool = True,
) -> BlockDecision:
    """One client's local pruning, block by block (one-shot FedPrLLM client, Centralized and
    Local-only baselines, the privacy audit's clients). Block l+1's statistics come from
    activations through block l pruned by this client's own masks.

    ``blocks``: only blocks ``0..blocks-1`` (the forward stops there). ``on_block(index,
    decision)`` sees each block's decision as it is made; with ``keep=False`` nothing else is
    kept (a 7B client streams its masks to the mask file instead of holding them). Returns the
    masks (and updated weights) of the pruned linears, on the host; the model itself is left
    unchanged."""
    handle = ModelHandle.of(model)
    factory = resolve_method(method)
    options = dict(method_options or {})
    result = BlockDecision(masks={})
    if factory.needs_calibration:
        if input_ids is None:
            raise ValueError(f"method {factory.name!r} needs calibration data")
        sparsity = plan_sparsity(factory, handle, input_ids, sparsity, group, options, batch_size, placement)
        runner = BlockRunner(handle, [input_ids], placement, batch_size)
    else:  # data-free: no activations, blocks only
        runner = BlockRunner(handle, [], placement, batch_size)
    for step in runner.steps(blocks):
        pruners = {name: factory(linear, name, **options) for name, linear in step.linears.items()}
        ratios = sparsity
        if runner.n_clients:
            step.collect(0, pruners)
            ratios = block_sparsity(factory, step, 0, pruners, sparsity, group, seed, options)
        decision = decide_block(pruners, ratios, group, seed)
        del pruners
        if runner.n_clients:
            step.propagate(0, decision)
        if keep:
            result.masks.update({name: mask.cpu() for name, mask in decision.masks.items()})
            result.weights.update({name: weight.cpu() for name, weight in decision.weights.items()})
            result.layer_sparsity.update(decision.layer_sparsity)
        if on_block is not None:
            on_block(step.index, decision)
    return result
