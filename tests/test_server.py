"""FedPrLLM aggregation against brute force, scaling against FedAvg, and the server's checks."""

import pytest
import torch

from fedlib.maskfile import MaskFile, MaskFileError, write_mask_file
from fedlib.models import fingerprint, linear_by_name, prunable_layers
from fedlib.pruned import apply_mask_file
from fedlib.client import Pruning, prune_locally
from fedlib.server import FedPrLLM

from conftest import tiny_llama


def _clients(model, tmp_path, n=5, group="row", method="wanda", sparsity=0.5, first=0):
    paths, masks = [], []
    for i in range(first, first + n):
        ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(i))
        result = prune_locally(model, ids, Pruning(method, sparsity, group, 0)).masks
        path = tmp_path / f"client_{i}.mask.safetensors"
        write_mask_file(path, result, prunable_layers(model), fingerprint=fingerprint(model),
                        role="client", client_id=str(i), method=method, group=group,
                        sparsity=sparsity, n_samples=2, seed=0)
        paths.append(path)
        masks.append(result)
    return paths, masks


@pytest.mark.parametrize("group", ["layer", "row", "column"])
def test_top_k_of_votes_per_group(model, tmp_path, group):
    paths, masks = _clients(model, tmp_path)
    out = tmp_path / f"global_{group}.mask.safetensors"
    FedPrLLM(group=group, sparsity=0.5, seed=0).aggregate(paths, fingerprint(model), prunable_layers(model), out)
    result = MaskFile(out, fingerprint(model), prunable_layers(model))
    assert result.header.role == "global" and result.header.n_clients == 5
    for info in prunable_layers(model):
        votes = sum(m[info.name].int() for m in masks)
        assert torch.equal(result.layer_votes(info.name), votes)
        final = result.layer_mask(info.name)
        # brute force: within every group, each pruned weight has at least as many votes
        # as every kept one, and the group prunes exactly floor(size * 0.5)
        if group == "layer":
            pairs = [(votes.reshape(-1), final.reshape(-1))]
        elif group == "row":
            pairs = list(zip(votes, final))
        else:
            pairs = list(zip(votes.T, final.T))
        for v, f in pairs:
            assert int(f.sum()) == v.numel() // 2
            assert v[f].min() >= v[~f].max()


def test_scaling_equals_fedavg_of_locally_pruned_weights(model, tmp_path):
    paths, masks = _clients(model, tmp_path, n=4)
    out = tmp_path / "global.mask.safetensors"
    FedPrLLM(group="layer", sparsity=0.5, seed=0).aggregate(paths, fingerprint(model), prunable_layers(model), out)
    base = {info.name: linear_by_name(model, info.name).weight.detach().clone() for info in prunable_layers(model)}
    final = MaskFile(out).masks()
    scaled = tiny_llama()
    apply_mask_file(scaled, out, scale=True)
    for name, weight in base.items():
        fedavg = sum(weight * (~m[name]) for m in masks) / len(masks)  # mean of the clients' pruned weights
        expected = torch.where(final[name], torch.zeros_like(weight), fedavg)
        torch.testing.assert_close(linear_by_name(scaled, name).weight.detach(), expected)


def test_single_client_global_mask_is_its_own_mask(model, tmp_path):
    paths, masks = _clients(model, tmp_path, n=1)
    out = tmp_path / "global.mask.safetensors"
    FedPrLLM(group="row", sparsity=0.5, seed=0).aggregate(paths, fingerprint(model), prunable_layers(model), out)
    final = MaskFile(out).masks()
    assert all(torch.equal(final[k], masks[0][k]) for k in final)


def test_nonuniform_clients_keep_their_allocation(model, tmp_path):
    """OWL clients: the server prunes each layer at the mean of the clients' pruned fractions
    (not the uniform target), still the most-voted weights first."""
    paths, masks = [], []
    for i in range(3):
        ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(i))
        owl = Pruning("owl", 0.6, "layer", 0, options={"outlier_m": 1.5, "lam": 0.1})
        result = prune_locally(model, ids, owl).masks
        paths.append(tmp_path / f"owl_{i}.mask.safetensors")
        write_mask_file(paths[-1], result, prunable_layers(model), fingerprint=fingerprint(model),
                        role="client", client_id=str(i), method="owl", group="layer", sparsity=0.6,
                        allocation="nonuniform", n_samples=2, seed=0)
        masks.append(result)
    out = tmp_path / "global.mask.safetensors"
    FedPrLLM(group="layer", sparsity=0.6, seed=0).aggregate(paths, fingerprint(model), prunable_layers(model), out)
    result = MaskFile(out, fingerprint(model), prunable_layers(model))
    assert result.header.allocation == "nonuniform"
    counts = set()
    for info in prunable_layers(model):
        client_pruned = [int(m[info.name].sum()) for m in masks]
        final, votes = result.layer_mask(info.name).reshape(-1), sum(m[info.name].int() for m in masks).reshape(-1)
        assert int(final.sum()) == sum(client_pruned) // 3  # mean of the clients' counts (floor)
        assert votes[final].min() >= votes[~final].max()
        counts.add(int(final.sum()))
    assert len(counts) > 1  # really non-uniform across layers


def test_refuses_bad_client_sets(model, tmp_path):
    paths, _ = _clients(model, tmp_path, n=2)
    out = tmp_path / "global.mask.safetensors"
    out.write_text("previous result")
    strategy = FedPrLLM(group="layer", sparsity=0.5, seed=0)
    with pytest.raises(MaskFileError, match="client_id"):
        strategy.aggregate([paths[0], paths[0]], fingerprint(model), prunable_layers(model), out)
    other = tiny_llama(seed=7)
    with pytest.raises(MaskFileError, match="model_fingerprint"):
        strategy.aggregate(paths, fingerprint(other), prunable_layers(other), out)
    truncated = tmp_path / "client_9.mask.safetensors"
    truncated.write_bytes(paths[1].read_bytes()[:-100])
    with pytest.raises(MaskFileError):
        strategy.aggregate([paths[0], truncated], fingerprint(model), prunable_layers(model), out)
    assert out.read_text() == "previous result"  # nothing overwritten on failure


@pytest.mark.parametrize("other", [dict(method="magnitude"), dict(group="column"), dict(sparsity=0.7)])
def test_refuses_a_mixed_cohort(model, tmp_path, other):
    """Clients that pruned differently (another method, group or sparsity) are not one cohort:
    the majority defines it wherever the odd file is in the list; the error names the odd
    file, the field and both values; nothing is written."""
    paths, _ = _clients(model, tmp_path, n=2)
    odd, _ = _clients(model, tmp_path, n=1, first=2, **other)
    out = tmp_path / "global.mask.safetensors"
    (field, value), = other.items()
    for order in (odd + paths, paths + odd):
        with pytest.raises(MaskFileError, match=rf"{odd[0]}: field '{field}': {value!r}, but 2 of the 3 clients "
                                                rf"\(e.g. {paths[0]}\) have") as error:
            FedPrLLM(group="layer", sparsity=0.5, seed=0).aggregate(order, fingerprint(model),
                                                                   prunable_layers(model), out)
        assert error.value.field == field and error.value.path == str(odd[0]) and not out.exists()


@pytest.mark.parametrize("tied", [False, True])
def test_server_opens_the_model_without_reading_a_tensor(tmp_path, tied):
    """`fedlib aggregate` needs only the fingerprint and the layer list: opened with
    weights=False nothing is read (no parameter holds data), and both equal the full open's."""
    from fedlib.models import open_model

    model = tiny_llama(layers=3)
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(tmp_path, max_shard_size="20KB")  # shards + index
    bare, full = open_model(str(tmp_path), weights=False), open_model(str(tmp_path))
    assert all(p.is_meta for p in bare.model.parameters())
    assert bare.layers() == full.layers() == prunable_layers(model)
    (tmp_path / "fedlib_model.json").unlink(missing_ok=True)  # no cached fingerprint: hash the files
    assert bare.fingerprint() == full.fingerprint() == fingerprint(model)


def test_a_hostile_first_file_neither_blames_the_honest_nor_labels_the_result(model, tmp_path):
    """The cohort is the majority (or what the server is told), never the first file: the error
    names every file that disagrees; with a cohort given, the files that differ from it."""
    honest, _ = _clients(model, tmp_path, n=3)
    odd, _ = _clients(model, tmp_path, n=2, first=3, method="magnitude")
    layers, fp, out = prunable_layers(model), fingerprint(model), tmp_path / "global.mask.safetensors"
    server = FedPrLLM(group="layer", sparsity=0.5, seed=0)
    with pytest.raises(MaskFileError, match=rf"{odd[0]}: field 'method': 'magnitude', but 3 of the 5 clients .* have "
                                            rf"'wanda' \(also disagreeing: {odd[1]} has 'magnitude'\)"):
        server.aggregate([odd[0], *honest, odd[1]], fp, layers, out)
    assert not out.exists()
    # 2 against 2: no majority, every file is named
    with pytest.raises(MaskFileError, match=r"no majority among the 4 clients") as error:
        server.aggregate([odd[0], honest[0], odd[1], honest[1]], fp, layers, out)
    assert all(str(p) in error.value.path for p in [odd[0], honest[0], odd[1], honest[1]])
    # told the cohort, the server names the files that differ from it, even a majority
    with pytest.raises(MaskFileError, match=rf"{honest[0]}: field 'method': 'wanda', but the server expects "
                                            rf"'magnitude' \(also disagreeing: {honest[1]} has 'wanda'; "):
        server.aggregate([odd[0], *honest], fp, layers, out, cohort={"method": "magnitude"})
    summary = server.aggregate([odd[0], odd[1]], fp, layers, out, cohort={"method": "magnitude", "sparsity": 0.5})
    assert summary["n_clients"] == 2 and MaskFile(out).header.method == "fedprllm[magnitude]"
    with pytest.raises(ValueError, match="the cohort is defined by method, group, sparsity, allocation"):
        server.aggregate(honest, fp, layers, out, cohort={"seed": 0})


def test_a_duplicate_client_id_names_both_files(model, tmp_path):
    paths, _ = _clients(model, tmp_path, n=2)
    (tmp_path / "other").mkdir()
    twin, _ = _clients(model, tmp_path / "other", n=1)  # client_0 again
    with pytest.raises(MaskFileError, match=rf"{paths[0]}, {twin[0]}: field 'client_id': '0' is in 2 files"):
        FedPrLLM().aggregate([paths[0], paths[1], twin[0]], fingerprint(model), prunable_layers(model),
                             tmp_path / "g.mask.safetensors")


def test_cli_cohort_options(tiny_model_dir, tmp_path, capsys):
    """`fedlib aggregate --client-method/--client-group/--client-sparsity`: what the workflow
    passes, so that the server checks every file against the configuration."""
    from fedlib.cli import main
    from fedlib.models import load_model

    model = load_model(str(tiny_model_dir))[0]
    paths, _ = _clients(model, tmp_path, n=3)
    out = tmp_path / "global.mask.safetensors"
    base = ["aggregate", "--model", str(tiny_model_dir), "--out", str(out)]
    assert main(base + ["--client-method", "wanda", "--client-group", "row", "--client-sparsity", "0.5",
                        *map(str, paths)]) == 0
    out.unlink()
    assert main(base + ["--client-sparsity", "0.6", *map(str, paths)]) == 2
    err = capsys.readouterr().err
    assert f"{paths[0]}: field 'sparsity': 0.5, but the server expects 0.6" in err and not out.exists()


def test_global_votes_must_agree_with_the_mask(model, tmp_path):
    """A global file's counts are claims too: the mask prunes the most-voted weights of every
    group, and no count exceeds the number of clients."""
    from safetensors import safe_open

    from fedlib.io import write_safetensors

    paths, _ = _clients(model, tmp_path, n=3)
    layers, out, bad = prunable_layers(model), tmp_path / "global.mask.safetensors", tmp_path / "bad.mask.safetensors"
    FedPrLLM(group="row", sparsity=0.5, seed=0).aggregate(paths, fingerprint(model), layers, out)
    name, mask = layers[0].name, MaskFile(out).layer_mask(layers[0].name)
    with safe_open(str(out), framework="pt") as handle:
        meta, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}
    votes = tensors[f"votes:{name}"]
    votes[0, mask[0].nonzero()[0, 0]], votes[0, (~mask[0]).nonzero()[0, 0]] = 0, 3
    write_safetensors(bad, tensors, meta)
    with pytest.raises(MaskFileError, match=rf"{bad}: field 'votes:{name}': row group 0: a pruned weight has 0 "
                                            "votes, a kept one 3"):
        MaskFile(bad).layer_votes(name)
    votes[0] = 4
    write_safetensors(bad, tensors, meta)
    with pytest.raises(MaskFileError, match=rf"'votes:{name}': vote counts outside 0..3"):
        MaskFile(bad).layer_votes(name)
