"""FedSpaLLM server (Bai et al., 2024, arXiv 2410.14852): ℓ0-norm aggregation of the clients'
pruned weights, adaptive mask expansion, resource-proportional layer sampling.

Clients run SparseGPT *with* its OBS weight update (method ``sparsegpt_update``) on the decoder
blocks the server assigned them and send, per pruned linear, the updated weights and the mask.
Masks here follow fedlib's convention (True = pruned), the paper's ``M_i`` is the opposite
(1 = kept).

ℓ0-norm aggregation (Eq. 5)
    ``W_g = sum_i M_i ⊙ W_i / ||sum_i M_i||_0``, read per weight: the mean of the values of the
    clients that *kept* the weight (the denominator is the number of clients whose mask keeps
    it), 0 where every client pruned it. "Kept" is taken from the masks the clients send, not
    from ``W_i != 0``: SparseGPT zeroes the weights of dead inputs without counting them as
    pruned, and a kept float16 weight can round to 0; the masks say what the clients decided.
Adaptive mask expansion (Eqs. 6-7)
    ``C_j`` = number of clients that pruned weight j. After aggregation only the weights with
    ``C_j = N`` are zero, fewer than the target. The server prunes
    ``k = ceil(s·d) - #{j : C_j = N}`` more weights, those with the highest ``C_j`` first (most
    agreed), so every group ends with exactly ``ceil(s·d)`` pruned weights. Ties among equal
    counts go through :func:`fedlib.groups.prune_lowest` (seeded keys). Granularity (the paper's
    ``d`` is "the total number of weights"; its Corollary 4.1 wants every aggregated layer to have
    the clients' sparsity): ``group="layer"`` (default) expands each linear layer to its own
    target, ``row``/``column`` expand each row/column (d = its length). ``rounding="ceil"`` is
    Eq. 7; ``"floor"`` gives exactly the count every fedlib client prunes (``groups.pruned_count``)
    and so Corollary 4.1's ``S_global = S_i`` exactly; the two differ by one weight per group when
    ``s·d`` is not an integer. If the clients already agree on more than the target in a group
    (possible only with a finer expansion group than the clients' own), ``k`` would be negative:
    every all-pruned weight stays pruned (they are 0 after aggregation anyway) and the group ends
    above the target.
Layer sampling (Eq. 8, Algorithm 1)
    "Layers" are decoder blocks. Client i with resources ``r_i`` in (0, 1] (the fraction of the
    blocks it can prune per round) gets ``k_i = clamp(round(r_i·L), 1, L)`` blocks per round,
    proportional to ``r_i`` up to rounding (:func:`blocks_per_round`). The paper only says
    ``L_i = Sample(L, k_i)`` and, for its sparsity guarantee, that every block must be sampled by
    at least one client in every round. Sampler ``"cyclic"`` (default) honours both: one seeded
    random permutation of the blocks is dealt out as consecutive windows, client after client and
    round after round (k_1 blocks to client 1, the next k_2 to client 2, ...; wrapping around).
    Each client's set is a uniformly random k_i-subset (a window of a random permutation), every
    block has the same probability k_i/L for client i (Theorem 4.2's condition), every block is
    covered in every round when ``sum_i k_i >= L``, and within any ``ceil(L / sum_i k_i)``
    consecutive rounds otherwise (so after T rounds when ``sum_i k_i · T >= L``). Sampler
    ``"independent"`` is Algorithm 1 read literally (each client draws its k_i blocks uniformly and
    independently every round): no coverage guarantee.
A round (Algorithm 1, what fedlib does)
    Each client receives its sampled blocks' current global weights (line 6), prunes them with
    its own data (line 11: SparseGPT on ``W_g[L_i]``); its calibration activations pass through
    every block before its last sampled one, through its own pruned version for sampled blocks and
    through the *dense* cached weights for unsampled ones (Eq. 9, line 10: "use pre-cached dense
    layers for unsampled layers"); blocks after its last sampled one are not run. The server
    aggregates each block over the clients that sampled it *in this round* (N in Eqs. 6-7 is that
    number) and replaces the block's global weights and mask. A block no client sampled in a
    round keeps its current global state (dense until some client samples it). A block never
    sampled in any round stays dense: the result reports it, and the simulation driver refuses
    it unless told otherwise (the paper's guarantee would not hold).

Uploads and global models are weight files (:mod:`fedlib.weightfile`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fedlib import progress
from fedlib.groups import GROUPS, prune_lowest, seeded_generator, sparsity_for_count
from fedlib.maskfile import MaskFileError
from fedlib.models import LayerInfo
from fedlib.protocol import ROUNDINGS, SAMPLERS
from fedlib.server.robust import ConsensusDistance, client_report, screening_rule
from fedlib.strategy_options import STRATEGY_OPTIONS, STRATEGY_SENDS
from fedlib.server.strategy import LayerAggregator, LayerResult, RoundPlan, Strategy
from fedlib.weightfile import WEIGHT_DTYPES, open_weight_file, write_weight_file


# --------------------------------------------------------------------------- aggregation


def target_count(size: int, sparsity: float, rounding: str = "ceil") -> int:
    """Pruned weights a group of ``size`` must end with: ``ceil(s·d)`` (Eq. 7) or ``floor``."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    exact = size * sparsity
    # the epsilon keeps 0.7 * 10 = 7.000000001 from rounding up to 8 (and down to 6)
    if rounding == "ceil":
        return min(size, math.ceil(exact - 1e-9))
    return int(exact + 1e-9)


def expand_mask(
    votes: torch.Tensor,
    n_clients: int,
    sparsity: float,
    group: str = "layer",
    seed: int = 0,
    name: str = "",
    rounding: str = "ceil",
) -> torch.Tensor:
    """Adaptive mask expansion: True = pruned in the global model.

    ``votes`` = C_j, how many of the ``n_clients`` clients pruned each weight. Every weight with
    ``C_j = n_clients`` is pruned; each group (``layer``/``row``/``column``) is then filled up
    to :func:`target_count` with the highest ``C_j`` first, ties by seeded keys.
    """
    if group not in GROUPS:
        raise ValueError(f"FedSpaLLM mask expansion is unstructured: group must be one of {GROUPS}, got {group!r}")
    if votes.dim() != 2:
        raise ValueError(f"{name}: votes must be 2-D, got shape {tuple(votes.shape)}")
    if n_clients < 1:
        raise ValueError(f"{name}: n_clients must be >= 1")
    if int(votes.min()) < 0 or int(votes.max()) > n_clients:
        raise ValueError(f"{name}: vote counts outside 0..{n_clients}")
    rows, cols = votes.shape
    size = {"layer": rows * cols, "row": cols, "column": rows}[group]
    count = target_count(size, sparsity, rounding)
    chosen = prune_lowest(-votes.to(torch.float32), sparsity_for_count(count, size), group, seed, f"fedspallm:{name}")
    return chosen | (votes >= n_clients)


class L0Accumulator:
    """Streams one layer's client uploads: sum of kept values, kept count, prune votes.

    Sums are float64, so the aggregate does not depend on the order clients arrive in (to
    float32 precision). Memory: one float64 and two int16 copies of the layer.
    """

    def __init__(self, shape: Sequence[int], name: str = ""):
        self.shape, self.name = tuple(shape), name
        self.total = torch.zeros(self.shape, dtype=torch.float64)
        self.kept = torch.zeros(self.shape, dtype=torch.int16)
        self.n_clients = 0

    def add(self, mask: torch.Tensor, weight: torch.Tensor) -> None:
        if tuple(mask.shape) != self.shape or tuple(weight.shape) != self.shape:
            raise ValueError(
                f"{self.name}: mask {tuple(mask.shape)} / weight {tuple(weight.shape)} != layer {self.shape}"
            )
        keep = ~mask.to("cpu", torch.bool)
        self.total += torch.where(keep, weight.detach().to("cpu", torch.float64), 0.0)
        self.kept += keep.to(torch.int16)
        self.n_clients += 1

    @property
    def votes(self) -> torch.Tensor:
        """C_j: clients that pruned each weight (int16)."""
        return (self.n_clients - self.kept).to(torch.int16)

    def aggregate(self) -> torch.Tensor:
        """Eq. 5: mean over the clients that kept each weight, 0 where none did (float32)."""
        if self.n_clients == 0:
            raise ValueError(f"{self.name}: no client uploads to aggregate")
        mean = self.total / self.kept.clamp(min=1).to(torch.float64)
        return torch.where(self.kept > 0, mean, 0.0).to(torch.float32)

    def finish(self, sparsity: float, group: str = "layer", seed: int = 0, rounding: str = "ceil"):
        """``(weight, mask, votes)``: ℓ0 aggregate with the expanded mask applied."""
        votes = self.votes
        mask = expand_mask(votes, self.n_clients, sparsity, group, seed, self.name, rounding)
        weight = self.aggregate()
        weight[mask] = 0.0
        return weight, mask, votes


def aggregate_layer(
    weights: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
    sparsity: float,
    group: str = "layer",
    seed: int = 0,
    name: str = "",
    rounding: str = "ceil",
):
    """One layer's FedSpaLLM aggregation from the uploads of the clients that pruned it:
    ``(weight, mask, votes)`` (float32 weights, zero where ``mask``)."""
    if len(weights) != len(masks) or not weights:
        raise ValueError(f"{name}: need one mask per weight tensor, and at least one client")
    acc = L0Accumulator(weights[0].shape, name)
    for weight, mask in zip(weights, masks):
        acc.add(mask, weight)
    return acc.finish(sparsity, group, seed, rounding)


# --------------------------------------------------------------------------- layer sampling


def blocks_per_round(resources: Sequence[float], n_blocks: int) -> list[int]:
    """``k_i = clamp(round(r_i · L), 1, L)`` for resources ``r_i`` in (0, 1] (fraction of the
    ``L`` decoder blocks client i can prune per round; round half up)."""
    if n_blocks < 1:
        raise ValueError("n_blocks must be >= 1")
    counts = []
    for i, r in enumerate(resources):
        if not 0.0 < float(r) <= 1.0:
            raise ValueError(f"resources[{i}] = {r}: expected a fraction of the model in (0, 1]")
        counts.append(min(n_blocks, max(1, math.floor(float(r) * n_blocks + 0.5))))
    return counts


def sample_blocks(
    n_blocks: int,
    counts: Sequence[int],
    n_rounds: int,
    seed: int,
    sampler: str = "cyclic",
) -> list[list[list[int]]]:
    """``[round][client]`` -> sorted block indices; client i gets ``counts[i]`` distinct blocks
    per round. Deterministic in ``seed``; see the module docstring for the two samplers."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    if n_rounds < 1:
        raise ValueError("n_rounds must be >= 1")
    for i, k in enumerate(counts):
        if not 1 <= int(k) <= n_blocks:
            raise ValueError(f"client {i}: {k} blocks per round, expected 1..{n_blocks}")
    out: list[list[list[int]]] = []
    if sampler == "cyclic":
        order = torch.randperm(n_blocks, generator=seeded_generator(seed, "fedspallm-blocks")).tolist()
        offset = 0
        for _ in range(n_rounds):
            row = []
            for k in counts:
                row.append(sorted(order[(offset + j) % n_blocks] for j in range(int(k))))
                offset += int(k)
            out.append(row)
        return out
    for t in range(n_rounds):
        out.append([
            sorted(torch.randperm(n_blocks, generator=seeded_generator(seed, "fedspallm-blocks", t, i))[: int(k)].tolist())
            for i, k in enumerate(counts)
        ])
    return out


def uncovered_blocks(assignments: Sequence[Sequence[Sequence[int]]], n_blocks: int) -> list[int]:
    """Blocks no client sampled in any round."""
    seen = {b for row in assignments for blocks in row for b in blocks}
    return [b for b in range(n_blocks) if b not in seen]


# --------------------------------------------------------------------------- the strategy


class L0Layer(LayerAggregator):
    """One layer's FedSpaLLM aggregation in the strategy protocol: ℓ0 mean, then expansion."""

    def __init__(self, strategy: "FedSpaLLM", info: LayerInfo):
        self.strategy, self.acc = strategy, L0Accumulator(info.shape, info.name)

    def add(self, client_id: str, mask: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        if weight is None:
            raise ValueError(f"{self.acc.name}: FedSpaLLM clients send weights with their masks")
        self.acc.add(mask, weight)

    def finish(self) -> LayerResult:
        s = self.strategy
        weight, mask, votes = self.acc.finish(s.sparsity, s.group, s.seed, s.rounding)
        return LayerResult(mask, votes, weight)


@dataclass
class FedSpaLLM(Strategy):
    """``group`` is the mask-expansion group, ``resources`` the clients' fractions of the model
    per round (None: every client prunes every block, the paper's experiments), ``rounds`` = T.
    Clients run ``method`` and send weights in ``weight_dtype``."""

    group: str = "layer"
    sparsity: float = 0.5
    seed: int = 0
    rounds: int = 1
    resources: tuple[float, ...] | None = None
    sampler: str = "cyclic"
    rounding: str = "ceil"
    method: str = "sparsegpt_update"
    weight_dtype: str = "float32"

    name = "fedspallm"
    send = STRATEGY_SENDS["fedspallm"]
    cohort_fields = ("method", "group", "sparsity")
    schedules = ("fedspallm",)
    options = STRATEGY_OPTIONS["fedspallm"]

    def __post_init__(self):
        if self.group not in GROUPS:
            raise ValueError(f"FedSpaLLM expansion group must be one of {GROUPS}, got {self.group!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype must be one of {sorted(WEIGHT_DTYPES)}")
        if self.rounds < 1:
            raise ValueError(f"FedSpaLLM needs at least one round, got {self.rounds}")

    def n_rounds(self, n_blocks: int) -> int:
        return self.rounds

    def assignments(self, n_clients: int, n_blocks: int) -> list[list[list[int]]]:
        """``[round][client]`` -> blocks that client prunes in that round."""
        if self.resources is None:
            return [[list(range(n_blocks)) for _ in range(n_clients)] for _ in range(self.rounds)]
        if len(self.resources) != n_clients:
            raise ValueError(f"{len(self.resources)} resource values for {n_clients} clients")
        counts = blocks_per_round(self.resources, n_blocks)
        return sample_blocks(n_blocks, counts, self.rounds, self.seed, self.sampler)

    def configure_round(self, round_index: int, n_clients: int, n_blocks: int) -> RoundPlan:
        self._check_round(round_index, n_blocks)
        row = self.assignments(n_clients, n_blocks)[round_index]
        return RoundPlan(round_index, tuple(tuple(blocks) for blocks in row), self.send)

    def layer_aggregator(self, info: LayerInfo, n_clients: int, allocation: str = "uniform") -> L0Layer:
        return L0Layer(self, info)

    def aggregate(
        self,
        paths: Sequence[Path],
        fingerprint: str,
        layers: Sequence[LayerInfo],
        out: Path,
        *,
        previous: Path | None = None,
        round_index: int | None = None,
        assigned: Sequence[Sequence[int]] | None = None,
        cohort: Mapping[str, object] | None = None,
        absent: Sequence[str] = (),
    ) -> dict:
        """ℓ0-aggregate and expand every layer some upload covers; layers no upload covers are
        copied from ``previous`` (the last round's global file) when given. ``assigned[i]`` is
        checked against the blocks of ``paths[i]``; ``round_index`` against each file's round.
        A client missing from a round (dropout) only means fewer senders for its blocks; ``absent``
        names such clients in the global file."""
        if not paths:
            raise ValueError("aggregate needs at least one client weight file")
        if assigned is not None and len(assigned) != len(paths):
            raise ValueError(f"the round plan has {len(assigned)} clients, {len(paths)} files were given")
        files = [open_weight_file(Path(path), fingerprint, layers, None if assigned is None else assigned[i])
                 for i, path in enumerate(paths)]
        agreed = self.check_cohort(files, cohort)
        for f in files:
            if round_index is not None and f.round != round_index:
                raise MaskFileError(f.path, "x_round", f"upload for round {f.round}, aggregating round {round_index}")
        prev = open_weight_file(Path(previous), fingerprint, layers) if previous is not None else None
        if prev is not None and prev.header.role != "global":
            raise MaskFileError(prev.path, "role", f"expected 'global', got {prev.header.role!r}")
        prev_names = set(prev.layer_names) if prev is not None else set()
        masks, weights, votes, covered, clients_per_layer = {}, {}, {}, [], {}
        distance = ConsensusDistance(files)  # the outlier report: over the layers each client sent
        for info in progress.track(layers, "layer"):
            senders = [f for f in files if f.has_layer(info.name)]
            if senders:
                layer = self.layer_aggregator(info, len(senders))
                for f in senders:
                    mask = f.layer_mask(info.name)
                    layer.add(f.header.client_id, mask, f.layer_weight(info.name, mask))
                result = layer.finish()
                weights[info.name], masks[info.name], votes[info.name] = result.weight, result.mask, result.votes
                clients_per_layer[info.name] = len(senders)
                distance.add_layer(info.name, senders, counts=result.votes)
            elif info.name in prev_names:
                masks[info.name] = prev.layer_mask(info.name)
                weights[info.name] = prev.layer_weight(info.name, masks[info.name])
                votes[info.name] = prev.layer_votes(info.name, masks[info.name])
            else:
                continue
            covered.append(info)
        if not covered:
            raise ValueError("no layer to aggregate")
        all_blocks = sorted({info.block for info in layers})
        uncovered = sorted(set(all_blocks) - {info.block for info in covered})
        round_value = round_index if round_index is not None else max(f.round for f in files)
        write_weight_file(
            Path(out), masks, weights, covered, fingerprint=fingerprint, role="global",
            client_id="server", method=f"{self.name}[{agreed['method']}]", group=self.group,
            sparsity=self.sparsity, n_samples=sum(f.header.n_samples for f in files), seed=self.seed,
            n_clients=max(len(files), prev.header.n_clients if prev is not None else 0),
            weight_dtype="float32", round_index=round_value, votes=votes,
            extra={"rounding": self.rounding, "uncovered_blocks": json.dumps(uncovered),
                   **({"absent_clients": json.dumps(sorted(absent))} if absent else {})},
        )
        screening = screening_rule(None).screen(distance.distances())
        return {"n_clients": len(files), "group": self.group, "sparsity": self.sparsity,
                "round": round_value, "layers": len(covered), "uncovered_blocks": uncovered,
                "clients_per_layer_min": min(clients_per_layer.values(), default=0),
                "clients": client_report(files, distance, screening, {f.header.client_id for f in files}, False)}
