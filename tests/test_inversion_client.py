"""The server inverts a client's uploaded mask file to its whole calibration set
(fedlib.privacy.stages.inversion.client_inversion, fedlib.privacy.inversion.refine_bag) and the
table over clients (fedlib.privacy.tables.inversion_client.inversion_client_table)."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest
import torch
from scipy import stats

from fedlib.client import Pruning, prune_locally
from fedlib.maskfile import MaskFileError, write_mask_file
from fedlib.models import fingerprint, prunable_layers
from fedlib.privacy.tables.inversion_client import inversion_client_table
from fedlib.privacy.inversion import QKV, _Problem, refine_bag, token_sq_activations, wanda_block0_masks
from fedlib.stats import t_interval
from fedlib.privacy.stages.inversion import client_inversion, tiny_llama_for_inversion

torch.set_num_threads(1)
VOCAB = 32


def _upload(path, model, ids, method="wanda"):
    """A client's mask file as `fedlib client-mask` writes it: the real block-by-block client loop."""
    masks = prune_locally(model, ids, Pruning(method, 0.5, "row", 0)).masks
    write_mask_file(path, masks, prunable_layers(model), fingerprint=fingerprint(model), role="client",
                    client_id="client_0", method=method, group="row", sparsity=0.5, n_samples=ids.shape[0], seed=0)


def _priors():
    flat = torch.full((VOCAB,), 1.0 / VOCAB, dtype=torch.float64)
    peaked = torch.arange(1, VOCAB + 1, dtype=torch.float64)
    return {"flat": flat, "peaked": peaked / peaked.sum()}


def test_the_upload_is_the_bag_mask_and_the_attack_ignores_positions(tmp_path):
    """The client's real mask file equals the bag's Wanda masks; a shard with its tokens moved
    to other positions and rows gives the server the same masks, so the same attack result."""
    model = tiny_llama_for_inversion(0)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    moved = ids.flatten()[torch.randperm(12, generator=torch.Generator().manual_seed(4))].reshape(2, 6)
    results = []
    for name, shard in (("a", ids), ("b", moved)):
        _upload(tmp_path / f"{name}.mask.safetensors", model, shard)
        results.append(client_inversion(model, tmp_path / f"{name}.mask.safetensors", shard, _priors(), "peaked",
                                        steps=40, refine_moves=10, n_candidates=VOCAB))
    res, other = results
    assert res["upload_is_bag_mask"] == {f"model.layers.0.{s}": True for s in QKV}
    assert res["tokens"] == 12 and (res["samples"], res["seqlen"]) == (2, 6)
    assert sorted(other["decoded_tokens"]) == sorted(res["decoded_tokens"])
    assert other["mask_agreement"] == res["mask_agreement"]
    target = ids.flatten().tolist()
    overlap = sum((Counter(res["decoded_tokens"]) & Counter(target)).values()) / 12
    assert res["bag_overlap"] == pytest.approx(overlap)
    assert len(res["decoded_tokens"]) == len(res["gradient_tokens"]) == 12
    assert res["mask_agreement"] >= res["gradient_agreement"]  # a move is kept only if it raises the agreement
    assert res["true_tokens_agreement"] == 1.0
    assert set(res["unigram_bag_overlap"]) == {"flat", "peaked"}


def test_one_move_is_the_best_single_move_found_by_brute_force():
    """With every token as a removal and an addition, one step of refine_bag reaches the best
    agreement over all single moves, each scored independently with prune_lowest's masks."""
    model = tiny_llama_for_inversion(1)
    true_bag = [3, 3, 8, 20, 27, 30]
    layers = [f"model.layers.0.{s}" for s in QKV]
    target = wanda_block0_masks(model, true_bag, layers)
    start = [3, 5, 8, 20, 11, 30]
    prob = _Problem(model, target, 0.5, "row")
    U = token_sq_activations(model)
    counts = torch.bincount(torch.tensor(start), minlength=VOCAB)
    refined, agreement = refine_bag(prob, U, counts, torch.arange(VOCAB), 1, 0.01, removals=VOCAB,
                                    additions=VOCAB)

    def exact(bag):
        masks = wanda_block0_masks(model, bag, layers)
        return sum(int((masks[n] == target[n]).sum()) for n in layers)

    best = max(exact([b if t == a and i == start.index(a) else t for i, t in enumerate(start)])
               for a in set(start) for b in range(VOCAB) if b != a)
    assert best > exact(start) and agreement == best
    assert int(refined.sum()) == len(start) and int((refined - counts).abs().sum()) == 2
    assert exact(torch.repeat_interleave(torch.arange(VOCAB), refined).tolist()) == best


def test_the_server_refuses_an_upload_it_cannot_invert(tmp_path):
    model = tiny_llama_for_inversion(0)
    ids = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))
    _upload(tmp_path / "m.mask.safetensors", model, ids, method="magnitude")
    with pytest.raises(MaskFileError, match=r"m\.mask\.safetensors: field 'method'"):
        client_inversion(model, tmp_path / "m.mask.safetensors", ids, _priors(), "flat", steps=1)
    _upload(tmp_path / "w.mask.safetensors", model, ids)
    with pytest.raises(MaskFileError, match="field 'n_samples': 2, but the client's shard has 1 rows"):
        client_inversion(model, tmp_path / "w.mask.safetensors", ids[:1], _priors(), "flat", steps=1)


def test_t_interval_is_students():
    values = [0.41, 0.38, 0.47, 0.44]
    mean, lo, hi = t_interval(values)
    expected = stats.t.interval(0.95, len(values) - 1, loc=sum(values) / 4, scale=stats.sem(values))
    assert (lo, hi) == pytest.approx(expected) and mean == pytest.approx(0.425)
    with pytest.raises(ValueError, match="at least 2 values"):
        t_interval([0.4])


def _result(client, bag, gradient, heldout, wiki, **changes):
    res = {"model_fingerprint": "f" * 16, "client_id": f"client_{client}", "layers": [f"model.layers.0.{s}" for s in QKV],
           "sparsity": 0.5, "group": "row", "seed": 0, "steps": 300, "refine_moves": 200, "candidates": 2048,
           "init_prior": "heldout", "tokens": 1024, "samples": 2, "seqlen": 512, "distinct_tokens": 500,
           "upload_is_bag_mask": {f"model.layers.0.{s}": True for s in QKV}, "bag_overlap": bag,
           "gradient_bag_overlap": gradient, "moves": 17, "mask_agreement": 0.998, "baseline_agreement": 0.98,
           "unigram_bag_overlap": {"heldout": heldout, "wikitext2": wiki}}
    return {**res, **changes}


def test_table_has_a_row_per_client_and_the_mean_with_t_intervals(tmp_path):
    figures = [(0.45, 0.42, 0.33, 0.21), (0.40, 0.39, 0.35, 0.22), (0.48, 0.44, 0.30, 0.20)]
    paths = []
    for i, f in enumerate(figures):
        paths.append(tmp_path / f"client_{i}.json")
        paths[-1].write_text(json.dumps(_result(i, *f)))
    spec = {"context": {"model": "m", "config": "c", "seed": 0}, "out_dir": str(tmp_path),
            "priors": {"heldout": "C4 held-out text", "wikitext2": "WikiText-2"}, "results": [str(p) for p in paths]}
    inversion_client_table(spec)
    rows = list(csv.reader((tmp_path / "privacy_inversion_client.csv").open()))
    body = [r for r in rows if r and r[0].startswith(("client_", "mean of"))]
    assert [r[0] for r in body] == ["client_0", "client_1", "client_2", "mean of 3 clients [95 % t interval]"]
    for column, stage in ((7, 1), (8, 0)):  # gradient stage, after the moves
        gains = [f[stage] - f[2] for f in figures]
        lo, hi = stats.t.interval(0.95, 2, loc=sum(gains) / 3, scale=stats.sem(gains))
        assert body[3][column] == f"{100 * sum(gains) / 3:+.1f} pp [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    bags = [b for b, *_ in figures]
    lo, hi = stats.t.interval(0.95, 2, loc=sum(bags) / 3, scale=stats.sem(bags))
    assert body[3][4] == f"{100 * sum(bags) / 3:.1f} % [{100 * lo:.1f} %, {100 * hi:.1f} %]"
    assert body[0][2] == "yes" and body[0][4] == "45.0 % (17)"

    paths[1].write_text(json.dumps(_result(1, *figures[1], steps=100)))
    with pytest.raises(ValueError, match="client_1.json: {'steps': \\(100, 300\\)}"):
        inversion_client_table(spec)
