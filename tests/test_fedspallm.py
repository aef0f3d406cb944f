"""FedSpaLLM: ℓ0 aggregation and mask expansion against explicit loops, exact sparsity, layer
sampling (coverage, determinism), the simulation driver against a brute-force composition of
local SparseGPT runs, and the weight file protocol."""

import copy
import itertools
import math

import pytest
import torch

from fedlib.federation import fedspallm_client, fedspallm_prune
from fedlib.groups import pruned_count
from fedlib.maskfile import MaskFileError, write_mask_file
from fedlib.models import fingerprint, linear_by_name, prunable_layers
from fedlib.client import Pruning, prune_locally
from fedlib.runner import BlockDecision
from fedlib.server import STRATEGIES, FedSpaLLM
from fedlib.baselines import random_masks
from fedlib.server.fedspallm import (
    aggregate_layer, blocks_per_round, expand_mask, sample_blocks, target_count, uncovered_blocks,
)
from fedlib.weightfile import WeightFile, apply_weight_file, apply_weights, open_weight_file, write_weight_file


def _ids(seed, n=2, seqlen=12):
    return torch.randint(0, 128, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def _random_uploads(n_clients, shape, sparsity, seed):
    gen = torch.Generator().manual_seed(seed)
    masks, weights = [], []
    for _ in range(n_clients):
        mask = torch.zeros(shape[0] * shape[1], dtype=torch.bool)
        mask[torch.randperm(mask.numel(), generator=gen)[: pruned_count(mask.numel(), sparsity)]] = True
        mask = mask.reshape(shape)
        weight = torch.randn(shape, generator=gen).masked_fill(mask, 0.0)
        masks.append(mask)
        weights.append(weight)
    return masks, weights


# --------------------------------------------------------------------------- aggregation


def test_l0_aggregation_against_explicit_loops():
    masks, weights = _random_uploads(4, (5, 7), 0.6, seed=0)
    masks[0][0, 0] = masks[1][0, 0] = masks[2][0, 0] = masks[3][0, 0] = True  # pruned by all
    weights = [w.masked_fill(m, 0.0) for w, m in zip(weights, masks)]
    weights[1][1, 1] = 0.0  # a kept weight whose value is 0 still counts as kept
    masks[1][1, 1] = False
    agg, mask, votes = aggregate_layer(weights, masks, 0.6, "layer", seed=0, name="x", rounding="ceil")
    for r, c in itertools.product(range(5), range(7)):
        kept = [float(weights[i][r, c]) for i in range(4) if not masks[i][r, c]]
        assert int(votes[r, c]) == 4 - len(kept)
        expected = sum(kept) / len(kept) if kept else 0.0
        if mask[r, c]:
            assert float(agg[r, c]) == 0.0
        else:
            assert float(agg[r, c]) == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert bool(mask[0, 0])


@pytest.mark.parametrize("group", ["layer", "row", "column"])
@pytest.mark.parametrize("sparsity,rounding", [(0.5, "ceil"), (0.7, "ceil"), (0.7, "floor"), (0.35, "ceil")])
def test_mask_expansion_against_explicit_loops(group, sparsity, rounding):
    n = 5
    masks, _ = _random_uploads(n, (6, 9), sparsity, seed=1)
    votes = sum(m.to(torch.int16) for m in masks)
    final = expand_mask(votes, n, sparsity, group, seed=2, name="x", rounding=rounding)
    groups = {"layer": [(votes.reshape(-1), final.reshape(-1))],
              "row": list(zip(votes, final)), "column": list(zip(votes.T, final.T))}[group]
    for v, f in groups:
        d = v.numel()
        target = math.ceil(sparsity * d - 1e-9) if rounding == "ceil" else math.floor(sparsity * d + 1e-9)
        all_pruned = [j for j in range(d) if v[j] == n]
        k = target - len(all_pruned)  # Eq. 7
        assert all(f[j] for j in all_pruned)
        chosen = [j for j in range(d) if f[j] and v[j] < n]
        assert len(chosen) == max(k, 0) and int(f.sum()) == max(target, len(all_pruned))
        # most agreed first: every added weight has at least the votes of every kept one
        kept = [int(v[j]) for j in range(d) if not f[j]]
        if chosen and kept:
            assert min(int(v[j]) for j in chosen) >= max(kept)


def test_mask_expansion_ties_are_seeded_and_exact_without_ties():
    votes = torch.tensor([[3, 2, 2, 1], [0, 1, 2, 3]], dtype=torch.int16)
    # target ceil(0.5 * 8) = 4: the two 3s, then two of the three 2s (tie)
    a = expand_mask(votes, 3, 0.5, "layer", seed=0, name="x")
    b = expand_mask(votes, 3, 0.5, "layer", seed=0, name="x")
    assert torch.equal(a, b) and int(a.sum()) == 4 and a[0, 0] and a[1, 3]
    picks = {tuple(expand_mask(votes, 3, 0.5, "layer", seed=s, name="x").reshape(-1).tolist()) for s in range(20)}
    assert len(picks) > 1  # the tie among the 2s is broken differently by different seeds
    # no tie at the threshold: the result is fully determined
    distinct = torch.tensor([[4, 3, 2, 1], [0, 0, 0, 0]], dtype=torch.int16)
    assert expand_mask(distinct, 4, 0.375, "layer", seed=9).tolist() == [[True, True, True, False], [False] * 4]
    with pytest.raises(ValueError, match="unstructured"):
        expand_mask(votes, 3, 0.5, "2:4")
    with pytest.raises(ValueError, match="outside"):
        expand_mask(votes, 2, 0.5)


def test_target_count_rounding():
    assert target_count(10, 0.7, "ceil") == 7 and target_count(10, 0.7, "floor") == 7
    assert target_count(1024, 0.7, "ceil") == 717 and target_count(1024, 0.7, "floor") == 716
    assert target_count(7, 0.0) == 0 and target_count(7, 1.0) == 7


# --------------------------------------------------------------------------- layer sampling


def test_blocks_per_round_is_proportional():
    assert blocks_per_round([1.0, 0.5, 0.25, 0.01], 30) == [30, 15, 8, 1]
    with pytest.raises(ValueError, match="fraction"):
        blocks_per_round([1.5], 30)


@pytest.mark.parametrize("n_blocks,counts", [(30, [8, 8, 8, 6]), (30, [3, 5, 2]), (7, [7]), (12, [1, 2, 3, 6, 4])])
def test_cyclic_sampling_covers_every_block(n_blocks, counts):
    K = sum(counts)
    rounds = math.ceil(n_blocks / K) + 2
    for seed in range(5):
        plan = sample_blocks(n_blocks, counts, rounds, seed)
        assert plan == sample_blocks(n_blocks, counts, rounds, seed)  # deterministic
        for row in plan:
            for blocks, k in zip(row, counts):
                assert len(set(blocks)) == len(blocks) == k and all(0 <= b < n_blocks for b in blocks)
            if K >= n_blocks:  # the paper's condition: every block in every round
                assert {b for blocks in row for b in blocks} == set(range(n_blocks))
        # sum(k_i) * T >= L: every block within ceil(L / K) consecutive rounds
        window = math.ceil(n_blocks / K)
        for t in range(rounds - window + 1):
            assert uncovered_blocks(plan[t : t + window], n_blocks) == []
    if max(counts) < n_blocks:
        assert sample_blocks(n_blocks, counts, rounds, 0) != sample_blocks(n_blocks, counts, rounds, 1)


def test_sampling_is_uniform_per_client():
    n_blocks, counts, freq = 6, [2, 3], torch.zeros(2, 6)
    for seed in range(600):
        for c, blocks in enumerate(sample_blocks(n_blocks, counts, 1, seed)[0]):
            freq[c, blocks] += 1
    expected = torch.tensor([[2 / 6 * 600], [3 / 6 * 600]])
    assert ((freq - expected).abs() / expected).max() < 0.2


def test_independent_sampler_is_seeded_and_may_miss_blocks():
    a = sample_blocks(10, [3, 3, 4], 4, seed=0, sampler="independent")
    assert a == sample_blocks(10, [3, 3, 4], 4, seed=0, sampler="independent")
    missed = sum(bool(uncovered_blocks([row], 10)) for s in range(50)
                 for row in sample_blocks(10, [3, 3, 4], 1, s, "independent"))
    assert missed > 0  # literal Algorithm 1 gives no per-round coverage guarantee


def test_strategy_assignments_and_configure():
    assert STRATEGIES["fedspallm"] is FedSpaLLM
    s = FedSpaLLM(sparsity=0.6, seed=3, rounds=2, resources=(0.5, 0.25, 0.25))
    plan = s.assignments(3, 8)
    assert [len(b) for b in plan[0]] == [4, 2, 2] and uncovered_blocks(plan[:1], 8) == []
    config = s.configure_round(1, n_clients=3, n_blocks=8)
    assert [list(b) for b in config.blocks] == plan[1] and config.send == "weights+mask" and config.round == 1
    with pytest.raises(ValueError, match="round 2 outside 0..1"):
        s.configure_round(2, 3, 8)
    full = FedSpaLLM().assignments(2, 3)
    assert full == [[[0, 1, 2], [0, 1, 2]]]


# --------------------------------------------------------------------------- the driver


def test_one_client_one_round_is_local_sparsegpt(model):
    ids = _ids(0, n=3)
    local = prune_locally(model, ids, Pruning("sparsegpt_update", 0.5, "layer", 0))
    result = fedspallm_prune(model, [ids], FedSpaLLM(sparsity=0.5, seed=0))
    assert result.masks.keys() == local.masks.keys() and result.uncovered == []
    for name in local.masks:
        assert torch.equal(result.masks[name], local.masks[name]), name
        assert torch.equal(result.weights[name], local.weights[name]), name


def _aggregate_all(uploads, sparsity, rounding="ceil"):
    out = {}
    for name in uploads[0].masks:
        out[name] = aggregate_layer([u.weights[name] for u in uploads], [u.masks[name] for u in uploads],
                                    sparsity, "layer", 0, name, rounding)
    return out


def test_two_rounds_against_brute_force(model):
    """Round 1: every client runs SparseGPT on the dense model (its Standalone model); the server
    aggregates. Round 2: every client prunes the round-1 global model."""
    clients = [_ids(10 + i) for i in range(3)]
    standalone = [BlockDecision(masks={}) for _ in clients]

    def keep(t, c, _block, up):
        if t == 0:
            standalone[c].masks.update(up.masks)

    result = fedspallm_prune(model, clients, FedSpaLLM(sparsity=0.7, seed=0, rounds=2), on_upload=keep)
    own = Pruning("sparsegpt_update", 0.7, "layer", 0)  # each client's own model (Standalone)
    round1 = _aggregate_all([prune_locally(model, ids, own) for ids in clients], 0.7)
    for up, ids in zip(standalone, clients):
        ref = prune_locally(model, ids, own)
        assert all(torch.equal(up.masks[k], ref.masks[k]) for k in ref.masks)
    start = copy.deepcopy(model)
    apply_weights(start, {k: v[0] for k, v in round1.items()})
    round2 = _aggregate_all([prune_locally(start, ids, own) for ids in clients], 0.7)
    for name, (weight, mask, votes) in round2.items():
        assert torch.equal(result.masks[name], mask), name
        assert torch.equal(result.votes[name], votes), name
        torch.testing.assert_close(result.weights[name], weight, rtol=1e-5, atol=1e-6)
        # Eq. 7's ceil: 0.7 x 1024 = 716.8 -> 717 pruned (each client prunes 716)
        assert int(mask.sum()) == target_count(mask.numel(), 0.7, "ceil")
    # uploads: float32 weights + packed masks of 9216 weights per block, 2 blocks, 3 clients
    assert [r.bytes_up for r in result.rounds] == [3 * 2 * (9216 * 4 + 9216 // 8)] * 2
    # round 0 needs no download (dense blocks are cached), round 1 gets the aggregated blocks
    assert [r.bytes_down for r in result.rounds] == [0, result.rounds[1].bytes_up]


def test_client_prunes_from_global_weights_and_dense_unsampled_blocks(model):
    ids = _ids(3)
    layers = prunable_layers(model)
    gen = torch.Generator().manual_seed(0)
    gweights = {i.name: torch.randn(i.shape, generator=gen) * 0.1 for i in layers}
    gmasks = {i.name: torch.rand(i.shape, generator=gen) < 0.3 for i in layers}
    up = fedspallm_client(model, ids, [0, 1], Pruning("sparsegpt_update", 0.5, "layer", 0), global_weights=gweights,
                          global_masks=gmasks)
    ref_model = copy.deepcopy(model)
    apply_weights(ref_model, {k: v.masked_fill(gmasks[k], 0.0) for k, v in gweights.items()})
    ref = prune_locally(ref_model, ids, Pruning("sparsegpt_update", 0.5, "layer", 0))
    for k in ref.masks:
        assert torch.equal(up.masks[k], ref.masks[k])
        assert torch.equal(up.weights[k], ref.weights[k])
    # only block 1 sampled: its inputs come through the *dense* block 0 (Eq. 9)
    only1 = fedspallm_client(model, ids, [1], Pruning("sparsegpt_update", 0.5, "layer", 0))
    full = prune_locally(model, ids, Pruning("sparsegpt_update", 0.5, "layer", 0))
    assert set(only1.masks) == {i.name for i in layers if i.block == 1}
    dense_in = _block1_from_dense_inputs(model, ids)
    for k, mask in only1.masks.items():
        assert torch.equal(mask, dense_in[k])
    assert any(not torch.equal(only1.masks[k], full.masks[k]) for k in only1.masks)


def _block1_from_dense_inputs(model, ids):
    from fedlib.methods import get_method
    from fedlib.client import decide_block
    from fedlib.runner import BlockRunner

    for step in BlockRunner(model, [ids]).steps():
        if step.index == 0:
            step.propagate(0, None)
            continue
        pruners = {n: get_method("sparsegpt_update")(lin, n) for n, lin in step.linears.items()}
        step.collect(0, pruners)
        return decide_block(pruners, 0.5, "layer", 0).masks


def test_sampling_rounds_update_only_sampled_blocks(model):
    clients = [_ids(20 + i) for i in range(2)]
    strategy = FedSpaLLM(sparsity=0.5, seed=1, rounds=1, resources=(0.5, 0.5))
    plan = strategy.assignments(2, 2)
    result = fedspallm_prune(model, clients, strategy)
    # each block was pruned by exactly one client: the global block is that client's block
    for c, blocks in enumerate(plan[0]):
        up = fedspallm_client(model, clients[c], blocks, Pruning("sparsegpt_update", 0.5, "layer", 1))
        for k in up.masks:
            assert torch.equal(result.masks[k], up.masks[k])
            assert torch.equal(result.weights[k], up.weights[k])
    lonely = FedSpaLLM(sparsity=0.5, seed=1, rounds=1, resources=(0.5,))
    with pytest.raises(ValueError, match="sampled by no client"):
        fedspallm_prune(model, clients[:1], lonely)
    partial = fedspallm_prune(model, clients[:1], lonely, allow_uncovered=True)
    assert len(partial.uncovered) == 1
    assert {int(k.split(".")[2]) for k in partial.weights} == {1 - partial.uncovered[0]}


def test_random_baseline():
    from fedlib.models import LayerInfo

    layers = [LayerInfo("a", (8, 16), 0), LayerInfo("b", (16, 8), 0)]
    a = random_masks(layers, 0.6, seed=0)
    assert all(int(m.sum()) == pruned_count(m.numel(), 0.6) for m in a.values())
    assert all(torch.equal(a[k], random_masks(layers, 0.6, seed=0)[k]) for k in a)
    assert not torch.equal(a["a"], random_masks(layers, 0.6, seed=1)["a"])
    rows = random_masks(layers, 0.5, seed=0, group="row")
    assert (rows["a"].sum(1) == 8).all()


# --------------------------------------------------------------------------- weight files


def _upload_files(model, tmp_path, clients, strategy, plan, dtype="float32"):
    layers, fp = prunable_layers(model), fingerprint(model)
    paths = []
    for c, (ids, blocks) in enumerate(zip(clients, plan)):
        up = fedspallm_client(model, ids, blocks,
                              Pruning("sparsegpt_update", strategy.sparsity, "layer", strategy.seed))
        subset = [i for i in layers if i.block in blocks]
        path = tmp_path / f"client_{c}.weights.safetensors"
        write_weight_file(path, up.masks, up.weights, subset, fingerprint=fp, role="client",
                          client_id=str(c), method="sparsegpt_update", group="layer",
                          sparsity=strategy.sparsity, n_samples=ids.shape[0], weight_dtype=dtype)
        paths.append(path)
    return paths


def test_file_aggregation_equals_simulation(model, tmp_path):
    clients = [_ids(40 + i) for i in range(3)]
    strategy = FedSpaLLM(sparsity=0.7, seed=0)
    plan = strategy.assignments(3, 2)[0]
    paths = _upload_files(model, tmp_path, clients, strategy, plan)
    out = tmp_path / "global.weights.safetensors"
    summary = strategy.aggregate(paths, fingerprint(model), prunable_layers(model), out, round_index=0, assigned=plan)
    assert summary["uncovered_blocks"] == [] and summary["n_clients"] == 3
    # the outlier report (fedlib.server.robust) covers every client over the blocks it sent
    report = summary["clients"]
    sent = {str(c): sum(i.shape[0] * i.shape[1] for i in prunable_layers(model) if i.block in blocks)
            for c, blocks in enumerate(plan)}
    assert {c["client_id"]: c["weights_compared"] for c in report["clients"]} == sent and report["n_used"] == 3
    result = fedspallm_prune(model, clients, strategy)
    wf = WeightFile(out, fingerprint(model), prunable_layers(model))
    assert wf.header.role == "global" and wf.header.allocation == "nonuniform"  # ceil(0.7 d) > floor
    for name in result.masks:
        assert torch.equal(wf.layer_mask(name), result.masks[name])
        assert torch.equal(wf.layer_weight(name), result.weights[name])
        assert torch.equal(wf.layer_votes(name), result.votes[name].to(torch.int32))
    pruned = copy.deepcopy(model)
    apply_weight_file(pruned, out, fingerprint(model))
    for name, weight in result.weights.items():
        assert torch.equal(linear_by_name(pruned, name).weight.detach(), weight)


def test_partial_uploads_and_previous_round(model, tmp_path):
    clients = [_ids(50 + i) for i in range(2)]
    strategy = FedSpaLLM(sparsity=0.5, seed=0, rounds=2, resources=(0.5, 0.5))
    layers, fp = prunable_layers(model), fingerprint(model)
    plan = strategy.assignments(2, 2)
    # round 0 with only client 0's upload: one block aggregated, the other not yet
    p0 = _upload_files(model, tmp_path, clients[:1], strategy, plan[0][:1], dtype="float16")
    g0 = tmp_path / "g0.safetensors"
    s0 = strategy.aggregate(p0, fp, layers, g0, round_index=0)
    assert s0["uncovered_blocks"] == [b for b in range(2) if b not in plan[0][0]]
    other = [b for b in range(2) if b not in plan[0][0]]
    (tmp_path / "r1").mkdir()
    p1 = _upload_files(model, tmp_path / "r1", clients[1:], strategy, [other])
    g1 = tmp_path / "g1.safetensors"
    s1 = strategy.aggregate(p1, fp, layers, g1, previous=g0, round_index=0)
    assert s1["uncovered_blocks"] == []
    first, second = open_weight_file(g0, fp, layers), open_weight_file(g1, fp, layers)
    for name in first.layer_names:  # carried over unchanged
        assert torch.equal(first.layer_weight(name), second.layer_weight(name))
    # float16 uploads: what the server aggregated is the float16 value
    up = open_weight_file(p0[0], fp, layers)
    assert up.weight_dtype == torch.float16 and up.blocks(layers) == plan[0][0]
    name = up.layer_names[0]
    assert torch.equal(first.layer_weight(name), up.layer_weight(name))


def test_weight_file_errors_name_file_and_field(model, tmp_path):
    clients = [_ids(60)]
    strategy = FedSpaLLM(sparsity=0.5, seed=0)
    layers, fp = prunable_layers(model), fingerprint(model)
    (path,) = _upload_files(model, tmp_path, clients, strategy, [[0, 1]])
    out = tmp_path / "g.safetensors"
    with pytest.raises(MaskFileError, match=r"client_0.*'layers'.*assigned"):
        strategy.aggregate([path], fp, layers, out, assigned=[[0]])
    with pytest.raises(MaskFileError, match=r"'x_round'"):
        strategy.aggregate([path], fp, layers, out, round_index=3)
    with pytest.raises(MaskFileError, match="client_id"):
        strategy.aggregate([path, path], fp, layers, out)
    from conftest import tiny_llama
    other = tiny_llama(seed=7)
    with pytest.raises(MaskFileError, match="model_fingerprint"):
        open_weight_file(path, fingerprint(other), layers)
    # a plain mask file is not a weight file
    masks = prune_locally(model, clients[0], Pruning("wanda", 0.5, "row", 0)).masks
    plain = tmp_path / "plain.mask.safetensors"
    write_mask_file(plain, masks, layers, fingerprint=fp, role="client", client_id="9",
                    method="wanda", group="row", sparsity=0.5)
    with pytest.raises(MaskFileError, match=r"plain.mask.safetensors.*'x_payload'"):
        open_weight_file(plain, fp, layers)
    # nor is an upload a FedPrLLM client's mask file
    from fedlib.server import FedPrLLM
    with pytest.raises(MaskFileError, match=r"client_0.*'x_payload': fedprllm clients send mask, this file holds weights"):
        FedPrLLM().aggregate([path], fp, layers, out)
    # nonzero weights where the mask prunes
    up = fedspallm_client(model, clients[0], [0, 1], Pruning("sparsegpt_update", 0.5, "layer", 0))
    bad = tmp_path / "bad.safetensors"
    write_weight_file(bad, up.masks, up.weights, layers, fingerprint=fp, role="client", client_id="1",
                      method="sparsegpt_update", group="layer", sparsity=0.5)
    from safetensors import safe_open
    from fedlib.io import write_safetensors
    with safe_open(str(bad), "pt") as h:
        tensors = {k: h.get_tensor(k) for k in h.keys()}
        meta = h.metadata()
    key = f"weight:{layers[0].name}"
    tensors[key] = tensors[key] + 1.0
    write_safetensors(bad, tensors, meta)
    with pytest.raises(MaskFileError, match=rf"bad.safetensors.*'{key}'.*not \+0.0 where the mask prunes"):
        open_weight_file(bad, fp, layers).layer_weight(layers[0].name)
    tensors[key] = -(tensors[key] - 1.0)  # the upload negated: -0.0 where pruned, not what the writer stores
    write_safetensors(bad, tensors, meta)
    with pytest.raises(MaskFileError, match=rf"'{key}'.*not \+0.0"):
        open_weight_file(bad, fp, layers).layer_weight(layers[0].name)
    tensors[key] = tensors[key].half()
    write_safetensors(bad, tensors, meta)
    with pytest.raises(MaskFileError, match=rf"'{key}'.*expected .*'F32'"):
        open_weight_file(bad, fp, layers)
    # a half block is refused
    half = tmp_path / "half.safetensors"
    one = [layers[0]]
    write_weight_file(half, {one[0].name: up.masks[one[0].name]}, up.weights, one, fingerprint=fp,
                      role="client", client_id="2", method="sparsegpt_update", group="layer", sparsity=0.5)
    with pytest.raises(MaskFileError, match="'layers'"):
        open_weight_file(half, fp, layers)
    with pytest.raises(ValueError, match="weight_dtype"):
        write_weight_file(half, up.masks, up.weights, one, fingerprint=fp, role="client", client_id="2",
                          method="m", group="layer", sparsity=0.5, weight_dtype="bfloat16")
