"""The domain study's paired bootstrap (fedlib.studies.domain.Paired) over data seeds, noise draws
and windows, checked against a direct computation of each resample."""

from __future__ import annotations

import numpy as np
import pytest

from fedlib.catalog.domain import DomainCatalog
from fedlib.studies.domain import BOOTSTRAP, Paired


def test_a_resample_is_the_mean_over_its_seeds_their_draws_and_its_windows():
    rng = np.random.default_rng(3)
    diff = rng.normal(size=(3, 4, 6))  # seeds, noise draws, windows
    paired = Paired(3, 4, 6, np.random.default_rng(0))
    got = paired.resampled(diff)
    assert got.shape == (BOOTSTRAP,)
    for b in (0, 1, BOOTSTRAP - 1):
        values = [diff[s, r, w] for i, s in enumerate(paired.seed_draws[b]) for r in paired.noise_draws[b, i]
                  for w in paired.window_draws[b]]
        assert got[b] == pytest.approx(sum(values) / len(values), rel=1e-12)


def test_a_row_without_noise_resamples_as_before_draws_existed():
    """One draw per seed: the resamples of seeds and windows alone, bit for bit (the committed
    reports' intervals do not move)."""
    diff = np.random.default_rng(4).normal(size=(3, 1, 6))
    paired = Paired(3, 4, 6, np.random.default_rng(0))
    before = np.random.default_rng(0)
    seeds, windows = before.integers(0, 3, size=(BOOTSTRAP, 3)), before.integers(0, 6, size=(BOOTSTRAP, 6))
    expected = np.array([diff[:, 0][s][:, w].mean() for s, w in zip(seeds, windows)])
    assert np.array_equal(paired.resampled(diff), expected)


def test_draws_that_agree_add_nothing_and_draws_that_differ_widen_the_interval():
    base = np.random.default_rng(5).normal(0, 0.1, size=(2, 1, 8))
    paired = Paired(2, 3, 8, np.random.default_rng(0))
    one = paired.resampled(base)
    agreeing = paired.resampled(np.repeat(base, 3, axis=1))
    assert agreeing == pytest.approx(one, abs=1e-15)
    differing = paired.resampled(base + np.array([-0.5, 0.0, 0.5])[None, :, None])
    assert np.ptp(np.percentile(differing, [2.5, 97.5])) > 2 * np.ptp(np.percentile(one, [2.5, 97.5]))


def test_noise_seeds_of_draws_are_distinct_and_draw_zero_keeps_the_data_seed():
    seeds = {(s, d): DomainCatalog.noise_seed(s, d) for s in range(4) for d in range(4)}
    assert all(seeds[s, 0] == s for s in range(4))
    assert len(set(seeds.values())) == len(seeds)
    assert all(0 <= v < 2**63 for v in seeds.values())
    assert [DomainCatalog.dp_name(d) for d in range(3)] == ["dp", "dp-n1", "dp-n2"]
    assert [DomainCatalog.draw_of(DomainCatalog.dp_name(d)) for d in range(3)] == [0, 1, 2]


def test_validation_split_is_its_own_text_and_c4_has_none(data_dir):
    from fedlib.data import DataError, evaluation_text

    validation = evaluation_text("ptb", data_dir, None, "validation")
    test = evaluation_text("ptb", data_dir, None)
    assert validation == " ".join(line.strip() for line in (data_dir / "ptb" / "validation.txt").read_text().splitlines())
    assert test != validation and validation not in test
    with pytest.raises(DataError, match="c4: its evaluation text is held-out documents"):
        evaluation_text("c4", data_dir, (0, 10), "validation")


def test_headroom_refuses_evaluations_of_another_split(tmp_path):
    """The analysis scored on validation windows is paired only with public-only and Centralized
    scored on validation too (their windows are others)."""
    import json

    from fedlib.studies.headroom import headroom_table

    (tmp_path / "headroom.json").write_text(json.dumps({"split": "validation", "rows": []}))
    scored = {"perplexity": {"ptb": {"window_nll": [1.0, 2.0], "split": "validation"}}}
    (tmp_path / "public.json").write_text(json.dumps(scored))
    (tmp_path / "central.json").write_text(json.dumps({"perplexity": {"ptb": {"window_nll": [1.0, 2.0]}}}))
    with pytest.raises(ValueError, match=r"central\.json: scored on ptb test, the analysis on validation"):
        headroom_table(tmp_path / "headroom.json", tmp_path / "public.json", tmp_path / "central.json", "ptb",
                       tmp_path / "out.md", "test")
