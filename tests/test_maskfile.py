"""The mask file protocol: packing, metadata, and every way the server must refuse a file."""

import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fedlib.maskfile import MaskFile, MaskFileError, pack_bits, read_header, unpack_bits, write_mask_file
from fedlib.models import fingerprint, prunable_layers
from fedlib.client import prune_locally

from conftest import tiny_llama


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (8, 8), (7, 13)])
def test_pack_round_trip(shape):
    mask = torch.rand(shape) < 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(math.prod(shape) / 8)
    assert torch.equal(unpack_bits(packed, shape), mask)


def test_bit_order_is_documented_lsb_first():
    mask = torch.tensor([[True, False, False, False, False, False, False, False, False, True]])
    assert pack_bits(mask).tolist() == [1, 2]


def _client_file(model, path, sparsity=0.5, group="row", client_id="0", masks=None, **kw):
    layers = prunable_layers(model)
    if masks is None:
        masks = prune_locally(model, torch.randint(0, 128, (2, 8)), "wanda", sparsity, group, 0).masks
    write_mask_file(path, masks, layers, fingerprint=fingerprint(model), role="client",
                    client_id=client_id, method="wanda", group=group, sparsity=sparsity,
                    n_samples=2, seed=0, **kw)
    return masks


def test_round_trip_and_size(model, tmp_path):
    path = tmp_path / "c.mask.safetensors"
    masks = _client_file(model, path)
    mask_file = MaskFile(path, fingerprint(model), prunable_layers(model))
    assert all(torch.equal(mask_file.layer_mask(k), v) for k, v in masks.items())
    header = mask_file.header
    assert (header.role, header.method, header.group, header.sparsity) == ("client", "wanda", "row", 0.5)
    with open(path, "rb") as handle:  # safetensors: 8-byte header length, then JSON; no pickle
        length = int.from_bytes(handle.read(8), "little")
        assert json.loads(handle.read(length))["__metadata__"]["format"] == "fedlib-mask"


def test_rejects_mask_for_another_model(model, tmp_path):
    path = tmp_path / "c.mask.safetensors"
    _client_file(model, path)
    other = tiny_llama(seed=1)
    with pytest.raises(MaskFileError, match="model_fingerprint.*different model") as err:
        read_header(path, fingerprint(other), prunable_layers(other))
    assert str(path) in str(err.value)


def test_rejects_wrong_shapes(model, tmp_path):
    path = tmp_path / "c.mask.safetensors"
    _client_file(model, path)
    wider = tiny_llama(hidden=64)
    with pytest.raises(MaskFileError, match="'layers'"):
        read_header(path, None, prunable_layers(wider))


def test_rejects_truncated_and_garbage(model, tmp_path):
    path = tmp_path / "c.mask.safetensors"
    _client_file(model, path)
    data = path.read_bytes()
    cut = tmp_path / "cut.mask.safetensors"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(MaskFileError, match="'file'.*not a readable safetensors"):
        MaskFile(cut, fingerprint(model), prunable_layers(model)).masks()
    junk = tmp_path / "junk.mask.safetensors"
    junk.write_bytes(b"\x80\x04K\x01.")  # a pickle: never loaded
    with pytest.raises(MaskFileError, match="'file'"):
        read_header(junk)
    with pytest.raises(MaskFileError, match="not found"):
        read_header(tmp_path / "missing.safetensors")


def _rewrite(path, out, metadata_update=None, tensor_update=None):
    with safe_open(str(path), framework="pt") as handle:
        meta = dict(handle.metadata())
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    meta.update(metadata_update or {})
    tensors.update(tensor_update or {})
    save_file(tensors, str(out), metadata=meta)


def test_rejects_sparsity_that_does_not_match_claim(model, tmp_path):
    path = tmp_path / "c.mask.safetensors"
    _client_file(model, path)
    # claims 70 % but carries a 50 % mask
    bad = tmp_path / "claim.mask.safetensors"
    _rewrite(path, bad, {"sparsity": "0.7"})
    with pytest.raises(MaskFileError, match="'sparsity'"):
        read_header(bad)
    # layer counts edited consistently with 70 %, but the bits still say 50 %
    name = read_header(path).layers[0]["name"]
    original = MaskFile(path).layer_mask(name)
    flipped = original.clone()
    flipped.view(-1)[(~original).view(-1).nonzero()[0]] = True  # one extra pruned bit
    tampered = tmp_path / "bits.mask.safetensors"
    _rewrite(path, tampered, tensor_update={f"mask:{name}": pack_bits(flipped)})
    with pytest.raises(MaskFileError, match=f"mask:{name}.*header claims"):
        MaskFile(tampered).layer_mask(name)


def test_rejects_uniform_claim_with_wrong_per_layer_counts(model, tmp_path):
    layers = prunable_layers(model)
    masks = {info.name: torch.zeros(info.shape, dtype=torch.bool) for info in layers}
    for info in layers:  # overall 50 %, but uneven across layers
        masks[info.name].view(-1)[: info.shape[0] * info.shape[1] // 2 + (1 if info.block == 0 else -1)] = True
    path = tmp_path / "c.mask.safetensors"
    _client_file(model, path, group="layer", masks=masks)
    with pytest.raises(MaskFileError, match="uniform"):
        read_header(path)
    ok = tmp_path / "ok.mask.safetensors"
    _client_file(model, ok, group="layer", masks=masks, allocation="nonuniform")
    assert read_header(ok).allocation == "nonuniform"


def test_rejects_nonzero_padding(tmp_path):
    layers = [type("L", (), {"name": "w", "shape": (1, 3)})()]
    write_mask_file(tmp_path / "p.safetensors", {"w": torch.tensor([[True, False, False]])}, layers,
                    fingerprint="f", role="client", client_id="0", method="m", group="layer",
                    sparsity=0.3333333333, allocation="nonuniform")
    _rewrite(tmp_path / "p.safetensors", tmp_path / "q.safetensors",
             tensor_update={"mask:w": torch.tensor([0b1001], dtype=torch.uint8)})
    with pytest.raises(MaskFileError, match="padding"):
        MaskFile(tmp_path / "q.safetensors").layer_mask("w")
