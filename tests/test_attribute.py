"""Attribute inference (fedlib.privacy.stages.attribute): the game's data sets, its scores and its table."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pytest
import torch

import fedlib.privacy.stages.attribute as attribute
from fedlib.client import Pruning
from fedlib.privacy.stages.attribute import attribute_audit, term_rows

torch.set_num_threads(1)


def _ids(n, seqlen=8, vocab=128, seed=0):
    return torch.randint(0, vocab, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def test_term_rows_is_a_whole_word_match_in_any_case():
    texts = ["Water is wet", "waterfall", "under-water", "the WATER.", "tapwater", ""]
    brute = [any(w.lower() == "water" for w in re.split(r"[^A-Za-z0-9_]+", t)) for t in texts]
    assert term_rows(texts, "water").tolist() == brute == [True, False, True, True, False, False]


def test_game_keeps_the_attackers_and_the_clients_windows_apart(monkeypatch):
    """With a stand-in for the client's mask computation (bit 0: some row has the property; the
    other bits: which rows), the game's data sets are recorded: shadows use the attacker's half,
    observations the client's, each data set has the asked size and at most one row with the
    property, and a property the mask shows outright is found (AUC 1)."""
    with_rows = torch.full((6, 4), 1)
    with_rows[:, 1] = torch.arange(6)
    without_rows = torch.zeros(10, 4, dtype=torch.long)
    without_rows[:, 1] = torch.arange(100, 110)
    population = torch.cat([without_rows, with_rows])
    calls = []

    def fake_masks(model, ids, *args, **kwargs):
        rows = [int(r) for r in ids[:, 1]]
        calls.append(rows)
        bits = torch.zeros(1 + 116, dtype=torch.bool)
        bits[0] = any(r < 100 for r in rows)
        bits[1 + torch.tensor(rows)] = True
        return {"layer": bits}

    monkeypatch.setattr(attribute, "client_masks", fake_masks)
    monkeypatch.setattr("fedlib.models.fingerprint", lambda model: "fake")
    res = attribute_audit(None, with_rows, without_rows, trials=5, samples=3, pairs=6, pruning=Pruning(seed=1))
    assert len(calls) == res["masks_computed"] == 2 * (6 + 5)
    shadows, observations = calls[:12], calls[12:]
    assert all(len(c) == 3 and sum(r < 100 for r in c) <= 1 for c in calls)
    attacker = {r for c in shadows for r in c}
    client = {r for c in observations for r in c}
    assert not attacker & client
    assert len(attacker | client) <= len(population)
    # a pair (R + a, R + b) shares R; the with-sets of the observations are the even calls
    assert all(a[:2] == b[:2] and a[2] < 100 <= b[2] for a, b in zip(shadows[::2], shadows[1::2]))
    assert [any(r < 100 for r in c) for c in observations] == [True, False] * 5
    assert res["attack"]["auc"] == 1.0
    assert res["attacker_rows"] == {"with": 3, "without": 5} and res["client_rows"] == {"with": 3, "without": 5}
    with pytest.raises(ValueError, match="6 rows without the property: the attacker's half has 3, a data set of 4"):
        attribute_audit(None, with_rows, without_rows[:6], trials=2, samples=4, pairs=4)


def test_a_domain_of_constant_windows_is_found_on_a_real_tiny_model(model):
    """Windows of a small vocabulary of their own (a 'domain') move the block inputs' statistics
    one way: the attack on the tiny model's whole mask separates the data sets that hold one."""
    res = attribute_audit(model, _ids(8, vocab=6, seed=3), 6 + _ids(16, vocab=122, seed=4), trials=8, samples=2,
                          pairs=8, pruning=Pruning(seed=0))
    assert res["observed_layers"] == 14 and res["blocks"] is None
    assert res["attack"]["auc"] == 1.0
    assert res["direction_support"] > 0 and 0 < res["pair_hamming"] < 0.5
    assert len(res["scores_with"]) == len(res["scores_without"]) == 8


def test_attribute_table_pools_the_seeds_games(model, tmp_path):
    """Per-seed rows are each game's attack; the pooled row's AUC is the Mann-Whitney AUC of all the
    property's games together, by brute force; a game of other sizes is refused."""
    from fedlib.privacy.tables.attribute import attribute_table

    with_rows = _ids(8, vocab=6, seed=3)
    files = []
    for seed in (0, 1):
        res = attribute_audit(model, with_rows, _ids(12, seed=5), trials=3, samples=2, pairs=4, pruning=Pruning(seed=seed))
        files.append(tmp_path / f"seed{seed}.json")
        files[-1].write_text(json.dumps(res))
    games = [json.loads(f.read_text()) for f in files]
    spec = {"context": {"model": "tiny", "seed": 0}, "out_dir": str(tmp_path), "dataset": "c4",
            "properties": [{"label": "domain: constant", "results": [str(f) for f in files]}]}
    paths = attribute_table(spec)
    assert [p.name for p in paths] == ["privacy_attribute.md", "privacy_attribute.csv", "privacy_attribute.html"]
    body = [r for r in csv.reader(io.StringIO(paths[1].read_text())) if r and r[0] == "domain: constant"]
    assert [r[1] for r in body][:2] == ["0", "1"] and body[2][1].startswith("pooled, 2 seeds")
    for row, game in zip(body, games):
        assert row[3].startswith(f"{game['attack']['auc']:.3f}")
    pos = np.array([s for g in games for s in g["scores_with"]])
    neg = np.array([s for g in games for s in g["scores_without"]])
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    assert body[2][3].startswith(f"{wins / (pos.size * neg.size):.3f}") and body[2][2] == "6 / 6"
    md = paths[0].read_text()
    assert "client data sets with the property (1 window without it + one with it)" in md

    other = json.loads(files[1].read_text())
    other["trials"] = 5
    files[1].write_text(json.dumps(other))
    with pytest.raises(ValueError, match="seed1.json: a game of"):
        attribute_table(spec)


def test_cli_names_the_file_when_the_windows_cannot_play(tiny_model_dir, tmp_path, capsys):
    """A domain pool of other window lengths, or a term too rare in the population, is refused
    before any mask is computed, with the file and what was expected."""
    from fedlib.cli import main
    from fedlib.data import save_tokens

    population, short, out = tmp_path / "pop.safetensors", tmp_path / "short.safetensors", tmp_path / "a.json"
    save_tokens(population, _ids(8, seqlen=8, vocab=200))
    save_tokens(short, _ids(4, seqlen=6, vocab=200))
    common = ["privacy", "attribute", "--model", str(tiny_model_dir), "--population", str(population),
              "--out", str(out)]
    assert main(common + ["--domain-pool", str(short)]) == 2
    assert f"{short}: rows of 6 tokens, {population} has 8" in capsys.readouterr().err
    assert main(common + ["--term", "zebra"]) == 2
    assert f"{population}: 0 of its 8 windows contain 'zebra'; the game needs at least 2" in capsys.readouterr().err
    assert not out.exists()
