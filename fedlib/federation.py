"""Federation drivers (simulation on one machine): FedPrLLM one-shot and iterative pruning,
FedSpaLLM rounds, and the communication accounting the papers report.

FedPrLLM (Sections 3.2.3 and 4.2.3 of the paper)
    *One-shot*: every client prunes all blocks with its own masks (:func:`prune_locally`, so
    block l+1 of client i sees block l pruned by client i's mask), sends all masks once; the
    server sums them and keeps the top-k per comparison group. One communication round.
    *Iterative*: one round per decoder block. In round l every client collects block l's
    statistics from its own activations, which went through the *global* masks of blocks < l,
    decides its local masks, and uploads them; the server sums and selects (same function as
    one-shot: the :class:`~fedlib.server.fedprllm.FedPrLLM` strategy) and broadcasts the global
    masks; every client propagates its activations through block l under the global mask. All
    clients' activations ride on one :class:`~fedlib.runner.BlockRunner`, so each block is made
    resident once per round and run twice per client (statistics, propagation) exactly as in
    one-shot: the client compute is the same, only the server's selection sits between the two
    passes.
    With ``scale=True`` the global block l is ``W ⊙ (1 - M) ⊙ (m - M̂)/m`` and clients propagate
    through that (as the official FedPrLLM code does), so the broadcast carries the vote counts
    too. Methods with a weight update (``sparsegpt_update``) only contribute masks: the FedPrLLM
    global model is the base weights under the global mask. Methods that allocate per-layer
    ratios (OWL's plan on the client's own data, BESA's per-block allocation on the client's
    activations) do so per client exactly as in :func:`prune_locally`, and the server prunes
    each layer at the mean of the clients' pruned fractions in that layer
    (:func:`~fedlib.server.fedprllm.planned_sparsity`, as ``fedlib aggregate`` does with
    ``nonuniform`` mask files); uniform methods are pruned at ``sparsity`` (a float, or an explicit
    per-layer mapping). Iterative pruning takes ``server_sparsity`` to override either.

FedSpaLLM (see :mod:`fedlib.server.fedspallm` for aggregation, expansion and sampling)
    :func:`fedspallm_client` is one client's round; :func:`fedspallm_prune` simulates T rounds with
    N clients side by side on one runner per round, streaming every upload into per-layer ℓ0
    accumulators that are aggregated as soon as the block is done.

Communication accounting (:func:`communication_cost`), two conventions, always labelled:
    ``*_bytes``: what fedlib actually transmits for masks, 1 bit per weight packed 8 per byte
    (``ceil(numel/8)`` bytes per linear, as in the mask file; file headers excluded), summed over
    clients. Iterative: per round, up = N x the block's packed masks, down = N x the block's
    packed global masks (plus 1 byte per weight of vote counts, 2 above 255 clients, when
    ``scale=True``). One-shot: up = N x all packed masks, down = 0 (as the paper; distributing
    the final global mask, ``final_broadcast_bytes``, is the same for both and reported apart).
    ``paper_parameters_per_client``: FedPrLLM Table 3's unit, "number of parameters" per client,
    each mask entry counting as one parameter: one-shot = d (the prunable weights, uploaded
    once), iterative = 2d (every layer's mask up and its global mask down). For LLaMA-7B
    d = 6.476e9, as in the table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from fedlib.models import LayerInfo, ModelHandle
from fedlib.client import Pruning, block_sparsity, decide_block, plan_sparsity, prune_locally
from fedlib.runner import CPU, BlockDecision, BlockRunner, BlockStep, Placement
from fedlib.server.fedprllm import FedPrLLM, VoteHook, scale_factors
from fedlib.server.fedspallm import FedSpaLLM, uncovered_blocks
from fedlib.server.strategy import LayerAggregator


def packed_bytes(numel: int) -> int:
    """Bytes of one packed mask (1 bit per weight, as ``maskfile.pack_bits``)."""
    return (numel + 7) // 8


def _votes_dtype(n_clients: int) -> torch.dtype:
    return torch.uint8 if n_clients <= 255 else torch.int16


# --------------------------------------------------------------------------- records


@dataclass
class RoundRecord:
    """One communication round. Bytes and parameters are summed over clients."""

    round: int
    blocks: list[int]
    n_clients: int
    bytes_up: int
    bytes_down: int
    parameters_up: int  # mask entries (paper convention: one "parameter" per entry)
    parameters_down: int
    seconds_clients: float = 0.0  # summed over clients (they would run in parallel)
    seconds_server: float = 0.0
    client_masks: list[dict[str, torch.Tensor]] | None = None
    global_masks: dict[str, torch.Tensor] | None = None


@dataclass
class FederatedResult:
    """Global masks, vote counts ``M̂`` (for weight scaling) and the per-round records."""

    mode: str
    masks: dict[str, torch.Tensor]
    votes: dict[str, torch.Tensor]
    n_clients: int
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def bytes_up(self) -> int:
        return sum(r.bytes_up for r in self.rounds)

    @property
    def bytes_down(self) -> int:
        return sum(r.bytes_down for r in self.rounds)


@dataclass
class CommunicationCost:
    mode: str
    n_clients: int
    rounds: list[RoundRecord]
    #: FedPrLLM Table 3's unit: mask entries one client sends plus receives (d or 2d)
    paper_parameters_per_client: int
    #: sending the final global mask to every client (not counted by the paper, same for both modes)
    final_broadcast_bytes: int

    @property
    def bytes_up(self) -> int:
        return sum(r.bytes_up for r in self.rounds)

    @property
    def bytes_down(self) -> int:
        return sum(r.bytes_down for r in self.rounds)

    def as_dict(self) -> dict:
        return {
            "mode": self.mode, "n_clients": self.n_clients, "n_rounds": len(self.rounds),
            "mask_bytes_up": self.bytes_up, "mask_bytes_down": self.bytes_down,
            "mask_bytes_total": self.bytes_up + self.bytes_down,
            "paper_parameters_per_client": self.paper_parameters_per_client,
            "final_broadcast_bytes": self.final_broadcast_bytes,
        }


def _round_cost(index: int, blocks: list[int], layers: Sequence[LayerInfo], n_clients: int,
                down: bool, scale: bool) -> RoundRecord:
    numels = [info.shape[0] * info.shape[1] for info in layers]
    up_bytes = sum(packed_bytes(n) for n in numels)
    down_bytes = 0
    if down:
        down_bytes = up_bytes
        if scale:
            down_bytes += sum(numels) * torch.empty((), dtype=_votes_dtype(n_clients)).element_size()
    params = sum(numels)
    return RoundRecord(
        round=index, blocks=blocks, n_clients=n_clients,
        bytes_up=n_clients * up_bytes, bytes_down=n_clients * down_bytes,
        parameters_up=n_clients * params, parameters_down=n_clients * params if down else 0,
    )


def communication_cost(layers: Sequence[LayerInfo], n_clients: int, mode: str, scale: bool = False) -> CommunicationCost:
    """FedPrLLM communication for ``mode`` ``"one-shot"`` or ``"iterative"`` (module docstring):
    one record per round of the strategy's schedule."""
    if n_clients < 1:
        raise ValueError("n_clients must be >= 1")
    strategy = FedPrLLM(mode=mode)
    d = sum(info.shape[0] * info.shape[1] for info in layers)
    final = n_clients * sum(packed_bytes(info.shape[0] * info.shape[1]) for info in layers)
    present = sorted({info.block for info in layers})  # the plan's block i is the i-th block listed
    rounds = []
    for r in range(strategy.n_rounds(len(present))):
        blocks = [present[i] for i in strategy.configure_round(r, n_clients, len(present)).blocks[0]]
        rounds.append(_round_cost(r, blocks, [info for info in layers if info.block in blocks], n_clients,
                                  down=mode == "iterative", scale=scale))
    return CommunicationCost(mode, n_clients, rounds, d if mode == "one-shot" else 2 * d, final)


# --------------------------------------------------------------------------- FedPrLLM


def _fedprllm(server_group: str, pruning: Pruning, mode: str,
              server_sparsity: float | Mapping[str, float] | None, hook: VoteHook | None) -> FedPrLLM:
    """The server of a simulated FedPrLLM federation of clients that prune as ``pruning`` says
    (module docstring for the targets)."""
    return FedPrLLM(group=server_group, sparsity=pruning.sparsity if server_sparsity is None else server_sparsity,
                    seed=pruning.seed, mode=mode, follow_client_plan=server_sparsity is None, hook=hook)


def _aggregators(strategy: FedPrLLM, infos: Sequence[LayerInfo], n: int, allocation: str) -> dict[str, LayerAggregator]:
    return {info.name: strategy.layer_aggregator(info, n, allocation) for info in infos}


def iterative_prune(
    model: nn.Module | ModelHandle,
    client_input_ids: Sequence[torch.Tensor | None],
    pruning: Pruning,
    server_group: str,
    *,
    scale: bool = False,
    keep_round_masks: bool = False,
    on_round: Callable[[RoundRecord, dict, dict], None] | None = None,
    server_sparsity: float | Mapping[str, float] | None = None,
    hook: VoteHook | None = None,
    keep: bool = True,
) -> FederatedResult:
    """Iterative FedPrLLM: one round per decoder block (module docstring); every client prunes
    as ``pruning`` says (its group is the clients' local group).

    Returns the global masks, the vote counts, and one :class:`RoundRecord` per block (bytes up
    = sum over clients of the block's packed masks, bytes down = the global masks broadcast to
    every client; with ``keep_round_masks`` also each client's local masks and the global masks
    of that round). The server prunes each layer at ``server_sparsity`` when given, else as the
    module docstring says (the clients' mean for OWL / BESA, ``pruning.sparsity`` otherwise); ``hook``
    is a defence on its votes. ``on_round`` sees each round's record with its global masks and
    votes; with ``keep=False`` the result keeps neither (a large model streams them to the mask
    file instead). The model is left unchanged.
    """
    n = len(client_input_ids)
    if n == 0:
        raise ValueError("iterative pruning needs at least one client")
    handle = ModelHandle.of(model)
    factory = pruning.factory
    strategy = _fedprllm(server_group, pruning, "iterative", server_sparsity, hook)
    client_sparsity = [pruning.sparsity] * n
    inputs = []
    if factory.needs_calibration:
        if any(ids is None for ids in client_input_ids):
            raise ValueError(f"method {factory.name!r} needs calibration data for every client")
        # OWL-style planned ratios: each client plans on its own data, before the pruning pass
        client_sparsity = [plan_sparsity(handle, ids, pruning) for ids in client_input_ids]
        inputs = list(client_input_ids)
    runner = BlockRunner(handle, inputs, pruning.placement, pruning.batch_size)
    result = FederatedResult("iterative", {}, {}, n)
    for step in runner.steps():
        index = step.index
        plan = strategy.configure_round(index, n, handle.n_blocks)  # round l is block l
        infos = [LayerInfo(name, tuple(lin.weight.shape), index) for name, lin in step.linears.items()]
        record = _round_cost(index, [index], infos, n, down=True, scale=scale)
        layers = _aggregators(strategy, infos, n, factory.allocation)
        kept_masks = [] if keep_round_masks else None
        t_clients = 0.0
        for c in range(n):
            if index not in plan.blocks[c]:
                continue
            start = time.perf_counter()
            masks = _client_block_masks(step, c if runner.n_clients else None, client_sparsity[c], pruning)
            for name, mask in masks.items():
                layers[name].add(str(c), mask)
            if kept_masks is not None:
                kept_masks.append(masks)
            t_clients += time.perf_counter() - start
        start = time.perf_counter()
        outcome = {name: layer.finish() for name, layer in layers.items()}
        global_masks = {name: r.mask for name, r in outcome.items()}
        votes = {name: r.votes for name, r in outcome.items()}
        factors = {name: scale_factors(votes[name], n) for name in step.linears} if scale else {}
        record.seconds_server = time.perf_counter() - start
        start = time.perf_counter()
        broadcast = BlockDecision(masks=global_masks, factors=factors)
        for c in range(runner.n_clients):
            step.propagate(c, broadcast)
        t_clients += time.perf_counter() - start
        record.seconds_clients = t_clients
        if keep_round_masks:
            record.client_masks, record.global_masks = kept_masks, global_masks
        if keep:
            result.masks.update(global_masks)
            result.votes.update(votes)
        result.rounds.append(record)
        if on_round is not None:
            on_round(record, global_masks, votes)
    return result


def _client_block_masks(step: BlockStep, client: int | None, ratios, pruning: Pruning) -> dict[str, torch.Tensor]:
    """A client's local masks of the block in ``step`` in iterative FedPrLLM (``client``: its
    activations on the runner; None for a method without calibration data), at its planned
    ``ratios``."""
    pruners = {name: pruning.factory(linear, name, **pruning.options) for name, linear in step.linears.items()}
    if client is not None:
        step.collect(client, pruners)
        ratios = block_sparsity(step, client, pruners, ratios, pruning)
    return decide_block(pruners, ratios, pruning.group, pruning.seed).masks


def iterative_client(
    model: nn.Module | ModelHandle,
    input_ids: torch.Tensor | None,
    round_index: int,
    pruning: Pruning,
    *,
    global_masks: Mapping[str, torch.Tensor],
    factors: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """One client's round ``l`` of iterative FedPrLLM from files: its activations go through
    blocks ``0..l-1`` under the server's ``global_masks`` (times ``factors`` when the federation
    scales), then it decides block ``l``'s local masks. The same per-client computation as
    :func:`iterative_prune` (which carries every client at once), so a federation of files
    gives the same global masks bit for bit. Stateless: each round replays the earlier blocks
    (``l`` block passes) rather than keep activations between rounds."""
    handle = ModelHandle.of(model)
    if not 0 <= round_index < handle.n_blocks:
        raise ValueError(f"round {round_index}: the model has blocks 0..{handle.n_blocks - 1}")
    ratios, inputs = pruning.sparsity, []
    if pruning.factory.needs_calibration:
        if input_ids is None:
            raise ValueError(f"method {pruning.factory.name!r} needs calibration data")
        ratios = plan_sparsity(handle, input_ids, pruning)
        inputs = [input_ids]
    runner = BlockRunner(handle, inputs, pruning.placement, pruning.batch_size)
    for step in runner.steps(limit=round_index + 1):
        if step.index == round_index:
            return _client_block_masks(step, 0 if inputs else None, ratios, pruning)
        if inputs:
            missing = sorted(set(step.linears) - set(global_masks))
            if missing:
                raise ValueError(f"round {round_index}: no global mask for {missing[0]} (block {step.index})")
            step.propagate(0, BlockDecision(masks={n: global_masks[n] for n in step.linears},
                                            factors={n: factors[n] for n in step.linears} if factors else {}))
    raise AssertionError("unreachable: the runner stops after block round_index")


def one_shot_prune(
    model: nn.Module,
    client_input_ids: Sequence[torch.Tensor | None],
    pruning: Pruning,
    server_group: str,
    *,
    keep_client_masks: bool = False,
    hook: VoteHook | None = None,
) -> FederatedResult:
    """One-shot FedPrLLM in memory: every client runs :func:`prune_locally` with ``pruning``, votes
    are counted as blocks finish (client masks are not kept unless asked), the server selects per
    layer."""
    n = len(client_input_ids)
    if n == 0:
        raise ValueError("one-shot pruning needs at least one client")
    handle = ModelHandle.of(model)
    strategy = _fedprllm(server_group, pruning, "one-shot", None, hook)  # one round, every block
    layers = handle.layers()
    aggregators = _aggregators(strategy, layers, n, pruning.factory.allocation)
    record = communication_cost(layers, n, "one-shot").rounds[0]
    kept = [] if keep_client_masks else None

    for c, ids in enumerate(client_input_ids):
        def add(_index: int, decision: BlockDecision, client=str(c)) -> None:
            for name, mask in decision.masks.items():
                aggregators[name].add(client, mask)

        start = time.perf_counter()
        local = prune_locally(handle, ids, pruning, on_block=add if kept is None else None, keep=kept is not None)
        if kept is not None:
            add(-1, local)
            kept.append(local.masks)
        del local
        record.seconds_clients += time.perf_counter() - start
    start = time.perf_counter()
    outcome = {name: layer.finish() for name, layer in aggregators.items()}
    record.seconds_server = time.perf_counter() - start
    record.client_masks = kept
    return FederatedResult("one-shot", {name: r.mask for name, r in outcome.items()},
                           {name: r.votes for name, r in outcome.items()}, n, [record])


# --------------------------------------------------------------------------- FedSpaLLM


def _fedspallm_round(
    handle: ModelHandle,
    inputs: Sequence[torch.Tensor],
    blocks: Sequence[Sequence[int]],
    pruning: Pruning,
    *,
    global_weights: Mapping[str, torch.Tensor],
    global_masks: Mapping[str, torch.Tensor],
    on_block: Callable[[int, int, BlockDecision], None],
    after_block: Callable[[int], None] | None = None,
) -> list[float]:
    """One FedSpaLLM round of every client in ``inputs`` on one :class:`BlockRunner` (each
    block is made resident once for all of them): client ``c`` prunes ``blocks[c]`` as
    ``pruning`` says, starting from the current global weights of those blocks (SparseGPT with
    its OBS update, FedSpaLLM's method);
    its activations pass through its own pruned version of sampled blocks and the dense base
    weights of unsampled ones (Eq. 9); nothing after its last sampled block is run.
    ``on_block(client, index, decision)`` receives each upload (masks and weights of every
    linear of the block, 0 where pruned, on the compute device); ``after_block(index)`` runs once every
    client is done with the block. Returns each client's compute seconds."""
    factory = pruning.factory  # any method works; without an update the upload is the masked weights
    sampled = [sorted(set(int(b) for b in client_blocks)) for client_blocks in blocks]
    ratios = [plan_sparsity(handle, ids, pruning) if s else pruning.sparsity for ids, s in zip(inputs, sampled)]
    last = [s[-1] if s else -1 for s in sampled]
    seconds = [0.0] * len(inputs)
    if max(last, default=-1) < 0:
        return seconds
    runner = BlockRunner(handle, inputs, pruning.placement, pruning.batch_size)
    for step in runner.steps(max(last) + 1):
        for c in range(runner.n_clients):
            if step.index > last[c]:
                continue
            start = time.perf_counter()
            decision = None
            if step.index in sampled[c]:
                with step.weights_replaced(masks=global_masks, weights=global_weights):
                    pruners = {name: factory(linear, name, **pruning.options) for name, linear in step.linears.items()}
                    step.collect(c, pruners)
                    block_ratios = block_sparsity(step, c, pruners, ratios[c], pruning)
                    decision = decide_block(pruners, block_ratios, pruning.group, pruning.seed, upload_weights=True)
                    del pruners
            if step.index < last[c]:
                step.propagate(c, decision)  # None: Eq. 9, unsampled blocks stay dense on the client
            seconds[c] += time.perf_counter() - start
            if decision is not None:
                on_block(c, step.index, decision)
        if after_block is not None:
            after_block(step.index)
    return seconds


def fedspallm_client(
    model: nn.Module | ModelHandle,
    input_ids: torch.Tensor,
    blocks: Sequence[int],
    pruning: Pruning,
    *,
    global_weights: Mapping[str, torch.Tensor] | None = None,
    global_masks: Mapping[str, torch.Tensor] | None = None,
    on_block: Callable[[int, BlockDecision], None] | None = None,
    keep: bool = True,
) -> BlockDecision:
    """One FedSpaLLM client round (see :func:`_fedspallm_round`): prune ``blocks`` as ``pruning``
    says (FedSpaLLM's clients: ``sparsegpt_update`` with a layer group) starting
    from ``global_weights`` / ``global_masks`` (dense base weights where absent). Returns (when
    ``keep``) masks and updated weights (0 where pruned) of the sampled blocks' linears, on the
    host; ``on_block`` streams them (on the compute device)."""
    result = BlockDecision(masks={})

    def upload(_client: int, index: int, decision: BlockDecision) -> None:
        if keep:
            result.masks.update({name: mask.cpu() for name, mask in decision.masks.items()})
            result.weights.update({name: weight.cpu() for name, weight in decision.weights.items()})
        if on_block is not None:
            on_block(index, decision)

    _fedspallm_round(ModelHandle.of(model), [input_ids], [blocks], pruning, global_weights=global_weights or {},
                     global_masks=global_masks or {}, on_block=upload)
    return result


@dataclass
class FedSpaLLMRound:
    round: int
    assignments: list[list[int]]  # per client: the blocks it pruned
    blocks_updated: list[int]
    bytes_up: int  # summed over clients: weights (weight_dtype) + packed masks of sampled layers
    #: summed over clients: global weights (weight_dtype) + packed masks of the sampled blocks that
    #: are already aggregated (still-dense blocks come from the client's cached model: 0 bytes)
    bytes_down: int
    seconds_clients: float = 0.0
    seconds_server: float = 0.0


@dataclass
class FedSpaLLMResult:
    """Global model = base model with ``weights`` (aggregated, 0 where ``masks``) for every
    layer in ``weights``; blocks in ``uncovered`` stayed dense."""

    weights: dict[str, torch.Tensor]
    masks: dict[str, torch.Tensor]
    votes: dict[str, torch.Tensor]
    rounds: list[FedSpaLLMRound]
    uncovered: list[int]
    n_clients: int


def fedspallm_prune(
    model: nn.Module,
    client_input_ids: Sequence[torch.Tensor],
    strategy: FedSpaLLM,
    *,
    client_group: str = "layer",
    batch_size: int = 8,
    method_options: Mapping | None = None,
    allow_uncovered: bool = False,
    on_upload: Callable[[int, int, int, BlockDecision], None] | None = None,
    placement: Placement = CPU,
) -> FedSpaLLMResult:
    """Simulate ``strategy.rounds`` FedSpaLLM rounds (Algorithm 1) with one client per entry of
    ``client_input_ids``. Clients run ``strategy.method`` with ``client_group`` at
    ``strategy.sparsity``; the server ℓ0-aggregates and expands each block over the clients
    that sampled it in that round. Uploads are rounded to ``strategy.weight_dtype`` as a real
    upload would be. Raises if some block is never sampled unless ``allow_uncovered``.
    ``on_upload(round, client, block, decision)`` sees each client's upload of each block (in a
    one-round, all-blocks run, a client's uploads are its Standalone model) before it is dropped.
    Clients run side by side on one :class:`~fedlib.runner.BlockRunner` per round, so each block is
    resident once per round and aggregated as soon as every client is done with it."""
    n = len(client_input_ids)
    if n == 0:
        raise ValueError("FedSpaLLM needs at least one client")
    handle = ModelHandle.of(model)
    infos = handle.layers()
    by_block: dict[int, list[LayerInfo]] = {}
    for info in infos:
        by_block.setdefault(info.block, []).append(info)
    n_blocks = len(by_block)
    plans = [strategy.configure_round(t, n, n_blocks) for t in range(strategy.n_rounds(n_blocks))]
    uncovered = uncovered_blocks([plan.blocks for plan in plans], n_blocks)
    by_name = {info.name: info for info in infos}
    if uncovered and not allow_uncovered:
        raise ValueError(
            f"blocks {uncovered} are sampled by no client in {strategy.rounds} round(s) and would stay dense; "
            "raise resources or rounds (cyclic sampling covers all blocks once sum(k_i) * T >= L), "
            "or pass allow_uncovered=True"
        )
    pruning = Pruning(strategy.method, strategy.sparsity, client_group, strategy.seed, method_options, batch_size,
                      placement)
    dtype = {"float16": torch.float16, "float32": torch.float32}[strategy.weight_dtype]
    wbytes = torch.empty((), dtype=dtype).element_size()
    gweights: dict[str, torch.Tensor] = {}
    gmasks: dict[str, torch.Tensor] = {}
    gvotes: dict[str, torch.Tensor] = {}
    rounds = []
    for plan in plans:
        t, row = plan.round, [list(blocks) for blocks in plan.blocks]
        senders = {b: sum(b in blocks for blocks in row) for b in by_block}  # N of Eqs. 6-7 per block
        accs: dict[str, LayerAggregator] = {}
        rec = FedSpaLLMRound(t, row, sorted({b for blocks in row for b in blocks}), 0, 0)
        for blocks in row:
            sizes = [(info.name, info.shape[0] * info.shape[1]) for b in blocks for info in by_block[b]]
            rec.bytes_up += sum(n * wbytes + packed_bytes(n) for _, n in sizes)
            # a block still dense is in the client's cached model: only aggregated ones are sent
            rec.bytes_down += sum(n * wbytes + packed_bytes(n) for name, n in sizes if name in gweights)

        def stream(client: int, index: int, decision: BlockDecision, t=t, accs=accs, senders=senders) -> None:
            for name, mask in decision.masks.items():
                if name not in accs:
                    accs[name] = strategy.layer_aggregator(by_name[name], senders[index])
                accs[name].add(str(client), mask, decision.weights[name].to(dtype))
            if on_upload is not None:
                on_upload(t, client, index, decision)

        def aggregate(index: int) -> None:
            # the block's uploads are all in: aggregate it now, so accumulators never outlive a block
            start = time.perf_counter()
            for name in [name for name in accs if by_name[name].block == index]:
                layer = accs.pop(name).finish()
                gweights[name], gmasks[name], gvotes[name] = layer.weight, layer.mask, layer.votes
            rec.seconds_server += time.perf_counter() - start

        seconds = _fedspallm_round(handle, list(client_input_ids), row, pruning, global_weights=gweights,
                                   global_masks=gmasks, on_block=stream, after_block=aggregate)
        rec.seconds_clients = sum(seconds)
        rounds.append(rec)
    order = [info.name for info in infos if info.name in gweights]
    return FedSpaLLMResult(
        weights={k: gweights[k] for k in order}, masks={k: gmasks[k] for k in order},
        votes={k: gvotes[k] for k in order}, rounds=rounds, uncovered=uncovered, n_clients=n,
    )
