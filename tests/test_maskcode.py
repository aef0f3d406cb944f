"""Mask file format version 2: masks coded against the public model's magnitude ranks."""

import json

import numpy as np
import pytest
import torch

from fedlib.client import Pruning, prune_locally
from fedlib.cli import main
from fedlib.data import save_tokens
from fedlib.maskcode import MagnitudeReference, decode_layer, encode_layer, magnitude_buckets
from fedlib.maskfile import MaskFile, MaskFileError, write_mask_file
from fedlib.models import fingerprint, linear_by_name, prunable_layers
from fedlib.server import FedPrLLM

from conftest import tiny_llama

GROUPS = ["row", "column", "layer", "2:4"]


def reference_of(model) -> MagnitudeReference:
    return MagnitudeReference(lambda name: linear_by_name(model, name).weight)


def write(model, path, masks, group, version, reference=None, client_id="0", method="wanda"):
    write_mask_file(path, masks, prunable_layers(model), fingerprint=fingerprint(model), role="client",
                    client_id=client_id, method=method, group=group, sparsity=0.5, n_samples=2, seed=0,
                    format_version=version, reference=reference)


def client_masks(model, group, seed=0):
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(seed))
    return prune_locally(model, ids, Pruning("wanda", 0.5, group, 0)).masks


def test_buckets_are_rank_quantiles_of_magnitude():
    """Independent of the implementation: rank by |w| with a Python sort (ties by position)."""
    weight = torch.tensor([[0.5, -0.1, 0.1, 2.0, -3.0, 0.0, 0.25, 0.1]])
    ranks = sorted(range(8), key=lambda j: (abs(float(weight[0, j])), j))
    expected = [0] * 8
    for rank, j in enumerate(ranks):
        expected[j] = rank  # 8 weights, 8 buckets: the bucket is the rank
    assert magnitude_buckets(weight, "row").tolist() == [expected]
    assert magnitude_buckets(weight.T, "column").tolist() == [[e] for e in expected]
    # a 100-weight layer group: 64 buckets, bucket = rank * 64 // 100; exact ties broken by position
    layer = torch.randint(-20, 20, (10, 10), generator=torch.Generator().manual_seed(0)).float() / 8
    flat = layer.reshape(-1).tolist()
    by_rank = sorted(range(100), key=lambda j: (abs(flat[j]), j))
    expected = [0] * 100
    for rank, j in enumerate(by_rank):
        expected[j] = rank * 64 // 100
    assert magnitude_buckets(layer, "layer").reshape(-1).tolist() == expected
    # 2:4: the rank within each 4 consecutive inputs
    nm = magnitude_buckets(layer[:, :8], "2:4").reshape(-1, 4)
    for got, values in zip(nm.tolist(), layer[:, :8].reshape(-1, 4).tolist()):
        order = sorted(range(4), key=lambda j: (abs(values[j]), j))
        assert [order.index(j) for j in range(4)] == got


@pytest.mark.parametrize("group", GROUPS)
def test_v2_round_trip_equals_v1_bit_for_bit(model, tmp_path, group):
    masks = client_masks(model, group)
    reference = reference_of(model)
    v1, v2 = tmp_path / "v1.safetensors", tmp_path / "v2.safetensors"
    write(model, v1, masks, group, 1)
    write(model, v2, masks, group, 2, reference)
    one = MaskFile(v1, fingerprint(model), prunable_layers(model))
    two = MaskFile(v2, fingerprint(model), prunable_layers(model), reference=reference_of(model))
    assert two.header.format_version == 2 and two.header.reference == "magnitude"
    for info in prunable_layers(model):
        assert torch.equal(two.layer_mask(info.name), masks[info.name])
        assert torch.equal(two.layer_mask(info.name), one.layer_mask(info.name))
    # rewriting gives the same bytes (determinism), and v1 stays what it was
    again = tmp_path / "again.safetensors"
    write(model, again, masks, group, 2, reference_of(model))
    assert again.read_bytes() == v2.read_bytes()


def test_coding_is_lossless_on_random_masks():
    weight = torch.randn(48, 80)
    buckets = magnitude_buckets(weight, "row")
    for p in (0.0, 0.02, 0.5, 0.97, 1.0):
        mask = torch.rand(48, 80, generator=torch.Generator().manual_seed(3)) < p
        assert torch.equal(decode_layer(encode_layer(mask, buckets), buckets, "row"), mask)


def test_a_mask_like_its_reference_costs_far_less_than_a_bit():
    """A mask that prunes each row's smallest half (Wanda on a flat activation profile) with 5 %
    of its weights changed: about H(0.05) per weight, not 1."""
    weight = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    ranks = weight.abs().argsort(1).argsort(1)
    noise = torch.rand(256, 256, generator=torch.Generator().manual_seed(1)) < 0.05
    mask = (ranks < 128) ^ noise
    payload = encode_layer(mask, magnitude_buckets(weight, "row"))
    bits = payload.numel() * 8 / mask.numel()
    entropy = -(0.05 * np.log2(0.05) + 0.95 * np.log2(0.95))
    assert bits < entropy + 0.05


def corrupt(path, change):
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[:8], "little")
    head = json.loads(data[8:8 + length])
    change(head, data, 8 + length)
    return data


def test_a_corrupted_v2_payload_is_refused_naming_file_and_field(model, tmp_path):
    masks = client_masks(model, "row")
    path = tmp_path / "v2.safetensors"
    write(model, path, masks, "row", 2, reference_of(model))
    layers = prunable_layers(model)
    name = layers[0].name
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[:8], "little")
    start, end = json.loads(data[8:8 + length])[f"mask:{name}"]["data_offsets"]
    seen = set()
    for offset in range(start, end):
        bad = bytearray(data)
        bad[8 + length + offset] ^= 0x10
        hostile = tmp_path / "hostile.safetensors"
        hostile.write_bytes(bad)
        mask_file = MaskFile(hostile, fingerprint(model), layers, reference=reference_of(model))
        with pytest.raises(MaskFileError) as err:
            mask_file.layer_mask(name)
        assert err.value.path == str(hostile) and err.value.field == f"mask:{name}"
        seen.add(str(err.value).split(": ", 3)[-1][:30])
    assert len(seen) >= 2  # table, stream and canonical-form errors all occur


def test_a_reference_mismatch_is_refused(model, tmp_path):
    masks = client_masks(model, "row")
    path = tmp_path / "v2.safetensors"
    write(model, path, masks, "row", 2, reference_of(model))
    other = tiny_llama(seed=1)  # other weights: other magnitude ranks
    with pytest.raises(MaskFileError, match="reference_sha256") as err:
        MaskFile(path, fingerprint(model), prunable_layers(model), reference=reference_of(other))
    assert err.value.path == str(path) and err.value.field == "reference_sha256"
    with pytest.raises(MaskFileError) as err:
        MaskFile(path, fingerprint(model), prunable_layers(model))
    assert err.value.field == "format_version" and "no reference" in str(err.value)


def uploads(model, folder) -> dict[int, list]:
    """Three clients' Wanda row masks, each written in format versions 1 and 2: version -> files."""
    paths = {1: [], 2: []}
    for client in range(3):
        masks = client_masks(model, "row", seed=client)
        for version in (1, 2):
            paths[version].append(folder / f"c{client}.v{version}.safetensors")
            write(model, paths[version][-1], masks, "row", version, reference_of(model), client_id=str(client))
    return paths


def test_aggregating_v2_uploads_equals_aggregating_v1(model, tmp_path):
    layers = prunable_layers(model)
    paths = uploads(model, tmp_path)
    mixed = [paths[1][0], paths[2][1], paths[2][2]]
    outs = []
    for i, files in enumerate([paths[1], paths[2], mixed]):
        outs.append(tmp_path / f"global{i}.safetensors")
        FedPrLLM(group="layer", sparsity=0.5).aggregate(files, fingerprint(model), layers, outs[-1],
                                                       reference=reference_of(model))
    assert outs[0].read_bytes() == outs[1].read_bytes() == outs[2].read_bytes()


def test_cli_client_mask_format_version_2(tmp_path):
    model_dir = tmp_path / "model"
    model = tiny_llama()
    model.save_pretrained(model_dir)
    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)))
    outs = {}
    for version in (1, 2):
        outs[version] = tmp_path / f"c.v{version}.safetensors"
        assert main(["client-mask", "--model", str(model_dir), "--calib", str(calib), "--format-version",
                     str(version), "--out", str(outs[version])]) == 0
    assert outs[2].stat().st_size < outs[1].stat().st_size
    globals_ = []
    for version in (1, 2):
        globals_.append(tmp_path / f"g{version}.safetensors")
        assert main(["aggregate", "--model", str(model_dir), "--out", str(globals_[-1]), str(outs[version])]) == 0
    assert globals_[0].read_bytes() == globals_[1].read_bytes()


def test_every_reader_of_client_files_decodes_version_2(tmp_path):
    """upload.format_version 2 reaches every job that reads the clients' uploads: the privacy
    audit's bits (entropy, similarity), the evaluation of a client's mask (Local-only), the
    defence's server, the sensitivity audit's base mask and the transfer cost read the same
    content from both versions; only the transfer's upload sizes differ (smaller)."""
    import argparse
    import copy

    from fedlib.cost import fedprllm_transfer
    from fedlib.models import open_model
    from fedlib.privacy.bits import open_mask_files
    from fedlib.privacy.stages.defence import rr_aggregate
    from fedlib.privacy_cli import _base_masks
    from fedlib.pruned import apply_mask_file

    model = tiny_llama()
    model.save_pretrained(tmp_path / "model")
    handle = open_model(str(tmp_path / "model"), weights=False)
    layers = prunable_layers(model)
    paths = uploads(model, tmp_path)
    with open_mask_files(paths[1], handle) as (_, v1), open_mask_files(paths[2], handle) as (_, v2):
        for i in range(3):
            for info in layers:
                assert np.array_equal(v1(i, info.name), v2(i, info.name))
    pruned = {}
    for version in (1, 2):
        pruned[version] = copy.deepcopy(model)
        apply_mask_file(pruned[version], paths[version][0])
    assert all(torch.equal(a, b) for a, b in zip(pruned[1].parameters(), pruned[2].parameters()))
    args = argparse.Namespace(method="wanda", local_group="row", sparsity=0.5, seed=0, method_options=None, blocks=None)
    bases = [_base_masks(model, argparse.Namespace(**vars(args), base_mask=str(paths[v][0])), torch.zeros(2, 8))
             for v in (1, 2)]
    assert bases[0].keys() == bases[1].keys() and all(torch.equal(bases[0][n], bases[1][n]) for n in bases[0])
    outs = [tmp_path / f"rr.v{v}.safetensors" for v in (1, 2)]
    for version, out in zip((1, 2), outs):
        rr_aggregate(model, paths[version], 1.0, "layer", 0.5, 0, out)
    assert outs[0].read_bytes() == outs[1].read_bytes()
    FedPrLLM(group="layer", sparsity=0.5).aggregate(paths[1], fingerprint(model), layers,
                                                    tmp_path / "g.safetensors")
    transfers = [fedprllm_transfer(tmp_path / "model", paths[v], tmp_path / "g.safetensors", tmp_path)
                 for v in (1, 2)]
    sizes = []
    for version, transfer in zip((1, 2), transfers):  # every upload under its format's column
        sizes.append([[up.pop(f"format v{version} (as sent)") for up in r["up"]]
                      for strategy in transfer for r in strategy["rounds"]])
    assert all(coded < packed for packed, coded in zip(sizes[0][0], sizes[1][0]))  # one-shot uploads
    assert transfers[0] == transfers[1]  # the rest: downloads, parameters, the final global file
