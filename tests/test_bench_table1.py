"""The pure parts of Table 1's benchmarks (bench_cpu_tolerance: mask comparison; bench_eval_windows:
projected intervals) and the README renderer; the benches run the workflow or the model for
minutes, which CI does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tools"))

import bench_cpu_tolerance  # noqa: E402
import bench_eval_windows  # noqa: E402
import readme_figures  # noqa: E402


def _masks(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"model.layers.{b}.{name}": torch.rand(shape, generator=g) < 0.5
            for b in range(3) for name, shape in (("self_attn.q_proj", (4, 6)), ("mlp.up_proj", (5, 3)))}


def test_compare_masks_counts_every_decision_that_differs_per_block():
    a = _masks(0)
    b = {k: v.clone() for k, v in a.items()}
    b["model.layers.1.mlp.up_proj"][2, 1] ^= True
    b["model.layers.2.self_attn.q_proj"][:, 0] ^= True
    got = bench_cpu_tolerance.compare_masks(a, b)
    # by hand: 1 + 4 decisions differ, in blocks 1 and 2, of 3 * (24 + 15) = 117 weights
    assert got == {"differing": 5, "weights": 117, "fraction": 5 / 117, "blocks_differing": 2, "blocks": 3,
                   "first_block_differing": 1, "block0_fraction": 0.0}
    assert bench_cpu_tolerance.compare_masks(a, a)["first_block_differing"] is None
    with pytest.raises(ValueError, match="different layers"):
        bench_cpu_tolerance.compare_masks(a, {k: v for k, v in a.items() if "layers.2." not in k})


def test_readme_block_states_the_largest_moves():
    ppl = {"wikitext2": 60.0, "c4": 70.0}
    kernels = {"default": {"env": {}, "capability": "AVX512", "perplexity": {"dense": ppl, "centralized": ppl}}}
    for name, change in (("aten-avx2", 0.004), ("avx2", -0.012)):
        kernels[name] = {
            "env": {"ATEN_CPU_CAPABILITY": "avx2"}, "capability": "AVX2",
            "masks_vs_default": {"centralized": {"fraction": abs(change) / 10, "blocks_differing": 29, "blocks": 30,
                                                 "first_block_differing": 1}},
            "ppl_change_vs_default": {"dense": {"wikitext2": 0.0, "c4": 0.0001},
                                      "centralized": {"wikitext2": change, "c4": change / 2}},
            "summary": {"max_mask_fraction": abs(change) / 10, "max_abs_ppl_change": abs(change),
                        "max_abs_dense_ppl_change": 0.0001, "tokens_identical": True}}
    data = {"config": "config.yaml", "setting": "c4-32x512/iid-16/wanda-0.5-row", "threads": 1,
            "evaluation": {"windows": 16, "seqlen": 512}, "variants": ["dense", "centralized"], "kernels": kernels,
            "machine": {"cpus": 2, "machine": "x86_64", "torch": "2.13.0+cpu"}, "commit": "abc1234"}
    text = readme_figures.cpu_tolerance(data)
    assert "| `avx2` | Centralized | 0.120% | 29 of 30 (1) | -1.20% | -0.60% |" in text
    assert "| `aten-avx2` | Dense | - | - | +0.00% | +0.01% |" in text
    assert text.endswith("masks differ in up to 0.12% of the weights, and the pruned rows' perplexities move by up "
                         "to 1.20% (`avx2`; Dense 0.01%).")


def test_eval_windows_projects_the_t_interval_of_n_windows():
    """The projected half-width against scipy's t interval on n differences with that sd."""
    from scipy import stats

    d = [0.03, -0.01, 0.02, 0.05, 0.00, 0.04]
    got = bench_eval_windows.comparison([1.0 + x for x in d], [1.0] * 6)
    lo, hi = stats.t.interval(0.95, 5, loc=sum(d) / 6, scale=stats.sem(d))
    assert got["mean"] == pytest.approx(sum(d) / 6) and got["windows"] == 6
    # the projection at the measured count is exactly the interval of the measured differences
    assert bench_eval_windows.half_width(got["sd"], 6) == pytest.approx((hi - lo) / 2)
    assert got["resolved_at"]["8"] == (got["mean"] > got["half_width"]["8"])
    assert got["half_width"]["64"] < got["half_width"]["16"] < got["half_width"]["8"]


def test_readme_block_of_the_window_count():
    c = bench_eval_windows.comparison([1.02, 1.05, 1.01, 1.04], [1.0, 1.0, 1.0, 1.0])
    data = {"setting": "c4-32x512/iid-16/wanda-0.5-row", "windows_per_dataset": 4, "seqlen": 512, "threads": 1,
            "cpu_seconds": {"centralized": 100.0, "local_0": 110.0}, "cpu_seconds_per_window": 1.25,
            "make_run_windows": 16, "comparisons": {"c4": {"FedPrLLM (layer) vs Local-only": c}},
            "machine": {"cpus": 2, "machine": "x86_64", "torch": "2.13.0+cpu"}, "commit": "abc1234"}
    text = readme_figures.eval_windows(data)
    assert "a window costs **1.25 CPU-seconds** per variant (median over 2 variants)" in text
    # mean 0.03, sd 0.01826: ± t(0.975, n-1) · sd / √n, resolved where the mean is outside
    assert text.splitlines()[-1] == ("| C4 | FedPrLLM (layer) vs Local-only | +3.00% | 0.0183 "
                                     "| ±1.53%* / ±0.97%* / ±0.77%* / ±0.66%* / ±0.46%* |")
