"""The domain study's paired bootstrap (fedlib.studies.paired.Paired) over data seeds, noise draws
and windows, checked against a direct computation of each resample."""

from __future__ import annotations

import numpy as np
import pytest

from fedlib.catalog.domain import DomainCatalog
from fedlib.studies.paired import BOOTSTRAP, Paired


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


def choice_files(tmp_path, split="validation"):
    """A headroom record on 6 validation windows (public-only at 3.0, Centralized at 2.0 per window):
    at data x 1 and ε = 8 the threshold moves every window by -0.5 (two draws: -0.4, -0.6) and the
    posterior by -0.3; the posterior at data x 4 (-0.9) and at ε = 64 (-0.8) would beat both."""
    import json

    def row(estimator, epsilon, multiplier, draw, shift):
        return {"label": f"{estimator}-eps{epsilon}-x{multiplier}-n{draw}", "estimator": estimator, "epsilon": epsilon,
                "multiplier": multiplier, "window_nll": [3.0 + shift] * 6, "moved_coordinates": 1}

    rows = [row("posterior", 8, 1, 0, -0.3), row("posterior", 8, 4, 0, -0.9), row("posterior", 64, 1, 0, -0.8),
            row("threshold", 8, 1, 0, -0.4), row("threshold", 8, 1, 1, -0.6)]
    (tmp_path / "headroom.json").write_text(json.dumps({"split": split, "samples": 8, "windows": 6, "rows": rows}))
    for name, nll in (("public", 3.0), ("central", 2.0)):
        scored = {"window_nll": [nll] * 6, **({"split": split} if split != "test" else {})}
        (tmp_path / f"{name}.json").write_text(json.dumps({"perplexity": {"ptb": scored}}))
    return {"choice": {"headroom": str(tmp_path / "headroom.json"), "public": str(tmp_path / "public.json"),
                       "central": str(tmp_path / "central.json"), "sparsity": 0.5, "seed": 0,
                       "mechanisms": {"threshold": "distributed", "posterior": "distributed_posterior"}},
            "private": "ptb", "epsilons": [8, 64],
            "titles": {"distributed": "DP distributed", "distributed_posterior": "DP distributed, posterior"}}


def test_the_claim_row_is_the_estimator_best_on_validation_at_data_x1_and_eps_at_most_8(tmp_path):
    """Only variants the study releases count: data x 1 (a larger multiplier emulates data the clients
    lack) and an ε ≤ 8 of the study's; among them the lowest mean Δ vs public-only (threshold: -0.5
    over its two draws, posterior -0.3)."""
    from fedlib.studies.domain import _validation_choice

    chosen = _validation_choice(choice_files(tmp_path))
    assert (chosen["mechanism"], chosen["epsilon"], chosen["sparsity"]) == ("distributed", 8, 0.5)
    assert "the threshold estimator (DP distributed) at ε = 8" in chosen["line"]
    assert "on 6 PTB validation windows" in chosen["line"] and "2 noise draws" in chosen["line"]
    assert f"{np.expm1(-0.5):+.1%}" in chosen["line"] and f"{np.expm1(-0.3):+.1%}" in chosen["line"]
    assert _validation_choice({"choice": None}) is None


def test_a_choice_is_refused_on_test_windows_or_with_nothing_to_choose(tmp_path):
    from fedlib.studies.domain import _validation_choice

    (tmp_path / "test").mkdir()
    with pytest.raises(ValueError, match="scored on test windows; a choice is made on validation windows"):
        _validation_choice(choice_files(tmp_path / "test", split="test"))
    spec = choice_files(tmp_path)
    spec["epsilons"] = [4]
    with pytest.raises(ValueError, match=r"no variant at data × 1 and ε in \[4.0\]"):
        _validation_choice(spec)


@pytest.mark.parametrize("kept, ci, verdict", [
    (0.65, (0.57, 0.73), "met"),
    (0.50, (0.50, 0.60), "met"),
    (0.63, (0.41, 0.85), "met at the point, not beyond its interval"),
    (0.42, (0.34, 0.49), "not met"),
    (0.42, (0.30, 0.55), "not met"),
])
def test_the_goal_is_met_only_where_its_interval_clears_it(kept, ci, verdict):
    """A point over 50 % with an interval reaching below it (one lucky noise draw) is not "met"."""
    from fedlib.studies.domain import goal_verdict

    assert goal_verdict(kept, ci) == verdict


def test_the_gain_kept_per_draw_is_each_draws_mean_change_over_its_seeds_ceiling():
    """Each (data seed, noise draw) cell: the DP row's mean Δ vs public-only on that seed's windows over
    Centralized's on the same seed, computed here from the per-window changes; one draw per seed
    adds no clause (the committed single-draw reports do not move)."""
    from fedlib.studies.domain import kept_per_draw, per_draw_text

    rng = np.random.default_rng(8)
    central = rng.normal(-0.1, 0.02, size=(2, 1, 5))  # seeds, draws, windows: Δ vs public-only
    dp = rng.normal(-0.05, 0.03, size=(2, 3, 5))
    summary = {"central": {"per_draw": central.mean(axis=2)}, "distributed-8": {"per_draw": dp.mean(axis=2)}}
    got = kept_per_draw(summary, "distributed-8", {"distributed": "central"})
    for s in range(2):
        for d in range(3):
            assert got[s, d] == pytest.approx(sum(dp[s, d]) / sum(central[s, 0]), rel=1e-12)
    text = per_draw_text(got, [0, 1])
    assert text == "; kept per noise draw: " + "; ".join(
        f"data seed {s}: " + ", ".join(f"{got[s, d]:.0%}" for d in range(3)) for s in range(2))
    assert per_draw_text(got[:, :1], [0, 1]) == "" and per_draw_text(None, [0]) == ""
    assert kept_per_draw(summary, "distributed-8", {}) is None
