"""The mask file protocol: packing, metadata, and every way the server must refuse a file."""

import json
import math

import pytest
import torch
from safetensors import safe_open

from fedlib.io import write_safetensors
from fedlib.maskfile import (MaskFile, MaskFileError, count_true, pack_bits, pack_bits_torch, read_header, unpack_bits,
                             unpack_bits_torch, write_mask_file)
from fedlib.models import fingerprint, prunable_layers
from fedlib.client import Pruning, prune_locally

from conftest import tiny_llama


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (8, 8), (7, 13)])
def test_pack_round_trip(shape):
    mask = torch.rand(shape) < 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(math.prod(shape) / 8)
    assert torch.equal(unpack_bits(packed, shape), mask)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (8, 8), (7, 13)])
def test_torch_packing_equals_numpy_packing(shape):
    """The device path (torch ops) packs and unpacks the same bytes as the host path (numpy)."""
    mask = torch.rand(shape) < 0.5
    assert torch.equal(pack_bits_torch(mask), pack_bits(mask))
    assert torch.equal(unpack_bits_torch(pack_bits(mask), shape), mask)


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_count_true_equals_a_python_count(dim):
    mask = torch.rand(6, 9) < 0.3
    rows = mask.tolist()
    if dim is None:
        assert count_true(mask) == sum(map(sum, rows))
    elif dim == 1:
        assert count_true(mask, 1).tolist() == [sum(row) for row in rows]
    else:
        assert count_true(mask, 0).tolist() == [sum(col) for col in zip(*rows)]


def test_bit_order_is_documented_lsb_first():
    mask = torch.tensor([[True, False, False, False, False, False, False, False, False, True]])
    assert pack_bits(mask).tolist() == [1, 2]
    assert unpack_bits_torch(torch.tensor([1, 2], dtype=torch.uint8), (1, 10)).tolist() == mask.tolist()


def _client_file(model, path, sparsity=0.5, group="row", client_id="0", masks=None, method="wanda", **kw):
    layers = prunable_layers(model)
    if masks is None:
        masks = prune_locally(model, torch.randint(0, 128, (2, 8)), Pruning(method, sparsity, group, 0)).masks
    write_mask_file(path, masks, layers, fingerprint=fingerprint(model), role="client",
                    client_id=client_id, method=method, group=group, sparsity=sparsity,
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


@pytest.mark.parametrize("client_id", ["/x/y", "../global", ".hidden", "a/b", "a b", "-x", "x" * 129, "é"])
def test_refuses_a_client_id_that_is_not_a_plain_name(model, tmp_path, client_id):
    """The id names the file a server writes (``<id>.mask.safetensors``): a path is refused by the
    reader (a hostile site writes its own header) and by fedlib's writer (a site learns before it sends)."""
    good, path = tmp_path / "good.mask.safetensors", tmp_path / "c.mask.safetensors"
    _client_file(model, good, client_id="site-01.a_b")
    assert read_header(good, fingerprint(model), prunable_layers(model)).client_id == "site-01.a_b"
    _rewrite(good, path, {"client_id": client_id})
    with pytest.raises(MaskFileError, match="client_id.*expected a client id"):
        read_header(path, fingerprint(model), prunable_layers(model))
    with pytest.raises(ValueError, match="expected a client id"):
        _client_file(model, tmp_path / "refused.mask.safetensors", client_id=client_id)
    assert not (tmp_path / "refused.mask.safetensors").exists()


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
    """``path`` with some metadata or tensors replaced, written as fedlib writes (canonical bytes)."""
    with safe_open(str(path), framework="pt") as handle:
        meta = dict(handle.metadata())
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    meta.update(metadata_update or {})
    tensors.update(tensor_update or {})
    write_safetensors(out, tensors, meta)


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
    # a method that allocates per layer may do this; wanda may not claim it
    ok = tmp_path / "ok.mask.safetensors"
    _client_file(model, ok, group="layer", masks=masks, method="owl", allocation="nonuniform")
    assert read_header(ok).allocation == "nonuniform"
    _client_file(model, path, group="layer", masks=masks, allocation="nonuniform")
    with pytest.raises(MaskFileError, match="'allocation': wanda allocates uniformly"):
        read_header(path)


def test_rejects_nonzero_padding(tmp_path):
    layers = [type("L", (), {"name": "w", "shape": (1, 3)})()]
    write_mask_file(tmp_path / "p.safetensors", {"w": torch.tensor([[True, False, False]])}, layers,
                    fingerprint="f", role="client", client_id="0", method="owl", group="layer",
                    sparsity=0.3333333333, allocation="nonuniform")
    _rewrite(tmp_path / "p.safetensors", tmp_path / "q.safetensors",
             tensor_update={"mask:w": torch.tensor([0b1001], dtype=torch.uint8)})
    with pytest.raises(MaskFileError, match="padding"):
        MaskFile(tmp_path / "q.safetensors").layer_mask("w")


# --------------------------------------------------------------------------- issue 14's classes


def _with_header(path, out, edit):
    """``path`` with its JSON header text replaced by ``edit(text)`` (length prefix updated)."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    text = edit(data[8:8 + length].decode())
    out.write_bytes(len(text.encode()).to_bytes(8, "little") + text.encode() + data[8 + length:])


def _with_layers(path, out, edit):
    """``path`` with its ``layers`` metadata text replaced by ``edit(text)``, written canonically."""
    with safe_open(str(path), framework="pt") as handle:
        meta = dict(handle.metadata())
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    meta["layers"] = edit(meta["layers"])
    write_safetensors(out, tensors, meta)


def test_refuses_a_shape_that_overflows(model, tmp_path):
    """`-1e400` parses as -inf in Python's json: it crashed int() with an OverflowError."""
    path, bad = tmp_path / "c.mask.safetensors", tmp_path / "bad.mask.safetensors"
    _client_file(model, path)
    for literal in ["-1e400", "1e400", "32.0", "true", "4294967296", "1" * 5000, "NaN"]:
        _with_layers(path, bad, lambda text: text.replace('"shape":[32,32]', f'"shape":[{literal},32]', 1))
        with pytest.raises(MaskFileError, match=rf"{bad}: field 'layers'"):
            read_header(bad)


def test_refuses_a_header_padded_or_reformatted(model, tmp_path):
    path, bad = tmp_path / "c.mask.safetensors", tmp_path / "bad.mask.safetensors"
    _client_file(model, path)
    for edit in [lambda t: t + " " * 8,                   # padded beyond the 8-byte alignment
                 lambda t: " " * 8 + t,                   # whitespace JSON allows, fedlib never writes
                 lambda t: t.replace(",", ", ", 1),
                 lambda t: t.replace('"fedlib-mask"', '"fedlib\\u002dmask"')]:  # the same string, escaped
        _with_header(path, bad, edit)
        with pytest.raises(MaskFileError, match=rf"{bad}: field 'file': safetensors header not in the form"):
            read_header(bad)
    # the same content written by safetensors' own writer (another key order and layout)
    from safetensors.torch import save_file
    with safe_open(str(path), framework="pt") as handle:
        save_file({k: handle.get_tensor(k) for k in handle.keys()}, str(bad), metadata=handle.metadata())
    with pytest.raises(MaskFileError, match=rf"{bad}: field '"):
        read_header(bad)
    assert read_header(path).method == "wanda"  # the file fedlib wrote reads


@pytest.mark.parametrize("edit", [
    lambda t: t.replace('"pruned":', '"extra":1,"pruned":', 1),         # an extra key
    lambda t: t.replace('{"name":', '{"shape":[1,1],"name":', 1),       # a key twice
    lambda t: t.replace(',"pruned":', ',"Pruned":', 1),                  # a key missing
    lambda t: json.dumps(json.loads(t)),                                 # whitespace
    lambda t: "[" * 100_000 + "]" * 100_000,                             # nested beyond the stack
])
def test_refuses_a_malformed_layers_entry(model, tmp_path, edit):
    path, bad = tmp_path / "c.mask.safetensors", tmp_path / "bad.mask.safetensors"
    _client_file(model, path)
    _with_layers(path, bad, edit)
    with pytest.raises(MaskFileError, match=rf"{bad}: field 'layers'"):
        read_header(bad)


def test_refuses_unknown_metadata_and_tensors(model, tmp_path):
    path, bad = tmp_path / "c.mask.safetensors", tmp_path / "bad.mask.safetensors"
    _client_file(model, path)
    _rewrite(path, bad, {"x_note": "hello"})
    with pytest.raises(MaskFileError, match=r"field 'x_note': not a field of a client mask file"):
        read_header(bad)
    _rewrite(path, bad, tensor_update={"extra": torch.zeros(3)})
    with pytest.raises(MaskFileError, match=r"field 'extra': unexpected tensor"):
        read_header(bad)
    name = read_header(path).layers[0]["name"]
    _rewrite(path, bad, tensor_update={f"votes:{name}": torch.zeros(32, 32, dtype=torch.uint8)})
    with pytest.raises(MaskFileError, match=rf"field 'votes:{name}': a client file carries no vote counts"):
        read_header(bad)
    for key, value in [("n_samples", "02"), ("seed", "-1"), ("sparsity", "0.50"), ("method", "nope"),
                       ("group", "5:4"), ("n_clients", "2"), ("x_method_options", '{"lam":0.1}')]:
        _rewrite(path, bad, {key: value})
        with pytest.raises(MaskFileError, match=rf"{bad}: field '{key}'"):
            read_header(bad)


def _moved(masks, layers, moved: int | None):
    """``masks`` with ``moved`` more weights pruned in the first layer (None: all of them) and as
    many fewer in the next layers, in order: the whole-model budget is unchanged."""
    masks = {k: v.clone() for k, v in masks.items()}
    first = masks[layers[0].name].view(-1)
    kept = (~first).nonzero()[:, 0]
    kept = kept if moved is None else kept[:moved]
    first[kept] = True
    left = len(kept)
    for info in layers[1:]:
        flat = masks[info.name].view(-1)
        taken = flat.nonzero()[:left, 0]
        flat[taken] = False
        left -= len(taken)
        if not left:
            return masks
    raise AssertionError("not enough pruned weights to move")


def test_nonuniform_allocation_is_bounded_by_the_method(model, tmp_path):
    """An OWL client (lam 0.1) may give a layer 0.5 ± 0.2: a small move is accepted; 100 % in
    one layer and 0 % in another at the same whole-model budget is refused."""
    layers, path = prunable_layers(model), tmp_path / "owl.mask.safetensors"
    options = {"outlier_m": 1.5, "lam": 0.1}
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    owl = prune_locally(model, ids, Pruning("owl", 0.5, "layer", 0, options=options)).masks

    def write(masks):
        write_mask_file(path, masks, layers, fingerprint=fingerprint(model), role="client", client_id="0",
                        method="owl", group="layer", sparsity=0.5, allocation="nonuniform",
                        extra={"method_options": json.dumps(options)})

    write(_moved(owl, layers, 40))
    read_header(path)
    full = _moved(owl, layers, None)
    assert int(full[layers[0].name].sum()) == 1024 and int(full[layers[1].name].sum()) == 0
    write(full)
    with pytest.raises(MaskFileError, match=rf"{path}: field 'layers': {layers[0].name} claims 1024 of 1024 "
                                            r"weights pruned; owl at 0.5 gives a layer 307..716"):
        read_header(path)


def test_weight_upload_is_nonuniform_by_one_weight_per_group_at_most(model, tmp_path):
    """A FedSpaLLM upload of a uniform method: each layer between the floor and the ceil of
    s·d (Eq. 7); 100 % / 0 % is refused however the budget balances."""
    from fedlib.federation import fedspallm_client
    from fedlib.weightfile import open_weight_file, write_weight_file

    layers, fp = prunable_layers(model), fingerprint(model)
    up = fedspallm_client(model, torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1)), [0, 1],
                          Pruning("sparsegpt_update", 0.7, "layer", 0))
    path = tmp_path / "up.weights.safetensors"

    def write(masks):
        write_weight_file(path, masks, up.weights, layers, fingerprint=fp, role="client", client_id="0",
                          method="sparsegpt_update", group="layer", sparsity=0.7)
        return open_weight_file(path, fp, layers)

    assert write(up.masks).header.allocation == "uniform"
    masks = {k: v.clone() for k, v in up.masks.items()}
    name = layers[0].name
    masks[name].view(-1)[(~masks[name]).view(-1).nonzero()[0]] = True  # ceil(0.7 * 1024) = 717
    assert write(masks).header.allocation == "nonuniform"
    masks[name].view(-1)[(~masks[name]).view(-1).nonzero()[0]] = True  # 718: beyond the ceil
    with pytest.raises(MaskFileError, match=rf"field 'layers': {name} claims 718 of 1024"):
        write(masks)
    masks = {k: v.clone() for k, v in up.masks.items()}
    masks[layers[0].name][:] = True
    masks[layers[1].name][:] = False
    with pytest.raises(MaskFileError, match="field 'layers'"):
        write(masks)
