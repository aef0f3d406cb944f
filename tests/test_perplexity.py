"""fedlib.evaluate.perplexity: per-window losses against a plain forward of the model, and the
paired perplexity ratio against scipy's paired t-test."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedlib.evaluate.perplexity import paired_ppl_ratio, perplexities


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_window_losses_are_each_windows_own_and_add_up_to_the_perplexity(model, batch_size):
    """Each window's mean NLL equals the model's own forward of that window alone; their mean is
    the reported NLL (equal windows), whatever the batching."""
    windows = torch.randint(0, 128, (5, 24), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    (score,), _ = perplexities(model, [windows], batch_size)
    with torch.no_grad():
        expected = [float(F.cross_entropy(model(w[None].long()).logits[0, :-1], w[1:].long())) for w in windows]
    assert score["window_nll"] == pytest.approx(expected, rel=1e-5)
    assert score["windows"] == len(score["window_nll"]) == 5 and score["tokens"] == 5 * 23
    assert score["nll"] == pytest.approx(sum(expected) / 5, rel=1e-6)
    assert score["ppl"] == pytest.approx(math.exp(sum(expected) / 5), rel=1e-6)


def test_paired_ppl_ratio_is_the_token_mean_ratio_with_a_paired_t_interval():
    """Against scipy's paired t-test: the interval's ends are where its p-value is 0.05."""
    from scipy import stats

    ours, theirs = [3.1, 2.9, 3.4, 3.0, 3.3], [3.0, 2.95, 3.2, 3.05, 3.1]
    ratio, (lo, hi) = paired_ppl_ratio(ours, theirs)
    assert ratio == pytest.approx(math.exp(sum(ours) / 5) / math.exp(sum(theirs) / 5))
    for end in (lo, hi):
        shifted = [o - math.log(end) for o in ours]
        assert stats.ttest_rel(shifted, theirs).pvalue == pytest.approx(0.05, rel=1e-6)
    assert lo < ratio < hi
    with pytest.raises(ValueError, match="at least 2 values"):
        paired_ppl_ratio([3.0], [3.0])
    with pytest.raises(ValueError, match="5 windows against 4: not the same windows"):
        paired_ppl_ratio(ours, theirs[:4])
