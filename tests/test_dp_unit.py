"""The protected unit of a DP release (fedlib.dp.unit, fedlib.data.unit_windows), the trust
model and the pool's ledger (fedlib.dp.accountant, fedlib.dp.ledger): windows located in the
text independently, sensitivities by brute force, epsilons against the exact Gaussian bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import REPO
from fedlib.data import c4_documents, ptb_rows, unit_partition, unit_windows, wikitext2_articles
from fedlib.dp.accountant import composed_epsilon, rdp_epsilon, trust_model
from fedlib.dp.distributed import DistributedTarget
from fedlib.dp.gaussian import gaussian_delta
from fedlib.dp.ledger import Ledger
from fedlib.dp.public import Deviations, NormalisedTarget, PublicPrior, View, clip_rows
from fedlib.dp.unit import CLIENT, ProtectedUnit, unit_of_tokens

#: the workflow test's slice of the mirror (.test/data): its PTB train text holds about 6,000 tokens,
#: room for the span test's 40 windows on a grid of 96, and tokenizes in a fraction of a second
SLICE = REPO / ".test" / "data"

NAMES = [f"model.layers.{b}.{m}" for b in range(2) for m in ("self_attn.q_proj", "mlp.down_proj")]


def _starts(text_ids: np.ndarray, window: np.ndarray) -> list[int]:
    """Every offset of ``window`` in ``text_ids``."""
    candidates = np.flatnonzero(text_ids[: text_ids.size - window.size + 1] == window[0])
    return [int(s) for s in candidates if np.array_equal(text_ids[s:s + window.size], window)]


def test_span_windows_share_no_token_and_k_bounds_each_span(smollm_tokenizer):
    seqlen, k = 64, 3
    windows, units = unit_windows(smollm_tokenizer, "ptb", SLICE, 40, seqlen, 0, "span", k)
    again, _ = unit_windows(smollm_tokenizer, "ptb", SLICE, 40, seqlen, 0, "span", k)
    assert torch.equal(windows, again) and windows.shape == (40, seqlen)
    text = smollm_tokenizer(" ".join(ptb_rows(SLICE, "train")), return_tensors="pt").input_ids[0].numpy()
    assert text.size // seqlen > 40  # more grid windows than drawn: the draw is a choice
    covered = np.zeros(text.size, dtype=np.int64)
    for window, unit in zip(windows.numpy(), units):
        starts = [s for s in _starts(text, window) if s % seqlen == 0]  # the disjoint grid's
        assert starts, "a window is not a cut of the text"
        covered[starts[0]:starts[0] + seqlen] += 1
        assert starts[0] // seqlen // k == unit  # its span: k consecutive windows
    assert covered.max() == 1  # no token in two windows
    assert max(np.bincount(units)) <= k


def test_document_windows_share_no_token_and_k_bounds_each_document(data_dir, smollm_tokenizer):
    seqlen, k = 32, 2
    docs = c4_documents(data_dir)[:60]
    windows, units = unit_windows(smollm_tokenizer, "c4", data_dir, 30, seqlen, 1, "document", k, (0, 60))
    assert max(np.bincount(units)) <= k
    used: dict[int, set] = {}
    for window, unit in zip(windows.numpy(), units):
        doc = smollm_tokenizer(docs[unit], return_tensors="pt").input_ids[0].numpy()
        starts = [s for s in _starts(doc, window) if s % seqlen == 0]
        assert starts, "a window is not a cut of its document"
        span = set(range(starts[0], starts[0] + seqlen))
        assert not span & used.setdefault(unit, set())
        used[unit] |= span
    with pytest.raises(ValueError, match="no documents"):
        unit_windows(smollm_tokenizer, "ptb", data_dir, 2, seqlen, 0, "document", 1)


def test_wikitext_articles_split_at_top_level_headings():
    rows = ["", " = Alpha = \n", "", " a text \n", " = = Section = = \n", " more \n", " = Beta = \n", " b \n"]
    articles = wikitext2_articles(rows)
    assert len(articles) == 3 and "Section" in articles[1] and articles[2].startswith(" = Beta")


def test_partition_keeps_each_unit_with_one_client():
    units = [5, 5, 1, 9, 1, 9, 9, 2]
    parts = unit_partition(units, 3, seed=0)
    assert sorted(r for p in parts for r in p) == list(range(len(units)))
    owners = {}
    for client, rows in enumerate(parts):
        for r in rows:
            assert owners.setdefault(units[r], client) == client


def test_token_files_without_a_unit_are_refused_for_dp(tmp_path):
    with pytest.raises(ValueError, match="field 'unit'"):
        unit_of_tokens({"dataset": "ptb"}, tmp_path / "calib.safetensors")
    with pytest.raises(ValueError, match="windows_per_unit"):
        unit_of_tokens({"unit": "span", "windows_per_unit": 0}, "x")
    assert unit_of_tokens({"unit": "document", "windows_per_unit": 4}, "x") == ProtectedUnit("document", 4)
    with pytest.raises(ValueError):
        ProtectedUnit(CLIENT, 2)


def test_sensitivity_scales_with_k_by_brute_force():
    """Replacing one unit of k windows moves the sum of clipped signed rows by at most k 2C
    (found by search), and the guarantees' noise scales by k."""
    rng = np.random.default_rng(0)
    clip, k = 1.5, 3
    worst = 0.0
    for _ in range(200):
        rows = clip_rows(torch.from_numpy(rng.normal(size=(8, 5)) * 4), clip)
        swapped = rows.clone()
        swapped[:k] = clip_rows(-rows[:k] * 10, clip)  # the unit's windows, pointing the other way
        worst = max(worst, float((rows.sum(0) - swapped.sum(0)).norm()))
    assert 0.9 * k * 2 * clip < worst <= k * 2 * clip * (1 + 1e-12)
    one = NormalisedTarget(8.0, 1e-5, clip).guarantee(NAMES, "x")
    three = NormalisedTarget(8.0, 1e-5, clip, unit=ProtectedUnit("span", k)).guarantee(NAMES, "x")
    assert three.noise_std(1.0) == pytest.approx(k * one.noise_std(1.0)) and three.sigma == one.sigma
    d1 = DistributedTarget(8.0, 1e-5, clip, 0, 4).guarantee(NAMES, "x")
    d3 = DistributedTarget(8.0, 1e-5, clip, 0, 4, unit=ProtectedUnit("document", k)).guarantee(NAMES, "x")
    assert d3.client_std(64) == pytest.approx(k * d1.client_std(64))


def test_client_unit_clips_the_clients_mean_once():
    prior = PublicPrior(torch.ones(6, dtype=torch.float64), None, 1.0)
    view = View(0, 2.0, grid=2**16, per_client=True)
    energies = torch.from_numpy(np.random.default_rng(1).uniform(0, 30, size=(5, 6)))
    stat = Deviations(prior, view)
    stat.add(energies[:2], 4)
    stat.add(energies[2:], 4)
    mean = (energies / 4 - 1).mean(0)
    expected = mean * min(1.0, 2.0 / float(mean.norm()))
    assert torch.allclose(stat.sum, expected) and stat.units == 1
    assert float(stat.sum.norm()) <= 2.0 + 1e-12  # so replacing the client moves the sum by <= 2C


def test_trust_model_epsilons_are_valid_and_grow_with_collusion():
    clients = 4
    g = DistributedTarget(8.0, 1e-5, 2.0, 0, clients).guarantee(NAMES, "x")
    header = {k: getattr(g, k) for k in g.FIELDS}
    model = trust_model(header)
    assert model["all_honest"] == 8.0
    assert 8.0 < model["one_dropout"] == model["collusion"][1] < model["collusion"][2] < model["collusion"][3]
    for c, eps in model["collusion"].items():
        # the exact Gaussian delta of the remaining shares' noise at the stated epsilon is within delta
        assert gaussian_delta(eps, g.sigma * math.sqrt((clients - c) / clients), g.releases) <= g.delta
    # a per-client release is its own client's noise: collusion does not change it
    per_client = NormalisedTarget(8.0, 1e-5, 2.0).guarantee(NAMES, "x")
    assert trust_model({k: getattr(per_client, k) for k in per_client.FIELDS})["one_dropout"] == 8.0


def test_ledger_composes_a_pools_releases_and_marks_diagnostics():
    g = DistributedTarget(8.0, 1e-5, 2.0, 0, 4).guarantee(NAMES, "x")
    header = {k: getattr(g, k) for k in g.FIELDS}
    ledger = Ledger("pool")
    ledger.add_release("distributed-8", header, ["threshold", "posterior"], ["sha256:" + "0" * 64])
    assert 8.0 - 1e-4 < ledger.epsilon <= 8.0 and ledger.simulation  # one release; seeded by default
    ledger.add_release("distributed-64", {**header, "epsilon": 64.0}, ["threshold"], ["sha256:" + "1" * 64])
    # two releases of the same multiplier are one of twice the releases (at the sum of deltas)
    assert ledger.epsilon == pytest.approx(rdp_epsilon(g.sigma, 2 * g.releases, 2e-5, 4), rel=1e-9)
    assert composed_epsilon([header, header], 2e-5) == pytest.approx(ledger.epsilon)
    ledger.add_diagnostic("headroom", "exact private channel energies")
    assert math.isinf(ledger.epsilon) and ledger.to_json()["total"]["epsilon"] is None


def test_client_data_keeps_units_whole_and_refuses_a_bad_unit_list(tmp_path):
    from fedlib.cli import main
    from fedlib.data import load_tokens, save_tokens

    ids = torch.arange(8 * 4).reshape(8, 4)
    units = [0, 0, 3, 3, 7, 8, 8, 9]
    pool = tmp_path / "pool.safetensors"
    save_tokens(pool, ids, dataset="ptb", unit="span", windows_per_unit=2, units=units)
    owner = {}
    for client in range(3):
        out = tmp_path / f"c{client}.safetensors"
        assert main(["client-data", "--pool", str(pool), "--n-clients", "3", "--client", str(client), "--out",
                     str(out)]) == 0
        shard, meta = load_tokens(out)
        assert meta["unit"] == "span" and meta["windows_per_unit"] == 2
        assert meta["units"] == [units[r] for r in meta["rows"]]
        assert torch.equal(shard, ids[meta["rows"]])
        for u in meta["units"]:
            assert owner.setdefault(u, client) == client
    assert sorted(owner) == sorted(set(units))
    save_tokens(pool, ids, dataset="ptb", unit="span", windows_per_unit=2, units=units[:-1])
    assert main(["client-data", "--pool", str(pool), "--n-clients", "3", "--client", "0", "--out",
                 str(tmp_path / "bad.safetensors")]) == 2
