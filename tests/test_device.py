"""Device placement without a GPU: the block runner under fake CUDA tensors, where an operation
mixing a host and a device tensor raises exactly as it would on a real GPU; and real CUDA tests
that run where CUDA exists (skipped here, with the reason printed by ``pytest -rs``).

Under :class:`FakeTensorMode` tensors carry shapes, dtypes and devices but no data, so what
needs data (mask selection) is replaced by a shape-only stand-in; everything that moves or
computes (placement, residency, statistics, propagation, weight replacement) runs for real.
"""

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode

import fedlib.methods.base
import fedlib.runner
import fedlib.server.fedprllm
from fedlib.client import Pruning, prune_locally
from fedlib.federation import iterative_prune
from fedlib.models import ModelHandle
from fedlib.runner import BlockRunner, Placement, place_model

from conftest import tiny_llama

CUDA0 = torch.device("cuda", 0)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


class _FakeCudaMethods(TorchFunctionMode):
    """A CPU-only torch build cannot run two Tensor methods on fake CUDA tensors (their Python
    bindings take a CUDA device guard first): basic indexing and ``contiguous``. Both are
    re-expressed through ops that dispatch to the fake kernels, with the same result shapes."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        x = args[0] if args else None
        if isinstance(x, FakeTensor) and x.device.type == "cuda":
            if func is torch.Tensor.__getitem__:
                with torch._C.DisableTorchFunction():
                    view = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")[args[1]]
                    return x.as_strided(view.shape, view.stride(), x.storage_offset() + view.storage_offset())
            if func is torch.Tensor.contiguous:
                with torch._C.DisableTorchFunction():
                    return x if x.is_contiguous() else torch.ops.aten.clone.default(
                        x, memory_format=torch.contiguous_format)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def fake_cuda(monkeypatch, free_bytes: int = 8 << 30):
    """Fake CUDA: device tensors without a device. Mask selection (data-dependent: its sizes
    depend on ties; tested against the host's on real data in test_groups) is replaced by an
    all-kept mask of the right shape on the scores' device, as the real selection returns it;
    ``free_bytes`` is what the runner is told the device has free (it decides where activations
    wait)."""

    def shape_only(scores, sparsity, group, seed, name=""):
        return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)

    monkeypatch.setattr(fedlib.methods.base, "prune_lowest", shape_only)  # client methods
    monkeypatch.setattr(fedlib.server.fedprllm, "prune_lowest", shape_only)  # the server's masks
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_bytes, 16 << 30))
    with FakeTensorMode(allow_non_fake_inputs=True), _FakeCudaMethods():
        yield


def _record_linear_inputs(model):
    """(device, dtype) of every linear's input and weight during forwards, by layer name."""
    seen = {}

    def hook(name):
        def record(module, inputs, _output):
            seen.setdefault(name, set()).add((inputs[0].device, inputs[0].dtype, module.weight.device))
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    return seen, handles


def _assert_model_untouched(model, reference):
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert not isinstance(p, FakeTensor) and p.device.type == "cpu" and p.dtype == torch.float32, name
        assert torch.equal(p, q), name


@pytest.mark.parametrize("free_bytes", [8 << 30, 1000], ids=["activations-on-device", "activations-on-host"])
def test_client_loop_runs_every_block_on_the_device(monkeypatch, free_bytes):
    model, reference = tiny_llama(), tiny_llama()
    ids = torch.randint(0, 128, (3, 12))
    seen, handles = _record_linear_inputs(model)
    decisions = []
    with fake_cuda(monkeypatch, free_bytes):
        pruning = Pruning("wanda", 0.5, "row", 0, batch_size=2, placement=Placement(CUDA0, torch.bfloat16))
        result = prune_locally(model, ids, pruning, on_block=lambda i, d: decisions.append(i))
    for h in handles:
        h.remove()
    assert decisions == [0, 1]
    block_linears = {n for n in seen if ".layers." in n}
    assert len(block_linears) == 14  # 7 linears x 2 blocks, each run on the device in bfloat16
    for name in block_linears:
        assert seen[name] == {(CUDA0, torch.bfloat16, CUDA0)}, name
    # masks are the protocol's: on the host, one per linear, of the weight's shape
    assert len(result.masks) == 14
    for name, mask in result.masks.items():
        assert mask.device.type == "cpu" and mask.dtype == torch.bool
        assert tuple(mask.shape) == tuple(model.get_submodule(name).weight.shape)
    # the host model is given back as it was: real float32 CPU tensors, same values
    _assert_model_untouched(model, reference)


class _HostTransfers(TorchFunctionMode):
    """Records every copy of a (fake) CUDA tensor to the host: its dtype and size."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[torch.dtype, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            to_host = func is torch.Tensor.cpu or (func is torch.Tensor.to and any(
                (isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu")
                for a in (*args[1:], kwargs.get("device"))))
            if to_host:
                self.seen.append((x.dtype, x.numel()))
        return func(*args, **kwargs)


def test_only_packed_masks_leave_the_device(monkeypatch):
    """A client's block loop on a GPU copies nothing to the host but each layer's mask, packed
    on the device (one eighth of it): statistics, scores and activations stay there."""
    from fedlib.maskfile import pack_bits

    model = tiny_llama()
    ids = torch.randint(0, 128, (3, 12))
    packed = []
    with fake_cuda(monkeypatch, free_bytes=8 << 30), _HostTransfers() as transfers:
        pruning = Pruning("wanda", 0.5, "row", 0, batch_size=2, placement=Placement(CUDA0, torch.bfloat16))
        prune_locally(model, ids, pruning, keep=False, on_block=lambda i, d: packed.extend(pack_bits(m) for m in d.masks.values()))
    sizes = [(m.numel() + 7) // 8 for m in (lin.weight for n, lin in model.named_modules()
                                            if isinstance(lin, torch.nn.Linear) and ".layers." in n)]
    assert len(packed) == 14 and all(p.device.type == "cpu" for p in packed)
    assert sorted(transfers.seen) == sorted((torch.uint8, n) for n in sizes)


@pytest.mark.parametrize("forgotten", ["block kwargs", "activations"])
def test_a_forgotten_move_to_the_device_is_caught(monkeypatch, forgotten):
    """The mechanism catches the bug it is for: if the blocks' keyword arguments (the rotary
    cos/sin tables) or the activations waiting on the host were not moved to the device, the
    fake run fails as a GPU run would."""
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 8))
    if forgotten == "block kwargs":
        real_move = Placement.move
        monkeypatch.setattr(Placement, "move", lambda self, v, non_blocking=False:
                            v if isinstance(v, dict) else real_move(self, v, non_blocking))
    else:
        monkeypatch.setattr(fedlib.runner._DeviceBatches, "__getitem__", lambda self, i: self.batches[i])
    # torch's wording changes between releases ("cuda:0 and cpu", "two different devices
    # cuda:0, cpu"): the error must name both devices, in any order and words
    with fake_cuda(monkeypatch, free_bytes=1000), pytest.raises(RuntimeError, match=r"(?s)^(?=.*cuda:0)(?=.*cpu)"):
        prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0, placement=Placement(CUDA0, torch.bfloat16)))


def test_iterative_rounds_run_on_the_device(monkeypatch):
    """Iterative FedPrLLM: server masks between blocks, every client's activations through the
    block under the global masks, on the device."""
    model, reference = tiny_llama(), tiny_llama()
    clients = [torch.randint(0, 128, (2, 8)) for _ in range(3)]
    seen, handles = _record_linear_inputs(model)
    with fake_cuda(monkeypatch):
        pruning = Pruning("wanda", 0.5, "row", 0, batch_size=1, placement=Placement(CUDA0, torch.float16))
        result = iterative_prune(model, clients, pruning, "layer", scale=True)
    for h in handles:
        h.remove()
    assert len(result.rounds) == 2 and len(result.masks) == 14
    assert all(m.device.type == "cpu" for m in result.masks.values())
    assert {v for n, vs in seen.items() if ".layers." in n for v in vs} == {(CUDA0, torch.float16, CUDA0)}
    _assert_model_untouched(model, reference)


def test_final_logits_come_from_the_device(monkeypatch):
    """Perplexity's path: blocks streamed, then the model's own norm and head on the device."""
    model = tiny_llama()
    with fake_cuda(monkeypatch):
        runner = BlockRunner(model, [torch.randint(0, 128, (2, 8))], Placement(CUDA0, torch.bfloat16),
                             batch_size=2, final_outputs=True)
        for step in runner.steps():
            step.propagate(0)
        logits = list(runner.logits(0))
    assert [tuple(x.shape) for x in logits] == [(2, 8, 128)]
    assert logits[0].device == CUDA0 and logits[0].dtype == torch.bfloat16
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_place_model_puts_everything_on_the_device(monkeypatch):
    """Zero-shot's path: the whole model on the device, blocks moved one at a time."""
    with fake_cuda(monkeypatch):
        placed = place_model(ModelHandle.of(tiny_llama()), Placement(CUDA0, torch.bfloat16))
        out = placed(input_ids=torch.zeros(1, 4, dtype=torch.long).to(device=CUDA0)).logits
    assert out.device == CUDA0
    assert {(p.device, p.dtype) for p in placed.parameters()} == {(CUDA0, torch.bfloat16)}
    assert {b.device for b in placed.buffers()} == {CUDA0}


def test_device_choices():
    assert Placement.resolve("auto", "bfloat16") == Placement(
        torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"), torch.bfloat16)
    assert Placement.resolve("cpu").label == "cpu/float32"
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N, got 'tpu'"):
        Placement.resolve("tpu")
    with pytest.raises(ValueError, match="dtype"):
        Placement.resolve("cpu", "int8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here"):
            Placement.resolve("cuda:1")


# --------------------------------------------------------------------------- real CUDA


@needs_cuda
def test_cuda_masks_match_cpu_masks():
    """Same statistics on either device: Wanda masks on CUDA (float32) equal the CPU ones up to
    the order of floating-point sums (near-ties)."""
    model = tiny_llama(hidden=64)
    ids = torch.randint(0, 128, (4, 32))
    cpu = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0))
    gpu = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0, placement=Placement.resolve("cuda", "float32")))
    agree = sum(int((cpu.masks[n] == gpu.masks[n]).sum()) for n in cpu.masks)
    total = sum(m.numel() for m in cpu.masks.values())
    assert agree / total >= 0.999
    assert all(p.device.type == "cpu" for p in model.parameters())


@needs_cuda
@pytest.mark.parametrize("group", ["row", "2:4"])
def test_cuda_sparsegpt_update_solves_like_the_host_column_loop(group):
    """SparseGPT's update on CUDA (batched triangular solves, its default there) gives the host's
    column loop's mask and, up to rounding, its weights (float64, continuous weights: no ties)."""
    from fedlib.methods.sparsegpt import damped_hessian, inverse_cholesky_upper, obs_prune

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 320, generator=gen, dtype=torch.float64)
    x = torch.randn(640, 320, generator=gen, dtype=torch.float64)
    upper = inverse_cholesky_upper(damped_hessian(2.0 / 640 * x.T @ x, 0.01)[0])
    w_host, m_host, _ = obs_prune(w, upper, sparsity=0.5, group=group, solve="column")
    w_dev, m_dev, _ = obs_prune(w.cuda(), upper.cuda(), sparsity=0.5, group=group, solve="block")
    assert torch.equal(m_dev.cpu(), m_host)
    torch.testing.assert_close(w_dev.cpu(), w_host, rtol=1e-9, atol=1e-9)


@needs_cuda
def test_cuda_tensor_core_batch_gram_is_close_to_the_exact_one():
    """bfloat16 activations: the tensor cores' batch products (float32 sums) give the exact
    (float64) Gram sum to float32's rounding, and SparseGPT's update nearly the same mask."""
    from fedlib.methods.sparsegpt import SparseGPTUpdatePruner

    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(256, 64, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(64, 256, generator=gen))
    layer = layer.cuda()
    x = (torch.randn(4, 512, 256, generator=gen) * torch.exp(torch.randn(256, generator=gen))).to("cuda", torch.bfloat16)
    pruners = {mode: SparseGPTUpdatePruner(layer, "l", batch_gram=mode) for mode in ("exact", "tensor-cores")}
    for pruner in pruners.values():
        for batch in x:
            pruner.add_batch(batch)
    exact, fast = (pruners[m].hessian() for m in ("exact", "tensor-cores"))
    assert fast.dtype == torch.float64
    assert float(((fast - exact).abs() / exact.diagonal().sqrt().outer(exact.diagonal().sqrt())).max()) < 1e-4
    masks = {m: p.prune(0.5, "row", 0) for m, p in pruners.items()}
    assert float((masks["exact"] == masks["tensor-cores"]).float().mean()) >= 0.99


def _net_peak(model, ids, placement) -> tuple[int, float]:
    """Device bytes at the peak of a perplexity run above what the device held before it
    (after a warm-up matmul, so that cuBLAS's workspace is there already), and the perplexity."""
    from fedlib.evaluate.perplexity import perplexity

    warm = torch.ones(256, 256, device=placement.device)
    float((warm @ warm).sum())
    del warm
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ppl = perplexity(model, ids, batch_size=2, placement=placement)["ppl"]
    return torch.cuda.max_memory_allocated() - base, ppl


@needs_cuda
def test_cuda_peak_memory_does_not_grow_with_depth():
    """Perplexity streams the blocks: the device holds one block at a time, so an 8-block model
    peaks within half a block of a 1-block model of the same width (same activations, same
    library workspaces: what torch and cuBLAS allocate besides is the same in both runs)."""
    from fedlib.evaluate.perplexity import perplexity

    ids = torch.randint(0, 128, (4, 64))
    cuda = Placement.resolve("cuda", "float32")
    shallow, deep = tiny_llama(layers=1, hidden=1536), tiny_llama(layers=8, hidden=1536)
    block_bytes = sum(p.numel() * 4 for p in deep.model.layers[0].parameters())
    shallow_peak, _ = _net_peak(shallow, ids, cuda)
    deep_peak, on_gpu = _net_peak(deep, ids, cuda)
    assert shallow_peak >= block_bytes  # the block did go to the device
    assert deep_peak - shallow_peak < 0.5 * block_bytes, (shallow_peak, deep_peak, block_bytes)
    assert on_gpu == pytest.approx(perplexity(deep, ids, batch_size=2)["ppl"], rel=1e-4)


@needs_cuda
def test_cuda_mask_file_unpacks_on_the_device(tmp_path):
    """A GPU evaluation reads a mask file's bits on the device: the same masks as the host's,
    checked there, and with weight scaling the same vote counts."""
    from fedlib.maskfile import MaskFile, write_mask_file
    from fedlib.models import fingerprint, prunable_layers
    from fedlib.pruned import PrunedModel

    model = tiny_llama(hidden=64)
    layers = prunable_layers(model)
    masks = prune_locally(model, torch.randint(0, 128, (2, 16)), Pruning("wanda", 0.5, "row", 0)).masks
    votes = {n: m.to(torch.uint8) * 2 for n, m in masks.items()}
    path = tmp_path / "global.mask.safetensors"
    write_mask_file(path, masks, layers, fingerprint=fingerprint(model), role="global", client_id="server",
                    method="fedprllm[wanda]", group="row", sparsity=0.5, n_samples=4, seed=0, n_clients=2, votes=votes)
    handle = ModelHandle.of(model)
    host, device = PrunedModel(handle, path, scale=True), PrunedModel(handle, path, scale=True, device=CUDA0)
    for index in range(handle.n_blocks):
        on_host, on_device = host.decision(index), device.decision(index)
        for name, mask in on_host.masks.items():
            assert on_device.masks[name].device == CUDA0
            assert torch.equal(on_device.masks[name].cpu(), mask)
            assert torch.equal(on_device.factors[name].cpu(), on_host.factors[name])


@needs_cuda
@pytest.mark.parametrize("group", ["layer", "row", "column", "2:4"])
def test_cuda_selection_equals_host_selection(group):
    """The same score matrices selected on the GPU (kthvalue, int64 keys there) and on the host
    (numpy): the same masks, ties included (the embedded model's 4-bit weights and the server's
    vote counts tie all the time)."""
    gen = torch.Generator().manual_seed(2)
    for scores in (torch.randint(0, 5, (96, 128), generator=gen).float(),
                   torch.rand(96, 128, generator=gen).to(torch.bfloat16).float(),
                   torch.rand(300, 512, generator=gen)):
        for sparsity in (0.3, 0.5, 0.7):
            host = prune_lowest_scores(scores, sparsity, group)
            device = prune_lowest_scores(scores.to(CUDA0), sparsity, group)
            assert device.device == CUDA0
            assert torch.equal(host, device.cpu())


def prune_lowest_scores(scores, sparsity, group):
    from fedlib.groups import prune_lowest

    return prune_lowest(scores, sparsity, group, seed=4, name="layer")
