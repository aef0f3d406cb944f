"""OWL and BESA: non-uniform layerwise sparsity on top of Wanda's ranking."""

import copy

import numpy as np
import pytest
import torch

from fedlib.groups import expected_pruned, prune_lowest
from fedlib.maskfile import read_header, write_mask_file
from fedlib.methods import get_method, method_allocation
from fedlib.methods.besa import (
    BESAOptions,
    _SparseLayer,
    block_reconstruction_error,
    candidate_sparsities,
    learn_block_allocation,
    ranks_in_group,
    tilted_logits,
)
from fedlib.methods.owl import block_outlier_ratios, outlier_ratio, owl_ratios, recentre
from fedlib.models import block_linears, prunable_layers
from fedlib.client import Pruning, prune_locally
from fedlib.runner import BlockRunner
from conftest import tiny_llama


def _ids(n=4, seqlen=24, seed=0):
    return torch.randint(0, 128, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def _block_sparsity(model, masks):
    per_block = {}
    for info in prunable_layers(model):
        pruned, total = per_block.get(info.block, (0, 0))
        per_block[info.block] = (pruned + int(masks[info.name].sum()), total + masks[info.name].numel())
    return {b: p / t for b, (p, t) in per_block.items()}


def _check_claimed_counts(model, result, group):
    """Every mask prunes exactly what its recorded ratio gives in its group."""
    for info in prunable_layers(model):
        ratio = result.layer_sparsity[info.name]
        assert int(result.masks[info.name].sum()) == expected_pruned(info.shape, ratio, group), info.name


# --------------------------------------------------------------------------------------- OWL


def test_owl_ratios_average_to_target_and_span_2_lambda():
    rng = np.random.default_rng(0)
    for _ in range(20):
        outliers = rng.uniform(0, 3, size=12)
        target, lam = rng.uniform(0.3, 0.8), rng.uniform(0.01, 0.1)
        ratios = owl_ratios(outliers, target, lam)
        assert ratios.mean() == pytest.approx(target, abs=1e-12)
        assert ratios.max() - ratios.min() == pytest.approx(2 * lam)
        assert ratios.min() >= target - 2 * lam - 1e-12 and ratios.max() <= target + 2 * lam + 1e-12
        # more outliers -> lower sparsity
        assert ratios[np.argmax(outliers)] == ratios.min()
        assert ratios[np.argmin(outliers)] == ratios.max()
    # symmetric outlier spread: the paper's [target - lam, target + lam]
    ratios = owl_ratios([0.0, 1.0, 2.0], 0.5, 0.08)
    np.testing.assert_allclose(ratios, [0.58, 0.5, 0.42])


def test_owl_ratios_degenerate_and_clipped():
    np.testing.assert_allclose(owl_ratios([1.0, 1.0, 1.0], 0.6, 0.08), [0.6] * 3)
    np.testing.assert_allclose(owl_ratios([0.0, 5.0], 0.6, 0.0), [0.6] * 2)
    # target below 2*lambda would go negative: clipped to [0, 1], mean still the target
    ratios = owl_ratios([0.0, 0.0, 0.0, 10.0], 0.1, 0.2)
    assert ratios.min() >= 0 and ratios.mean() == pytest.approx(0.1)
    # size-weighted mean
    ratios = recentre(np.array([0.2, 0.8]), np.array([3.0, 1.0]), 0.5)
    assert np.average(ratios, weights=[3, 1]) == pytest.approx(0.5)


def test_outlier_ratio_counts_above_m_times_mean():
    a = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    b = torch.tensor([[1.0, 1.0, 1.0, 13.0]])  # pooled mean = 20 / 8 = 2.5
    assert outlier_ratio([a, b], 5.0) == pytest.approx(1 / 8)
    assert outlier_ratio([a, b], 6.0) == 0.0


def test_owl_outliers_come_from_dense_propagation(model):
    """The plan measures every block on activations of the *dense* model (the reference's
    first pass), with the Wanda metric pooled over the block's linears."""
    ids = _ids()
    captured = {}
    hooks = [
        module.register_forward_hook(lambda _m, inp, _o, n=name: captured.__setitem__(n, inp[0]))
        for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
    ]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    blocks, outliers, sizes = block_outlier_ratios(model, ids, 1.5)
    for index, names in enumerate(blocks):
        metrics = []
        for name in names:
            x = captured[name].reshape(-1, captured[name].shape[-1]).double()
            weight = dict(model.named_modules())[name].weight.detach()
            metrics.append(weight.abs() * x.pow(2).mean(0).sqrt().float())
        assert outliers[index] == pytest.approx(outlier_ratio(metrics, 1.5))
        assert outliers[index] > 0
        assert sizes[index] == sum(m.numel() for m in metrics)


@pytest.mark.parametrize("group", ["row", "layer", "column"])
def test_owl_prunes_blocks_at_planned_ratios(group):
    model = tiny_llama(layers=4, hidden=64)
    ids = _ids()
    result = prune_locally(model, ids, Pruning("owl", 0.6, group, 0, options={"outlier_m": 1.5, "lam": 0.05}))
    _check_claimed_counts(model, result, group)
    per_block = {}
    for info in prunable_layers(model):
        per_block.setdefault(info.block, set()).add(result.layer_sparsity[info.name])
    assert all(len(ratios) == 1 for ratios in per_block.values())  # one ratio per block
    ratios = np.array([next(iter(r)) for r in per_block.values()])
    assert ratios.mean() == pytest.approx(0.6)
    assert ratios.max() - ratios.min() == pytest.approx(0.1)
    total = sum(m.numel() for m in result.masks.values())
    pruned = sum(int(m.sum()) for m in result.masks.values())
    assert abs(pruned / total - 0.6) < 0.02  # flooring per group only
    assert method_allocation("owl") == "nonuniform" and method_allocation("wanda") == "uniform"


def test_owl_with_lambda_zero_is_wanda(model):
    ids = _ids()
    owl = prune_locally(model, ids, Pruning("owl", 0.5, "row", 3, options={"lam": 0.0}))
    wanda = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 3))
    assert owl.masks.keys() == wanda.masks.keys()
    assert all(torch.equal(owl.masks[k], wanda.masks[k]) for k in owl.masks)


def test_owl_deterministic_and_rejects_bad_settings(model):
    ids = _ids()
    a = prune_locally(model, ids, Pruning("owl", 0.5, "row", 1, options={"outlier_m": 2}))
    b = prune_locally(model, ids, Pruning("owl", 0.5, "row", 1, options={"outlier_m": 2}))
    assert all(torch.equal(a.masks[k], b.masks[k]) for k in a.masks)
    with pytest.raises(ValueError, match="unstructured"):
        prune_locally(model, ids, Pruning("owl", 0.5, "2:4", 0))
    with pytest.raises(ValueError, match="unknown options"):
        prune_locally(model, ids, Pruning("owl", 0.5, "row", 0, options={"M": 5}))
    with pytest.raises(ValueError, match="needs calibration"):
        prune_locally(model, None, Pruning("owl", 0.5, "row", 0))


def test_nonuniform_mask_file_round_trip(model, tmp_path):
    ids = _ids()
    result = prune_locally(model, ids, Pruning("owl", 0.5, "layer", 0, options={"outlier_m": 1.5}))
    layers = prunable_layers(model)
    path = tmp_path / "owl.mask"
    write_mask_file(path, result.masks, layers, fingerprint="f", role="client", client_id="0",
                    method="owl", group="layer", sparsity=0.5,
                    allocation=method_allocation("owl"), n_samples=4)
    header = read_header(path, "f", layers)
    assert header.allocation == "nonuniform"
    assert {layer["name"]: layer["pruned"] for layer in header.layers} == {
        name: int(mask.sum()) for name, mask in result.masks.items()
    }


# -------------------------------------------------------------------------------------- BESA


def test_soft_mask_is_the_candidate_mixture():
    """P(pruned | rank j) = sum of the probabilities of candidates pruning rank j; the hard
    mask at sparsity s is Wanda's lowest floor(s * size) of each group."""
    torch.manual_seed(0)
    scores = torch.rand(5, 20)
    candidates = candidate_sparsities(0.1)
    assert candidates.numel() == 11 and candidates[-1] == 1.0 and candidates[0] == 0.0
    probs = torch.softmax(torch.randn(11), 0)
    for group in ("row", "layer", "column"):
        layer = _SparseLayer(torch.ones(5, 20), scores, group, candidates)
        ranks, size = ranks_in_group(scores, group)
        expected = torch.zeros(5, 20)
        for p, c in zip(probs, candidates):
            expected += p * (ranks < int(size * float(c) + 1e-9)).float()
        keep = layer.masked_weight(probs, 0.35)
        hard = prune_lowest(scores, 0.35, group, 0, "x")
        assert torch.equal(keep == 0, hard)  # forward value: the hard mask
        # backward: the gradient of the soft keep probability 1 - expected
        probs_var = probs.clone().requires_grad_(True)
        weights = torch.rand(5, 20)
        got = torch.autograd.grad((layer.masked_weight(probs_var, 0.35) * weights).sum(), probs_var)[0]
        probs_var2 = probs.clone().requires_grad_(True)
        direct = sum(probs_var2[i] * (ranks < int(size * float(c) + 1e-9)).float()
                     for i, c in enumerate(candidates))
        want = torch.autograd.grad(((1 - direct) * weights).sum(), probs_var2)[0]
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(1 - expected, 1 - direct.detach())


def test_tilted_init_has_target_mean():
    candidates = candidate_sparsities(0.01)
    for target in (0.5, 0.6, 0.8):
        probs = torch.softmax(tilted_logits(candidates, target).double(), 0)
        assert float(probs @ candidates) == pytest.approx(target, abs=1e-4)
    assert torch.allclose(tilted_logits(candidates, 0.5), torch.zeros(101), atol=1e-4)


@pytest.mark.parametrize("group", ["row", "layer", "column"])
def test_besa_keeps_every_block_at_target(group):
    model = tiny_llama(layers=3, hidden=64)
    result = prune_locally(model, _ids(), Pruning("besa", 0.6, group, 0, options={"steps": 8, "lr": 0.1}))
    _check_claimed_counts(model, result, group)
    sizes = {info.name: np.prod(info.shape) for info in prunable_layers(model)}
    for block in range(3):
        names = [i.name for i in prunable_layers(model) if i.block == block]
        ratios = np.array([result.layer_sparsity[n] for n in names])
        weights = np.array([sizes[n] for n in names], dtype=float)
        assert np.average(ratios, weights=weights) == pytest.approx(0.6, abs=1e-9)
        assert ratios.max() - ratios.min() > 1e-3  # actually non-uniform
    for block, actual in _block_sparsity(model, result.masks).items():
        assert 0.6 - 1 / 32 <= actual <= 0.6 + 1e-9, block  # floor per group only
    assert method_allocation("besa") == "nonuniform"


def test_besa_deterministic(model):
    ids = _ids()
    opts = {"steps": 5}
    a = prune_locally(model, ids, Pruning("besa", 0.5, "row", 2, options=opts))
    b = prune_locally(model, ids, Pruning("besa", 0.5, "row", 2, options=opts))
    assert a.layer_sparsity == b.layer_sparsity
    assert all(torch.equal(a.masks[k], b.masks[k]) for k in a.masks)


def test_besa_zero_steps_is_wanda(model):
    """Without learning the tilted start gives every layer the target: plain Wanda."""
    ids = _ids()
    besa = prune_locally(model, ids, Pruning("besa", 0.5, "row", 0, options={"steps": 0}))
    wanda = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0))
    assert all(torch.equal(besa.masks[k], wanda.masks[k]) for k in besa.masks)


def _block_setup(model, ids):
    """Block 0 resident with its Wanda scores: (step, linears by full name -> (local name,
    linear), scores)."""
    step = next(BlockRunner(model, [ids]).steps())
    pruners = {n: get_method("wanda")(lin, n) for n, lin in step.linears.items()}
    step.collect(0, pruners)
    prefix = f"{step.prefix}."
    linears = {n: (n[len(prefix):], lin) for n, lin in step.linears.items()}
    scores = {n: p.scores() for n, p in pruners.items()}
    return step, linears, scores


def test_besa_moves_sparsity_to_harmless_layers_and_lowers_error():
    """A block whose MLP output is scaled down 100x: pruning the MLP costs little, so BESA
    must prune the MLP more than the target and the attention values and output (which carry
    the block's whole update) less, and reconstruct the block's output better than uniform
    Wanda at the same block sparsity."""
    model = tiny_llama(layers=1, hidden=64)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(0.01)
    step, linears, scores = _block_setup(model, _ids(8, 32))
    target = 0.5
    alloc = learn_block_allocation(
        step.block, step.kwargs, step.inputs(0), linears, scores, target, "row",
        BESAOptions(steps=40, lr=0.1),
    )
    mlp = [n for n in alloc.sparsity if ".mlp." in n]
    values = [n for n in alloc.sparsity if n.endswith(("v_proj", "o_proj"))]
    assert min(alloc.sparsity[n] for n in mlp) > target > max(alloc.sparsity[n] for n in values)
    assert alloc.losses[-1] < alloc.losses[0]
    block_linear = block_linears(step.block)

    def error(ratios):
        masks = {linears[n][0]: prune_lowest(scores[n], ratios[n], "row", 0, n) for n in linears}
        return block_reconstruction_error(step.block, step.kwargs, step.inputs(0), block_linear, masks)

    uniform = error({n: target for n in linears})
    learned = error(alloc.sparsity)
    assert learned < 0.5 * uniform


def test_besa_leaves_model_unchanged_and_rejects_nm(model):
    before = copy.deepcopy(model.state_dict())
    prune_locally(model, _ids(), Pruning("besa", 0.5, "row", 0, options={"steps": 3}))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="unstructured"):
        prune_locally(model, _ids(), Pruning("besa", 0.5, "2:4", 0))
    with pytest.raises(ValueError, match="unknown options"):
        prune_locally(model, _ids(), Pruning("besa", 0.5, "row", 0, options={"epochs": 3}))
