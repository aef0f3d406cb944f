"""Membership with shadows shared by every target (fedlib.privacy.stages.membership_shared): the
statistic's inputs against direct computations, the game's data sets, the LiRA scores and the
intervals against brute force, a real game on a tiny model and its table."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from scipy import stats

from fedlib.client import Pruning
from fedlib.privacy.stages.membership_shared import (
    balanced_partitions, designated_sets, kept_columns, membership_shared_audit, pair_summary, relative_deviations,
    row_statistics, shared_lira,
)

from conftest import tiny_llama

torch.set_num_threads(1)


def _ids(n, seqlen=8, vocab=128, seed=0):
    return torch.randint(0, vocab, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def _linear_inputs(model, ids) -> dict[str, torch.Tensor]:
    """Per linear, each row's per-channel sum of squared inputs in one plain forward."""
    seen = {}
    hooks = [module.register_forward_hook(
        lambda _m, inp, _out, n=name: seen.__setitem__(n, (inp[0].double() ** 2).sum(1)))
        for name, module in model.named_modules() if isinstance(module, torch.nn.Linear) and ".layers." in name]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return seen


def test_row_statistics_against_plain_forwards():
    """Block 0's linears see the dense block (a plain forward of the dense model); block 1's
    attention input comes from block 0 pruned by the population's mask (a plain forward of the
    model with that mask applied)."""
    from fedlib.privacy.stages.recompute import client_masks

    model, ids = tiny_llama(), _ids(6)
    got = row_statistics(model, ids, Pruning(batch_size=4))
    dense = _linear_inputs(model, ids)
    for name in [n for n in dense if ".layers.0." in n]:
        assert torch.allclose(got[name], dense[name], rtol=1e-5), name
    masked = tiny_llama()
    with torch.no_grad():
        for name, mask in client_masks(model, ids).items():
            masked.get_submodule(name).weight[mask] = 0
    pruned = _linear_inputs(masked, ids)
    for leaf in ("q_proj", "k_proj", "v_proj"):
        name = f"model.layers.1.self_attn.{leaf}"
        assert torch.allclose(got[name], pruned[name], rtol=1e-5), name
        assert not torch.allclose(got[name], dense[name], rtol=1e-3)  # the recursion mattered
    assert sorted(got) == sorted(client_masks(model, ids))


def test_kept_columns_are_the_masks_column_means():
    from fedlib.privacy.stages.recompute import client_masks

    model, ids = tiny_llama(), _ids(3)
    kept = kept_columns(model, ids, Pruning(group="layer", seed=3))
    masks = client_masks(model, ids, Pruning(group="layer", seed=3))
    assert sorted(kept) == sorted(masks)
    for name, mask in masks.items():
        assert torch.equal(kept[name], (~mask).float().mean(0)), name


def test_relative_deviations():
    s = {"a": torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 2.0]], dtype=torch.float64), "b": torch.ones(2, 1).double()}
    x = relative_deviations(s, ["a", "b"])
    assert x.tolist() == [[-0.5, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0]]


def test_balanced_partitions_put_every_row_in_as_many_sets():
    sets = balanced_partitions(12, 3, 8, np.random.default_rng(0))
    assert len(sets) == 8 and all(len(s) == 3 == len(set(s)) for s in sets)
    assert np.bincount(np.concatenate(sets), minlength=12).tolist() == [2] * 12
    with pytest.raises(ValueError, match="multiple of 4"):
        balanced_partitions(12, 3, 6, np.random.default_rng(0))
    with pytest.raises(ValueError, match="does not split"):
        balanced_partitions(10, 3, 6, np.random.default_rng(0))


def test_designated_sets_follow_their_coins():
    sets, targets, member = designated_sets(10, 4, 200, np.random.default_rng(1))
    assert all(len(s) == 4 == len(set(s)) for s in sets)
    assert [t in s for s, t in zip(sets, targets)] == member
    assert 80 < sum(member) < 120  # a fair coin


def test_shared_lira_is_the_gaussian_likelihood_ratio():
    """Per target: means of its in- and out-shadows; one sd per side pooled over targets."""
    rng = np.random.default_rng(0)
    shadow_labels = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=bool)
    shadow = rng.normal(size=(4, 3))
    observed = rng.normal(size=(2, 3))
    got = shared_lira(shadow, shadow_labels, observed)

    def side(mask):
        mus = [shadow[mask[:, t], t].mean() for t in range(3)]
        resid = np.concatenate([shadow[mask[:, t], t] - mus[t] for t in range(3)])
        return mus, np.sqrt((resid**2).sum() / (resid.size - 3))

    (mu_in, sd_in), (mu_out, sd_out) = side(shadow_labels), side(~shadow_labels)
    for k in range(2):
        for t in range(3):
            want = stats.norm.logpdf(observed[k, t], mu_in[t], sd_in) - stats.norm.logpdf(observed[k, t], mu_out[t], sd_out)
            assert got[k, t] == pytest.approx(want)
    with pytest.raises(ValueError, match="at least one shadow"):
        shared_lira(shadow, np.ones_like(shadow_labels), observed)


def test_pair_summary_against_brute_force():
    rng = np.random.default_rng(2)
    labels = rng.random((6, 5)) < 0.5
    labels[0] = [True, False, True, False, False]
    scores = rng.normal(size=(6, 5)) + labels
    out = pair_summary(scores, labels, fprs=[0.1], seed=1)
    pos, neg = scores[labels], scores[~labels]
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert out["auc"] == pytest.approx(brute)
    assert out["auc_ci"][0] <= out["auc"] <= out["auc_ci"][1]
    assert (out["n_members"], out["n_nonmembers"], out["masks"]) == (int(labels.sum()), int((~labels).sum()), 6)
    separated = pair_summary(labels * 10.0, labels)
    mixed = int((labels.any(1) & (~labels).any(1)).sum())
    assert separated["auc"] == 1.0 and separated["auc_ci"] == [pytest.approx(0.025 ** (1 / mixed)), 1.0]


def test_a_real_game_on_a_tiny_model():
    """The whole pipeline on a 2-layer model: every window is a target of every client mask,
    the designated trials are the scores of the designated pairs, and the attack finds members."""
    model = tiny_llama(hidden=64)
    pop = _ids(8, seqlen=16, seed=5)
    res = membership_shared_audit(model, pop, samples=2, shadows=8, clients=6, pruning=Pruning(seed=0))
    scores, labels = np.array(res["scores"]), np.array(res["client_labels"])
    assert scores.shape == labels.shape == (6, 8)
    assert labels.sum(1).tolist() == [2] * 6
    assert [labels[k, t] for k, t in enumerate(res["designated"])] == res["designated_member"]
    assert np.bincount(np.concatenate(res["shadow_sets"]), minlength=8).tolist() == [2] * 8
    assert res["pairs"]["auc"] > 0.9, res["pairs"]
    assert res["observed_layers"] == 14 and res["observed_columns"] == 2 * (6 * 64 + 128)
    again = membership_shared_audit(model, pop, samples=2, shadows=8, clients=6, pruning=Pruning(seed=0))
    assert again["scores"] == res["scores"]  # deterministic from the seed


def test_table_pools_seeds_and_checks_sizes(tmp_path):
    from fedlib.privacy.tables.membership_shared import membership_shared_table

    model = tiny_llama(hidden=64)
    pop = _ids(4, seqlen=12, seed=7)
    size = {"samples": 2, "seqlen": 12, "population": 4, "shadows": 4, "clients": 4}
    files = []
    for seed in (0, 1):
        res = membership_shared_audit(model, pop, 2, 4, 4, Pruning(seed=seed))
        res["model_fingerprint"] = "f" * 64
        files.append(tmp_path / f"seed{seed}.json")
        files[-1].write_text(json.dumps(res))
    spec = {"context": {"model": "tiny", "config": "test", "seed": 0}, "out_dir": str(tmp_path), "dataset": "c4",
            "sizes": [{**size, "results": [str(f) for f in files]}]}
    membership_shared_table(spec)
    rows = [r for r in csv.reader((tmp_path / "privacy_membership_shared.csv").open()) if r and r[0] == "2 × 12"]
    assert [r[1] for r in rows] == ["0", "1", "pooled, 2 seeds"]
    games = [json.loads(f.read_text()) for f in files]
    pooled = pair_summary(np.concatenate([np.array(g["scores"]) for g in games]),
                          np.concatenate([np.array(g["client_labels"]) for g in games]))
    assert rows[2][3] == f"{pooled['n_members']} / {pooled['n_nonmembers']}"
    assert rows[2][4].startswith(f"{pooled['auc']:.3f} ")
    spec["sizes"][0]["shadows"] = 8
    with pytest.raises(ValueError, match="seed0.json: a game of"):
        membership_shared_table(spec)
