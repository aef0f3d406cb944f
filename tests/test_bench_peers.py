"""The pure parts of benchmarks/bench_peers.py (agreement, pruned weights, record schema) and its
README renderer; the bench itself needs .venv-peers (llmcompressor), which CI does not build."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tools"))

import bench_peers  # noqa: E402
import readme_figures  # noqa: E402
from fedlib.runner import BlockDecision  # noqa: E402


def test_zero_agreement_counts_weights_zero_in_both_or_nonzero_in_both():
    ours = {"a": torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0]]), "b": torch.tensor([[5.0, 0.0]])}
    theirs = {"a": torch.tensor([[0.0, 0.0, 7.0], [1.0, 0.0, 3.0]]), "b": torch.tensor([[0.0, 0.0]])}
    # by hand: a agrees at (0,0) (0,2) (1,1) (1,2) = 4 of 6; b at (0,1) = 1 of 2
    assert bench_peers.zero_agreement(ours, theirs) == pytest.approx(5 / 8)
    assert bench_peers.zero_agreement(ours, ours) == 1.0


def test_zero_agreement_refuses_different_layers_or_shapes():
    w = torch.ones(2, 2)
    with pytest.raises(ValueError, match="pruned layers differ"):
        bench_peers.zero_agreement({"a": w}, {"a": w, "b": w})
    with pytest.raises(ValueError, match="a: fedlib shape"):
        bench_peers.zero_agreement({"a": w}, {"a": torch.ones(2, 3)})


def test_pruned_weights_masks_the_model_weight_unless_an_update_is_given(model):
    q, k = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"
    q_weight = model.get_submodule(q).weight.detach().clone()
    mask = torch.zeros_like(q_weight, dtype=torch.bool)
    mask[0, :3] = True
    update = torch.full_like(model.get_submodule(k).weight, 0.5)
    weights = bench_peers.pruned_weights(model, BlockDecision(
        masks={q: mask, k: torch.zeros_like(update, dtype=torch.bool)}, weights={k: update}))
    assert set(weights) == {q, k}
    assert torch.equal(weights[q][0, :3], torch.zeros(3))
    assert torch.equal(weights[q][~mask], q_weight[~mask])
    assert torch.equal(weights[k], update)
    assert torch.equal(model.get_submodule(q).weight, q_weight)  # the model is left as it was


FIGURES = {"agreement": 0.99, "fedlib_sparsity": 0.5, "peer_sparsity": 0.5, "fedlib_ppl": 20.0, "peer_ppl": 21.0,
           "ppl_ratio": 20 / 21, "ppl_ratio_ci": [0.94, 0.96]}


def test_record_ratio_is_median_over_median_and_the_schema_is_complete():
    ours, theirs = [3.0, 1.0, 2.0], [10.0, 4.0, 40.0]
    r = bench_peers.record("wanda", "row", "wanda", ours, theirs, **FIGURES)
    assert r["ratio"] == pytest.approx(statistics.median(ours) / statistics.median(theirs)) == pytest.approx(0.2)
    assert set(r) == set(bench_peers.RECORD_KEYS) and r["peer"] == "llmcompressor"
    with pytest.raises(ValueError, match="3 fedlib runs vs 2 peer runs"):
        bench_peers.record("wanda", "row", "wanda", ours, theirs[:2], **FIGURES)
    assert r["goal_met"] is True  # 0.2x and the ppl interval ends below 1
    with pytest.raises(ValueError, match=r"missing \['peer_ppl'\]"):
        bench_peers.record("wanda", "row", "wanda", ours, theirs, **{k: v for k, v in FIGURES.items() if k != "peer_ppl"})


def _payload(records):
    return {"model": "m", "sparsity": 0.5, "threads": 2, "calibration": {"dataset": "c4", "samples": 8, "seqlen": 512},
            "evaluation": {"dataset": "wikitext2", "windows": 16, "seqlen": 512}, "repeats": 3,
            "batch_size": {"fedlib": 8, "peer": 1}, "peer_versions": {"llmcompressor": "0"}, "dense_ppl": 15.0,
            "goal": bench_peers.GOAL, "records": records}


def test_readme_table_states_the_goal_per_method():
    """Met: fast enough, and the ppl interval ends within the margin (even if its middle is above 1)."""
    fast_better = bench_peers.record("wanda", "row", "wanda", [1.0], [2.0], **FIGURES)
    fast_equal = bench_peers.record("sparsegpt_update", "layer", "sparsegpt", [1.0], [2.0],
                                    **{**FIGURES, "ppl_ratio": 1.003, "ppl_ratio_ci": [0.998, 1.008]})
    fast_worse = bench_peers.record("sparsegpt_update", "layer", "sparsegpt", [1.0], [2.0],
                                    **{**FIGURES, "ppl_ratio": 1.01, "ppl_ratio_ci": [1.002, 1.018]})
    slow_better = bench_peers.record("wanda", "layer", "wanda", [0.9], [1.0], **FIGURES)
    payload = _payload([fast_better, fast_equal, fast_worse, slow_better])
    rows = readme_figures.peers(payload).splitlines()[-4:]
    assert rows[0].startswith("| `wanda` (row) | wanda | **0.50×** | 99.00% | 20.00 | 21.00 | -4.76% [-6.00%, -4.00%] |")
    assert rows[1].split("|")[7].strip() == "+0.30% [-0.20%, +0.80%]"
    assert [row.rsplit("|", 2)[1].strip() for row in rows] == ["met", "met", "NOT met", "NOT met"]


def test_pruned_quality_scores_each_window_and_agrees_with_the_batched_perplexity(model):
    """The per-window scoring gives the perplexity of all windows scored together, and the same
    weights on both sides give a ratio of exactly 1 with a zero-width interval."""
    from fedlib.client import Pruning, prune_locally
    from fedlib.evaluate.perplexity import perplexities

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    windows = torch.randint(0, 128, (5, 16), generator=torch.Generator().manual_seed(2))
    decision = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0))
    weights = bench_peers.pruned_weights(model, decision)
    q = bench_peers.pruned_quality(model, windows, 2, {"wanda": decision}, {"wanda": dict(weights)})
    (together,), _ = perplexities(model, [windows], 2, variant=lambda _b: BlockDecision(masks={}, weights=weights))
    (dense,), _ = perplexities(model, [windows], 2)
    assert q["wanda"]["fedlib_ppl"] == pytest.approx(together["ppl"], rel=1e-6)
    assert q["dense"] == pytest.approx(dense["ppl"], rel=1e-6)
    assert q["wanda"]["ppl_ratio"] == 1.0 and q["wanda"]["ppl_ratio_ci"] == [1.0, 1.0]
    assert q["wanda"]["agreement"] == 1.0
