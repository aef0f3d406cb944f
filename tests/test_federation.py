"""FedPrLLM one-shot and iterative drivers against local pruning and a brute-force reference,
and the communication accounting (mask bytes and the paper's Table 3 convention)."""

import copy

import pytest
import torch

from fedlib.federation import (
    communication_cost, iterative_prune, one_shot_prune, packed_bytes,
)
from fedlib.groups import prune_lowest
from fedlib.maskfile import MaskFile, write_mask_file
from fedlib.models import LayerInfo, fingerprint, linear_by_name, prunable_layers
from fedlib.client import Pruning, prune_locally
from fedlib.server import FedPrLLM
from fedlib.server.fedprllm import global_mask_from_votes, scale_factors


def _ids(seed, n=2, seqlen=12):
    return torch.randint(0, 128, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def _equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("method,group", [("wanda", "row"), ("wanda", "layer"), ("sparsegpt", "layer")])
def test_one_client_iterative_equals_local_pruning(model, method, group):
    ids = _ids(0, n=3)
    local = prune_locally(model, ids, Pruning(method, 0.5, group, 3, batch_size=2))
    result = iterative_prune(model, [ids], Pruning(method, 0.5, group, 3, batch_size=2), group)
    _equal(result.masks, local.masks)
    assert all(torch.equal(result.votes[k], local.masks[k].to(torch.int16)) for k in local.masks)


def test_identical_clients_iterative_equals_local_pruning(model):
    ids = _ids(1)
    local = prune_locally(model, ids, Pruning("wanda", 0.6, "row", 0))
    result = iterative_prune(model, [ids, ids.clone(), ids.clone()], Pruning("wanda", 0.6, "row", 0), "row")
    _equal(result.masks, local.masks)
    assert all(set(v.unique().tolist()) <= {0, 3} for v in result.votes.values())


def _inputs_of_linears(model, ids):
    captured = {}
    handles = [
        m.register_forward_hook(lambda _m, inp, _o, n=name: captured.__setitem__(n, inp[0].detach()))
        for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    ]
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return captured


@pytest.mark.parametrize("scale", [False, True])
def test_iterative_against_brute_force(model, scale):
    """Block l's client statistics come from full forwards of the model with the *global*
    masks (and scaling) of blocks < l applied; the server takes the top-k of the vote sum."""
    clients = [_ids(10 + i, n=2, seqlen=10) for i in range(3)]
    result = iterative_prune(model, clients, Pruning("wanda", 0.5, "row", 5), "layer", scale=scale,
                             keep_round_masks=True)
    layers = prunable_layers(model)
    current = copy.deepcopy(model)
    for block in range(2):
        infos = [i for i in layers if i.block == block]
        votes = {i.name: torch.zeros(i.shape, dtype=torch.int16) for i in infos}
        for c, ids in enumerate(clients):
            inputs = _inputs_of_linears(current, ids)
            for info in infos:
                x = inputs[info.name].reshape(-1, info.shape[1]).double()
                weight = linear_by_name(model, info.name).weight.detach()
                scores = weight.abs() * x.pow(2).mean(0).sqrt().float()
                local = prune_lowest(scores, 0.5, "row", 5, info.name)
                assert torch.equal(local, result.rounds[block].client_masks[c][info.name])
                votes[info.name] += local.to(torch.int16)
        for info in infos:
            final = global_mask_from_votes(votes[info.name], 0.5, "layer", 5, info.name)
            assert torch.equal(final, result.masks[info.name])
            assert torch.equal(votes[info.name], result.votes[info.name])
            with torch.no_grad():
                w = linear_by_name(current, info.name).weight
                w[final] = 0
                if scale:
                    w.mul_(scale_factors(votes[info.name], 3))
    # the base model is untouched
    assert fingerprint(model) == fingerprint(copy.deepcopy(model))
    assert all((linear_by_name(model, i.name).weight != 0).all() for i in layers)


def test_one_shot_driver_matches_the_file_protocol(model, tmp_path):
    clients = [_ids(20 + i) for i in range(3)]
    result = one_shot_prune(model, clients, Pruning("wanda", 0.5, "row", 0), "layer", keep_client_masks=True)
    layers, fp = prunable_layers(model), fingerprint(model)
    paths = []
    for i, ids in enumerate(clients):
        local = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0)).masks
        _equal(local, result.rounds[0].client_masks[i])
        path = tmp_path / f"c{i}.mask.safetensors"
        write_mask_file(path, local, layers, fingerprint=fp, role="client", client_id=str(i),
                        method="wanda", group="row", sparsity=0.5, n_samples=2, seed=0)
        paths.append(path)
    out = tmp_path / "global.mask.safetensors"
    FedPrLLM(group="layer", sparsity=0.5, seed=0).aggregate(paths, fp, layers, out)
    _equal(MaskFile(out).masks(), result.masks)


def test_iterative_bytes_per_round(model):
    clients = [_ids(i) for i in range(3)]
    result = iterative_prune(model, clients, Pruning("wanda", 0.5, "row", 0), "layer")
    layers = prunable_layers(model)
    assert len(result.rounds) == 2
    for record in result.rounds:
        block = [i for i in layers if i.block == record.blocks[0]]
        mask_bytes = sum(packed_bytes(i.shape[0] * i.shape[1]) for i in block)
        # explicit: q(32x32) k,v(16x32) o(32x32) gate,up(64x32) down(32x64) -> bits / 8
        assert mask_bytes == (1024 + 512 + 512 + 1024 + 2048 + 2048 + 2048) // 8
        assert record.bytes_up == 3 * mask_bytes and record.bytes_down == 3 * mask_bytes
        assert record.parameters_up == record.parameters_down == 3 * mask_bytes * 8
    expected = communication_cost(layers, 3, "iterative")
    assert [(r.bytes_up, r.bytes_down) for r in expected.rounds] == [(r.bytes_up, r.bytes_down) for r in result.rounds]
    scaled = iterative_prune(model, clients, Pruning("wanda", 0.5, "row", 0), "layer", scale=True)
    # the broadcast then also carries one byte of votes per weight
    assert scaled.rounds[0].bytes_down == 3 * (mask_bytes + mask_bytes * 8)


def test_communication_cost_paper_convention_and_packed_bytes():
    # LLaMA-7B: 32 blocks of q,k,v,o (4096x4096), gate, up (11008x4096), down (4096x11008)
    layers = []
    for b in range(32):
        layers += [LayerInfo(f"{b}.{n}", (4096, 4096), b) for n in "qkvo"]
        layers += [LayerInfo(f"{b}.g", (11008, 4096), b), LayerInfo(f"{b}.u", (11008, 4096), b),
                   LayerInfo(f"{b}.d", (4096, 11008), b)]
    one = communication_cost(layers, 64, "one-shot")
    it = communication_cost(layers, 64, "iterative")
    assert one.paper_parameters_per_client == 6_476_005_376  # Table 3: 6.476B
    assert it.paper_parameters_per_client == 2 * 6_476_005_376  # Table 3: 12.952B
    assert len(one.rounds) == 1 and len(it.rounds) == 32
    assert one.bytes_up == it.bytes_up == 64 * 6_476_005_376 // 8
    assert one.bytes_down == 0 and it.bytes_down == it.bytes_up
    odd = [LayerInfo("x", (3, 3), 0)]  # 9 bits -> 2 bytes
    assert communication_cost(odd, 2, "one-shot").bytes_up == 4
    with pytest.raises(ValueError, match="mode"):
        communication_cost(odd, 2, "sometimes")


def test_iterative_differs_from_one_shot_but_both_exact_sparsity(model):
    clients = [_ids(30 + i) for i in range(4)]
    one = one_shot_prune(model, clients, Pruning("wanda", 0.5, "row", 0), "layer")
    it = iterative_prune(model, clients, Pruning("wanda", 0.5, "row", 0), "layer")
    for res in (one, it):
        for name, mask in res.masks.items():
            assert int(mask.sum()) == mask.numel() // 2
    # block 0 sees the same (dense) inputs in both modes, so its votes agree
    for name in one.masks:
        if ".0." in name:
            assert torch.equal(one.votes[name], it.votes[name])
    # block 1 does not: its clients' inputs went through their own masks vs the global ones
    assert any(not torch.equal(one.votes[n], it.votes[n]) for n in one.masks if ".1." in n)


def test_magnitude_needs_no_data_and_mapping_sparsity(model):
    layers = prunable_layers(model)
    ratios = {info.name: (0.5 if info.block == 0 else 0.75) for info in layers}
    result = iterative_prune(model, [None, None], Pruning("magnitude", ratios, "layer", 0), "layer")
    local = prune_locally(model, None, Pruning("magnitude", ratios, "layer", 0))
    _equal(result.masks, local.masks)
    with pytest.raises(ValueError, match="calibration"):
        iterative_prune(model, [None], Pruning("wanda", 0.5, "row", 0), "row")
    with pytest.raises(ValueError, match="at least one client"):
        iterative_prune(model, [], Pruning("wanda", 0.5, "row", 0), "row")


@pytest.mark.parametrize("method,options", [("owl", {"outlier_m": 1.5, "lam": 0.05}), ("besa", {"steps": 3, "lr": 0.1})])
def test_nonuniform_methods_iterative_one_client_equals_local(model, method, options):
    """OWL plans on the client's data, BESA allocates per block on the client's activations;
    the server prunes each layer at the clients' mean ratio, so one client = local pruning."""
    ids = _ids(7, n=3)
    local = prune_locally(model, ids, Pruning(method, 0.6, "row", 0, options=options))
    assert len(set(local.layer_sparsity.values())) > 1  # really non-uniform
    # the server follows the client's allocation on its own (the mean of one client's fractions)
    result = iterative_prune(model, [ids], Pruning(method, 0.6, "row", 0, options=options), "row")
    _equal(result.masks, local.masks)
    _equal(one_shot_prune(model, [ids], Pruning(method, 0.6, "row", 0, options=options), "row").masks, local.masks)
    # an explicit server target overrides it: uniform 0.6 is not the client's plan
    uniform = iterative_prune(model, [ids], Pruning(method, 0.6, "row", 0, options=options), "row", server_sparsity=0.6)
    assert any(not torch.equal(uniform.masks[k], local.masks[k]) for k in local.masks)
