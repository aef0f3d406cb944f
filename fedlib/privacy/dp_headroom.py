"""How much of private data's gain DP masks can keep, and how much data that takes (issue 29).

The distributed mechanism of :mod:`fedlib.dp.distributed` releases, per block input, the
noisy mean of the clients' clipped relative channel-energy deviations and soft-thresholds it
toward the public prior. This module asks what limits it, on the clients' real statistics:

- ``exact``: the private channel energies themselves (no clip, no noise) through the public
  mask's prefix: what the statistic says without privacy (not a ceiling: a clipped, shrunk
  estimate can give a better mask, as mixing public and private text can).
- ``threshold``: the default estimator (:func:`fedlib.dp.public.estimate_deviation`) at the
  noise of the mechanism's guarantee at ε, divided by ``multiplier``. The noise on a mean of
  ``multiplier`` x n samples of the same distribution is that much smaller, so this emulates a
  federation with ``multiplier`` times the data (the sample mean's own error, already small at
  the study's n, is not shrunk with it).
- ``posterior``: the empirical-Bayes estimator (``--dp-estimator posterior``, the same function):
  per input, each coordinate's posterior mean under the prior that best explains that input's
  noisy coordinates. Where the threshold keeps only the few coordinates far above the noise, this
  shrinks each coordinate by how often values like it are signal.
- ``oracle``: each coordinate of the noisy mean scaled by mu^2 / (mu^2 + s^2), with mu the true
  clipped mean and s the noise's std. It reads the private mean, so it is **not** a private
  mechanism: the best scaling of each coordinate by a constant of its own (smallest expected
  squared error), a reference for the others, not a bound (a nonlinear estimator such as
  ``posterior`` can give better masks).

Continuous Gaussian noise of the guarantee's std stands in for the discrete Gaussian shares
(same variance; the grid's rounding, 1/65536 of the clip per coordinate, is negligible next to it). Everything goes
through the same pass as :func:`fedlib.dp.public.federation_pass`: statistics of block
b through blocks < b pruned by the public mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedlib.client import Pruning, decide_block
from fedlib.groups import seeded_generator
from fedlib.dp.gaussian import input_key
from fedlib.dp.public import (
    EstimatedWanda,
    PassShape,
    PublicPrior,
    PublicWanda,
    clip_rows,
    estimate_deviation,
)
from fedlib.runner import BlockDecision, BlockRunner

#: the estimators this analysis compares (module docstring)
ESTIMATORS = ("exact", "threshold", "posterior", "oracle")


@dataclass
class InputStatistics:
    """One block input: the public prior, and every private sample's relative deviations."""

    prior: PublicPrior
    deviations: torch.Tensor  # (samples, channels)

    def clipped_mean(self, clip: float) -> torch.Tensor:
        """The mean of the deviations, each sample L2-clipped to ``clip`` x the public scale."""
        return clip_rows(self.deviations, clip * self.prior.unit).mean(dim=0)


@dataclass
class BlockStatistics:
    """A block's inputs' statistics and its linears' weights (float32, on the host)."""

    index: int
    inputs: dict[str, InputStatistics]
    weights: dict[str, torch.Tensor]


def collect_statistics(model, public_ids: torch.Tensor, clients_ids: Sequence[torch.Tensor],
                       pruning: Pruning) -> list[BlockStatistics]:
    """Every block's statistics, the clients' samples pooled, through the public mask's prefix."""
    samples = torch.cat(list(clients_ids))
    runner = BlockRunner(model, [public_ids, samples], pruning.placement, pruning.batch_size)
    blocks = []
    for step in runner.steps():
        public = {name: PublicWanda(linear, name) for name, linear in step.linears.items()}
        step.collect(0, public)
        # the public collector keeps each sample's channel energies: the private samples' too
        private = {name: PublicWanda(linear, name) for name, linear in step.linears.items()}
        step.collect(1, private)
        inputs = {}
        for name in step.linears:
            key = input_key(name)
            if key not in inputs:
                prior, stats = public[name].prior(), private[name].stats
                inputs[key] = InputStatistics(prior, prior.represent(torch.cat(stats["samples"]), stats["seqlen"]))
        weights = {name: linear.weight.detach().to("cpu", torch.float32).clone()
                   for name, linear in step.linears.items()}
        blocks.append(BlockStatistics(step.index, inputs, weights))
        decision = decide_block(public, pruning.sparsity, pruning.group, pruning.seed)
        for stream in range(runner.n_clients):
            step.propagate(stream, decision)
    return blocks


@dataclass(frozen=True)
class Variant:
    """One row of the analysis: an estimator, the guarantee whose noise it sees (None for
    ``exact``), the data multiplier and the noise draw."""

    estimator: str
    guarantee: object | None = None
    clip: float = math.inf
    multiplier: float = 1.0
    noise_seed: int = 0

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator {self.estimator!r}: known {', '.join(ESTIMATORS)}")
        if (self.estimator == "exact") != (self.guarantee is None):
            raise ValueError("the exact estimator takes no guarantee; the others need one")
        if not self.multiplier > 0:
            raise ValueError(f"multiplier must be > 0, got {self.multiplier}")
        if self.guarantee is not None and not math.isfinite(self.clip):
            raise ValueError("a noisy variant needs a finite clip")

    @property
    def label(self) -> str:
        if self.estimator == "exact":
            return "exact"
        return f"{self.estimator}-eps{self.guarantee.epsilon:g}-x{self.multiplier:g}-n{self.noise_seed}"


class _Linear:
    """What a pruner reads of a linear: its weight."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight


def released_coordinates(blocks: Sequence[BlockStatistics]) -> int:
    """The coordinates the mechanism releases over every block (the threshold's family)."""
    return sum(s.prior.dim for b in blocks for s in b.inputs.values())


def variant_masks(blocks: Sequence[BlockStatistics], variant: Variant, pruning: Pruning) -> tuple[dict, int]:
    """(layer -> mask, coordinates moved off the public prior) of one variant."""
    shape = PassShape(released_coordinates(blocks), sum(len(b.inputs) for b in blocks))
    masks, moved = {}, 0
    for block in blocks:
        energies = {}
        for key, stats in block.inputs.items():
            if variant.guarantee is None:
                mean = stats.deviations.mean(dim=0)
            else:
                bound = variant.clip * stats.prior.unit
                n = stats.deviations.shape[0]
                std = variant.guarantee.noise_std(bound, stats.prior.dim) / variant.multiplier / n
                true = stats.clipped_mean(variant.clip)
                noise = torch.randn(true.shape, dtype=torch.float64,
                                    generator=seeded_generator(variant.noise_seed, "dp-headroom", key))
                mean = true + std * noise
                if variant.estimator == "oracle":
                    mean = true.square() / (true.square() + std * std) * mean
                else:
                    mean = estimate_deviation(variant.estimator, mean, std, shape)
            moved += int((mean != 0).sum())
            energies[key] = stats.prior.energies(mean)
        pruners = {name: EstimatedWanda(_Linear(w), name, energies[input_key(name)]) for name, w in block.weights.items()}
        masks.update(decide_block(pruners, pruning.sparsity, pruning.group, pruning.seed).masks)
    return masks, moved


def block_variant(masks: dict, names_by_block: dict[int, list[str]]):
    """``perplexities``' ``variant``: block index -> its masks."""
    return lambda index: BlockDecision(masks={name: masks[name] for name in names_by_block[index]})


def variants_from_spec(spec: Sequence[dict], noise_seeds: Sequence[int], clip: float, layer_names: Sequence[str],
                       clients: int, public: str) -> list[Variant]:
    """``exact`` first, then every spec item {"estimator", "epsilon", "delta" (1e-5),
    "multipliers" ([1])} at every noise seed, with the distributed mechanism's guarantee."""
    from fedlib.dp.distributed import DistributedTarget

    variants = [Variant("exact")]
    for item in spec:
        unknown = set(item) - {"estimator", "epsilon", "delta", "multipliers"}
        if unknown or "estimator" not in item or "epsilon" not in item:
            raise ValueError(f"variant {item}: expected keys estimator, epsilon and optionally delta, multipliers; "
                             f"got {sorted(item)}")
        if item["estimator"] == "exact":
            raise ValueError("the exact row is always computed once; list only threshold, posterior or oracle variants")
        target = DistributedTarget(float(item["epsilon"]), float(item.get("delta", 1e-5)), clip, 0, clients)
        guarantee = target.guarantee(layer_names, public)
        for multiplier in item.get("multipliers", [1]):
            for seed in noise_seeds:
                variants.append(Variant(item["estimator"], guarantee, clip, float(multiplier), int(seed)))
    return variants


def headroom(model, eval_model, public_ids: torch.Tensor, clients_ids: Sequence[torch.Tensor],
             windows: torch.Tensor, pruning: Pruning, eval_placement, variants: Sequence[Variant],
             eval_threads: int = 1) -> dict:
    """Every variant's masks from one statistics pass, each scored on ``windows`` (per-window
    NLL, :func:`fedlib.evaluate.perplexity.perplexity`) by ``eval_model`` on ``eval_placement``
    with ``eval_threads`` CPU threads: bfloat16 sums on the CPU depend on the thread count, so
    rows paired with ``fedlib evaluate`` results must be scored on as many threads as those were."""
    from fedlib.evaluate.perplexity import perplexity

    blocks = collect_statistics(model, public_ids, clients_ids, pruning)
    names_by_block = {b.index: list(b.weights) for b in blocks}
    rows = []
    threads = torch.get_num_threads()
    for variant in variants:
        masks, moved = variant_masks(blocks, variant, pruning)
        torch.set_num_threads(eval_threads)
        try:
            score = perplexity(eval_model, windows, 1, placement=eval_placement,
                               variant=block_variant(masks, names_by_block))
        finally:
            torch.set_num_threads(threads)
        g = variant.guarantee
        rows.append({"label": variant.label, "estimator": variant.estimator, "multiplier": variant.multiplier,
                     "noise_seed": variant.noise_seed, "epsilon": None if g is None else g.epsilon,
                     "sigma": None if g is None else g.sigma, "releases": None if g is None else g.releases,
                     "moved_coordinates": moved, "ppl": score["ppl"], "window_nll": score["window_nll"]})
        print(f"dp-headroom {variant.label}: ppl {score['ppl']:.2f}, {moved} coordinates off the prior", flush=True)
    return {"samples": int(sum(int(c.shape[0]) for c in clients_ids)), "clients": len(clients_ids),
            "coordinates": released_coordinates(blocks), "windows": int(windows.shape[0]),
            "eval_threads": eval_threads, "rows": rows}
