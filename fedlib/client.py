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
from dataclasses import dataclass, field

import torch
from torch import nn

from fedlib.methods import LayerPruner, get_method
from fedlib.models import ModelHandle
from fedlib.runner import CPU, BlockDecision, BlockRunner, BlockStep, Placement


def resolve_method(method: str | type[LayerPruner]) -> type[LayerPruner]:
    """A registered method name or the method class itself."""
    return get_method(method) if isinstance(method, str) else method


@dataclass(frozen=True)
class Pruning:
    """How a client prunes, one record for every caller that computes local masks (clients,
    baselines, simulations, the privacy audit's shadow and neighbour masks): the local
    ``method`` (a name of :data:`fedlib.methods.METHODS`, or the class) with its constructor
    ``options``, the target ``sparsity`` (a float, or per layer), the local comparison
    ``group``, the tie-break ``seed``, the calibration ``batch_size`` and the ``placement``
    (device and dtype) it computes on."""

    method: str | type[LayerPruner] = "wanda"
    sparsity: float | Mapping[str, float] = 0.5
    group: str = "row"
    seed: int = 0
    options: Mapping = field(default_factory=dict)
    batch_size: int = 8
    placement: Placement = CPU

    def __post_init__(self):
        object.__setattr__(self, "options", dict(self.options or {}))  # None: no options

    @property
    def factory(self) -> type[LayerPruner]:
        """The method's class."""
        return resolve_method(self.method)


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


def plan_sparsity(handle: ModelHandle, input_ids: torch.Tensor | None,
                  pruning: Pruning) -> float | Mapping[str, float]:
    """The method's per-layer ratios from its planning pass (:meth:`LayerPruner.plan`, OWL's
    dense pre-pass); an explicit per-layer mapping is always used as given. Call once per
    client, before its pruning pass."""
    if isinstance(pruning.sparsity, Mapping):
        return pruning.sparsity
    return pruning.factory.plan(handle, input_ids, pruning.sparsity, group=pruning.group, options=pruning.options,
                                batch_size=pruning.batch_size, placement=pruning.placement)


def block_sparsity(step: BlockStep, client: int, pruners: Mapping[str, LayerPruner],
                   ratios: float | Mapping[str, float], pruning: Pruning) -> float | Mapping[str, float]:
    """The ratios to prune the step's block at for ``client`` (its planned ``ratios`` in, after
    :meth:`BlockStep.collect`: :meth:`LayerPruner.allocate_block`, BESA's learned allocation);
    an explicit per-layer mapping is always used as given."""
    if isinstance(ratios, Mapping):
        return ratios
    return pruning.factory.allocate_block(step, client, pruners, ratios, pruning.group, pruning.seed,
                                          pruning.options)


def prune_locally(
    model: nn.Module | ModelHandle,
    input_ids: torch.Tensor | None,
    pruning: Pruning,
    on_block: Callable[[int, BlockDecision], None] | None = None,
    *,
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
    factory = pruning.factory
    result = BlockDecision(masks={})
    sparsity = pruning.sparsity
    if factory.needs_calibration:
        if input_ids is None:
            raise ValueError(f"method {factory.name!r} needs calibration data")
        sparsity = plan_sparsity(handle, input_ids, pruning)
        runner = BlockRunner(handle, [input_ids], pruning.placement, pruning.batch_size)
    else:  # data-free: no activations, blocks only
        runner = BlockRunner(handle, [], pruning.placement, pruning.batch_size)
    for step in runner.steps(blocks):
        pruners = {name: factory(linear, name, **pruning.options) for name, linear in step.linears.items()}
        ratios = sparsity
        if runner.n_clients:
            step.collect(0, pruners)
            ratios = block_sparsity(step, 0, pruners, sparsity, pruning)
        decision = decide_block(pruners, ratios, pruning.group, pruning.seed)
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
