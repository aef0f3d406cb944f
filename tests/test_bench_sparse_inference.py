"""benchmarks/bench_sparse_inference.py on the CPU at a tiny size: its 2:4 masks, its perplexities
against independent computations, and what it records where the sparse kernels do not exist."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_llama

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_sparse_inference as bench  # noqa: E402


def smallest_two_of_four(weight: torch.Tensor) -> torch.Tensor:
    """The 2 lowest-magnitude weights of every 4 consecutive inputs (True = pruned), by topk."""
    groups = weight.abs().reshape(-1, 4)
    lowest = groups.topk(2, dim=1, largest=False).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(1, lowest, True).reshape(weight.shape)


def test_two_sides_prune_the_smallest_two_of_every_four():
    model = tiny_llama(hidden=64)
    linears = {f"model.layers.{i}.mlp.{n}": getattr(block.mlp, n)
               for i, block in enumerate(model.model.layers) for n in ("gate_proj", "up_proj", "down_proj")}
    expected = {name: smallest_two_of_four(linear.weight.detach()) for name, linear in linears.items()}
    before = {name: linear.weight.detach().clone() for name, linear in linears.items()}
    sides = bench.TwoSides(linears)
    assert sides.pruned * 2 == sides.weights == sum(m.numel() for m in expected.values())
    for name, linear in linears.items():
        weight = linear.weight.detach()
        assert torch.equal(weight == 0, expected[name])
        assert torch.equal(weight[~expected[name]], before[name][~expected[name]])  # survivors untouched
    if not torch.cuda.is_available():  # the host has no semi-structured kernels: the dense side only
        assert not sides.supported and "CUDA" in sides.unsupported and sides.sparse == {}


def test_embedded_perplexity_matches_independent_losses():
    model = tiny_llama(hidden=64).float()
    windows = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(4)  # any 2:4 masks (2 random of every 4), not the magnitude ones
    linears = {name: m for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.startswith("model.layers.")}
    masks = {name: torch.zeros(m.weight.numel() // 4, 4, dtype=torch.bool)
             .scatter_(1, torch.rand(m.weight.numel() // 4, 4, generator=gen).argsort(1)[:, :2], True)
             .reshape(m.weight.shape) for name, m in linears.items()}
    reference = tiny_llama(hidden=64).float()  # the same seed: the same weights, pruned here by hand
    with torch.no_grad():
        dense_loss = torch.stack([reference(input_ids=w[None], labels=w[None]).loss for w in windows]).mean()
        for name, mask in masks.items():
            reference.get_submodule(name).weight[mask] = 0
        pruned_loss = torch.stack([reference(input_ids=w[None], labels=w[None]).loss for w in windows]).mean()
    row = bench.embedded_perplexity(model, windows, torch.device("cpu"), masks)
    # equal-length windows: the mean of the windows' mean losses is the mean over all tokens
    assert math.isclose(row["ppl"]["dense"], math.exp(dense_loss), rel_tol=1e-5)
    assert math.isclose(row["ppl"]["2:4"], math.exp(pruned_loss), rel_tol=1e-5)
    assert row["pruned_fraction"] == 0.5 and row["ppl"]["2:4"] != row["ppl"]["dense"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: what the script records without the kernels")
def test_cpu_mode_records_no_speedup():
    args = bench.parser().parse_args(["--device", "cpu", "--shape", "tiny", "--blocks", "1", "--batch", "1",
                                      "--seqlen", "32", "--decode-prompt", "8", "--decode-steps", "3",
                                      "--repeats", "1", "--ppl-windows", "0", "--no-write"])
    record = bench.run(args)
    assert record["device"] == "cpu" and record["dtype"] == "float32"
    assert not record["sparse_kernels"]["supported"] and "CUDA" in record["sparse_kernels"]["error"]
    mlp, e2e = record["mlp"], record["end_to_end"]
    assert mlp["speedup"] is None and "sparse_tokens_per_s" not in mlp and mlp["dense_tokens_per_s"] > 0
    assert e2e["prefill"]["speedup"] is None and e2e["decode"]["speedup"] is None
    assert e2e["decode"]["dense_ms_per_token"] > 0 and len(e2e["prefill"]["dense_seconds"]) == 1
    assert e2e["pruned"] * 2 == e2e["weights"] and e2e["masks_identical"] is None
    assert all(row["met"] is None for row in record["goals"].values())


def test_the_row_major_side_copies_a_transposed_output_and_the_others_keep_it():
    """The sparse kernels return x @ W.T as a transposed view; the row-major side hands attention the
    same values laid out row-major, and the dense and plain sparse sides leave outputs as they are."""
    linear = torch.nn.Linear(8, 4, bias=False)
    sides = bench.TwoSides({"l": linear})
    view = torch.randn(4, 6).T  # what the kernels give: (tokens, out) with column-major strides
    assert not view.is_contiguous()
    sides.row_major = False
    assert sides._copy_row_major(linear, (), view) is None  # a hook returning None keeps the output
    sides.row_major = True
    copied = sides._copy_row_major(linear, (), view)
    assert copied.is_contiguous() and torch.equal(copied, view)
    x = torch.randn(3, 8)
    sides.use("dense")
    assert not sides.row_major and torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight))
