"""Tests of fedlib.privacy: entropy, similarity, membership inference and ε auditing,
randomized response, and mask inversion on a tiny constructed LLaMA."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedlib.groups import prune_lowest
from fedlib.methods.wanda import WandaPruner
from fedlib.privacy import (
    auc_ci,
    audit_epsilon,
    bag_overlap,
    binary_entropy_bits,
    bootstrap_auc_ci,
    clopper_pearson,
    debias_counts,
    direction_statistic,
    entropy_comparison,
    epsilon_lower_bound,
    fp16_entropy_bits,
    hamming_fraction,
    hamming_per_layer,
    hamming_total,
    invert_block0_masks,
    lira_scores,
    mask_ensemble_entropy_bits,
    mean_pairwise_hamming,
    model_entropy_bits,
    pairwise_hamming,
    position_match,
    randomized_response,
    randomized_response_masks,
    roc_auc,
    roc_curve,
    separated_auc_bound,
    rr_bit_llr,
    rr_epsilon,
    rr_flip_probability,
    signal_strength,
    target_direction,
    tpr_at_fpr,
    wanda_block0_masks,
)

torch.set_num_threads(1)

# --------------------------------------------------------------------------- entropy


def test_binary_entropy_known_values():
    assert binary_entropy_bits(torch.zeros(10, 10, dtype=torch.bool)) == 0.0
    assert binary_entropy_bits(torch.ones(7, dtype=torch.bool)) == 0.0
    half = torch.zeros(100, dtype=torch.bool)
    half[:50] = True
    assert binary_entropy_bits(half) == pytest.approx(1.0)
    quarter = torch.zeros(8, dtype=torch.bool)
    quarter[:2] = True
    assert binary_entropy_bits(quarter) == pytest.approx(-(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75)))


@pytest.mark.parametrize("k", [0, 1, 3, 5, 8])
def test_fp16_entropy_of_equally_frequent_values(k):
    values = torch.arange(2**k, dtype=torch.float32) * 0.5 - 3.0  # exact in fp16
    weight = values.repeat(6)[torch.randperm(6 * 2**k, generator=torch.Generator().manual_seed(k))]
    assert fp16_entropy_bits(weight.reshape(6, -1)) == pytest.approx(float(k), abs=1e-9)


def test_fp16_entropy_bounded_and_mask_comparison():
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    h = fp16_entropy_bits(w)
    assert 10.0 < h <= 16.0
    mask = prune_lowest(w.abs(), 0.5, "row", 0, "w")
    cmp = entropy_comparison(mask, w)
    assert cmp["mask_bits"] == pytest.approx(1.0)
    assert cmp["fp16_bits"] == pytest.approx(h)
    assert cmp["ratio"] == pytest.approx(1.0 / h)
    assert cmp["reduction"] == pytest.approx(1.0 - 1.0 / h)


def test_model_entropy_weighted_by_size_and_ensemble_entropy():
    a = torch.zeros(10, 10, dtype=torch.bool)  # 0 bits, 100 entries
    b = torch.zeros(10, 30, dtype=torch.bool)
    b[:, :15] = True  # 1 bit, 300 entries
    assert model_entropy_bits({"a": a, "b": b}) == pytest.approx(0.75)
    m = prune_lowest(torch.rand(8, 8, generator=torch.Generator().manual_seed(1)), 0.5, "row", 0)
    assert mask_ensemble_entropy_bits([m, m, m]) == 0.0
    assert mask_ensemble_entropy_bits([m, ~m]) == pytest.approx(1.0)


# --------------------------------------------------------------------------- similarity


def test_hamming_constructed():
    a = torch.zeros(10, 10, dtype=torch.bool)
    b = a.clone()
    b.view(-1)[[3, 17, 42, 99, 0, 5, 6]] = True
    assert hamming_fraction(a, b) == pytest.approx(0.07)
    assert hamming_fraction(a, ~a) == 1.0
    c = torch.zeros(2, 5, dtype=torch.bool)
    d = c.clone()
    d[0, :] = True  # 5 of 10 differ
    per = hamming_per_layer({"x": a, "y": c}, {"x": b, "y": d})
    assert per == {"x": pytest.approx(0.07), "y": pytest.approx(0.5)}
    assert hamming_total({"x": a, "y": c}, {"x": b, "y": d}) == pytest.approx(12 / 110)
    with pytest.raises(KeyError):
        hamming_total({"x": a}, {"y": a})
    with pytest.raises(ValueError):
        hamming_fraction(a, c)
    mat = pairwise_hamming([a, b, ~a])
    assert np.allclose(mat, mat.T) and mat[0, 1] == pytest.approx(0.07) and mat[0, 2] == 1.0
    assert mean_pairwise_hamming([a, b, ~a]) == pytest.approx((0.07 + 1.0 + 0.93) / 3)


# --------------------------------------------------------------------------- ROC / CIs


def test_roc_auc_exact_with_ties():
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 6, 40), rng.integers(0, 5, 55)  # many ties
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert roc_auc(pos, neg) == pytest.approx(brute)
    fpr, tpr, thr = roc_curve(pos, neg)
    assert np.trapezoid(tpr, fpr) == pytest.approx(brute)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0) and thr[0] == np.inf
    assert roc_auc([2, 3], [0, 1]) == 1.0
    assert roc_auc([0, 1], [2, 3]) == 0.0
    assert roc_auc([1, 1], [1, 1, 1]) == 0.5


def test_tpr_at_fpr_rule_and_resolution():
    members = [10, 9, 8, 7, 1]
    nonmembers = [8.5, 2, 1, 0, -1, -2, -3, -4, -5, -6]
    r = tpr_at_fpr(members, nonmembers, 0.1)  # 10 negatives: FPR 0.1 is resolvable
    assert r.resolvable and r.fpr == pytest.approx(0.1) and r.tpr == pytest.approx(0.8)
    assert r.threshold == 7 and (r.tp, r.fp) == (4, 1)
    r0 = tpr_at_fpr(members, nonmembers, 0.01)  # needs >= 100 negatives
    assert not r0.resolvable and r0.fpr == 0.0 and r0.tpr == pytest.approx(0.4)
    assert r0.min_nonzero_fpr == pytest.approx(0.1) and "resolution" in r0.note


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (17, 50), (1, 1000)])
def test_clopper_pearson_matches_scipy(k, n):
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert clopper_pearson(k, n, 0.95) == pytest.approx((ci.low, ci.high), abs=1e-10)
    lo = stats.binomtest(k, n, alternative="greater").proportion_ci(0.9, "exact").low
    hi = stats.binomtest(k, n, alternative="less").proportion_ci(0.9, "exact").high
    assert clopper_pearson(k, n, 0.9, "lower") == pytest.approx((lo, 1.0), abs=1e-10)
    assert clopper_pearson(k, n, 0.9, "upper") == pytest.approx((0.0, hi), abs=1e-10)


def test_epsilon_lower_bound_formula():
    c = 0.95
    tpr_lo = stats.beta.ppf(0.025, 100, 1)
    fpr_hi = stats.beta.ppf(0.975, 1, 100)
    assert epsilon_lower_bound(100, 0, 0, 100, c) == pytest.approx(math.log(tpr_lo / fpr_hi))
    # the symmetric form ln((1-FPR)_low / (1-TPR)_high) dominates here
    tnr_lo = 1 - stats.beta.ppf(0.975, 51, 50)
    fnr_hi = stats.beta.ppf(0.975, 1, 100)
    first = math.log(stats.beta.ppf(0.025, 100, 1) / stats.beta.ppf(0.975, 51, 50))
    second = math.log(tnr_lo / fnr_hi)
    assert second > first
    assert epsilon_lower_bound(100, 0, 50, 50, c) == pytest.approx(second)
    assert epsilon_lower_bound(50, 50, 50, 50, c) == 0.0
    assert epsilon_lower_bound(100, 0, 0, 100, c, delta=0.5) < epsilon_lower_bound(100, 0, 0, 100, c)


def test_epsilon_ceiling_is_the_best_of_every_confusion_matrix():
    """No attack can show more than the ceiling: enumerate every (TP, FP) a game of this size can
    give, and check the closed form a = 0.025: ln(a^(1/n_m) / (1 - a^(1/n_n))) and the issue's figures."""
    from fedlib.privacy import audit_ceilings, epsilon_ceiling

    for n_m, n_n, delta in [(16, 16, 0.0), (8, 13, 0.0), (12, 12, 1e-3)]:
        best = max(epsilon_lower_bound(tp, n_m - tp, fp, n_n - fp, 0.95, delta)
                   for tp in range(n_m + 1) for fp in range(n_n + 1))
        assert epsilon_ceiling(n_m, n_n, 0.95, delta) == best
    for n in (16, 32, 1000):
        a = 0.025 ** (1 / n)
        assert epsilon_ceiling(n, n) == pytest.approx(math.log(a / (1 - a)), rel=1e-9)
    assert round(epsilon_ceiling(16, 16), 2) == 1.35 and round(epsilon_ceiling(32, 32), 2) == 2.10
    # the split construction bounds on the half left after choosing the threshold
    assert audit_ceilings(32, 32) == {"lr1": epsilon_ceiling(32, 32), "split": epsilon_ceiling(16, 16)}
    assert audit_ceilings(33, 31)["split"] == epsilon_ceiling(17, 16)


def test_bootstrap_auc_ci_is_seeded_and_covers():
    rng = np.random.default_rng(1)
    pos, neg = rng.normal(1, 1, 60), rng.normal(0, 1, 60)
    lo, hi = bootstrap_auc_ci(pos, neg, n_boot=300, seed=3)
    assert lo < roc_auc(pos, neg) < hi
    assert (lo, hi) == bootstrap_auc_ci(pos, neg, n_boot=300, seed=3)


def test_separated_auc_bound_is_exact_for_paired_trials_and_covers():
    # n disjoint pairs all won: P(all won | AUC = bound) = bound^n = alpha/2 exactly
    for n_pos, n_neg in [(32, 32), (32, 500), (7, 3)]:
        n = min(n_pos, n_neg)
        assert separated_auc_bound(n_pos, n_neg) ** n == pytest.approx(0.025)
    assert separated_auc_bound(32, 32) == pytest.approx(0.025 ** (1 / 32))  # 0.891
    pos, neg = np.arange(10, 42.0), np.arange(32.0)
    assert auc_ci(pos + 100, neg) == (pytest.approx(0.025 ** (1 / 32)), 1.0)  # never [1, 1]
    assert auc_ci(neg, pos + 100) == (0.0, pytest.approx(1 - 0.025 ** (1 / 32)))
    rng = np.random.default_rng(0)
    mixed_pos, mixed_neg = rng.normal(1, 1, 40), rng.normal(0, 1, 40)
    assert auc_ci(mixed_pos, mixed_neg, n_boot=200) == bootstrap_auc_ci(mixed_pos, mixed_neg, n_boot=200)
    # coverage: with a true AUC just below the bound, perfect separation of 8 + 8 scores is rarer
    # than 2.5 % (members N(mu, 1), non-members N(0, 1): AUC = Phi(mu / sqrt 2))
    bound = separated_auc_bound(8, 8)
    mu = math.sqrt(2) * stats.norm.ppf(bound - 0.01)
    separated = sum(rng.normal(mu, 1, 8).min() > rng.normal(0, 1, 8).max() for _ in range(4000))
    assert separated / 4000 < 0.025


def test_rr_bit_llr_against_the_explicit_likelihood():
    reported = torch.tensor([True, False, True, True])
    in_counts, out_counts, n = torch.tensor([4, 0, 3, 1]), torch.tensor([0, 4, 1, 2]), 4
    eps = 1.0
    q = 1 / (1 + math.e)
    expected = 0.0
    for r, ki, ko in zip(reported.tolist(), in_counts.tolist(), out_counts.tolist()):
        pi, po = (ki + 0.5) / 5, (ko + 0.5) / 5
        one_i, one_o = pi * (1 - q) + (1 - pi) * q, po * (1 - q) + (1 - po) * q
        expected += math.log(one_i / one_o) if r else math.log((1 - one_i) / (1 - one_o))
    assert rr_bit_llr(reported, in_counts, out_counts, n, eps) == pytest.approx(expected, rel=1e-12)
    # planted: members prune the first 200 of 400 bits more often; the noise-aware score separates
    gen = torch.Generator().manual_seed(0)
    rate_in = torch.cat([torch.full((200,), 0.7), torch.full((200,), 0.5)])
    rate_out = torch.full((400,), 0.5)
    cin = (torch.rand(16, 400, generator=gen) < rate_in).sum(0)
    cout = (torch.rand(16, 400, generator=gen) < rate_out).sum(0)
    member = [rr_bit_llr(randomized_response(torch.rand(400, generator=gen) < rate_in, 1.0, generator=gen),
                         cin, cout, 16, 1.0) for _ in range(40)]
    nonmember = [rr_bit_llr(randomized_response(torch.rand(400, generator=gen) < rate_out, 1.0, generator=gen),
                            cin, cout, 16, 1.0) for _ in range(40)]
    assert roc_auc(member, nonmember) > 0.8
    with pytest.raises(ValueError, match="finite epsilon"):
        rr_bit_llr(reported, in_counts, out_counts, n, math.inf)


def test_lira_gaussian_offline_kde():
    shadow_in = np.array([[1.0, 1.2, 0.8, 1.1], [5.0, 5.1, 4.9, 5.0]])
    shadow_out = np.array([[0.0, 0.2, -0.2, 0.1], [4.0, 4.1, 3.9, 4.0]])
    s = lira_scores([1.0, 4.0], shadow_in, shadow_out)
    assert s[0] > 0 and s[1] < 0
    g = lira_scores([1.0, 4.0], shadow_in, shadow_out, global_variance=True)
    assert g[0] > 0 and g[1] < 0
    k = lira_scores([1.0, 4.0], shadow_in, shadow_out, method="kde")
    assert k[0] > 0 and k[1] < 0
    off = lira_scores([1.0, 0.0], None, shadow_out[:1].ravel(), method="offline")
    assert off[0] > off[1]
    padded = lira_scores([1.0], [[1.0, 1.2, np.nan]], [[0.0, 0.1, 0.2]])
    assert np.isfinite(padded).all() and padded[0] > 0


# --------------------------------------------------------------------------- planted MIA


def _mechanism(strength: float, shape=(16, 16), n_pop=60, k=4):
    """Masks of a planted mechanism: top-50 % of public scores + strength * mean of the
    data set's sample vectors + data-set-specific noise; strength 0 = data-independent."""
    gen = torch.Generator().manual_seed(123)
    public = torch.randn(shape, generator=gen)
    samples = torch.randn((n_pop, *shape), generator=gen)

    def mask(dataset, seed):
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(10_000 + seed))
        s = public + strength * samples[list(dataset)].mean(0) + 0.3 * noise
        return prune_lowest(s, 0.5, "layer", 0, "planted")

    return mask, n_pop, k


def _run_lira(strength: float, n_targets=60, n_dir=12, n_fit=12):
    mask, n_pop, k = _mechanism(strength)
    rng = np.random.default_rng(7)
    seed = iter(range(10**6))

    def dataset(target, member):
        others = rng.choice([i for i in range(n_pop) if i != target], k - member, replace=False)
        return [*others, target] if member else list(others)

    members, nonmembers = [], []
    for t in range(n_targets):
        d_in = [mask(dataset(t, True), next(seed)) for _ in range(n_dir)]
        d_out = [mask(dataset(t, False), next(seed)) for _ in range(n_dir)]
        direction = target_direction(d_in, d_out)
        fit_in = [direction_statistic(mask(dataset(t, True), next(seed)), direction) for _ in range(n_fit)]
        fit_out = [direction_statistic(mask(dataset(t, False), next(seed)), direction) for _ in range(n_fit)]
        obs = [direction_statistic(mask(dataset(t, b), next(seed)), direction) for b in (True, False)]
        s = lira_scores(obs, [fit_in, fit_in], [fit_out, fit_out])
        members.append(s[0])
        nonmembers.append(s[1])
    return np.array(members), np.array(nonmembers)


def test_mia_on_leaking_and_data_independent_mechanisms():
    m, n = _run_lira(strength=3.0)
    auc = roc_auc(m, n)
    assert auc > 0.95
    eps = audit_epsilon(m, n, threshold=0.0)  # LiRA's natural threshold: likelihood ratio 1
    assert eps["epsilon_lb"] > 2.0
    lo, _ = bootstrap_auc_ci(m, n, n_boot=200, seed=0)
    assert lo > 0.85

    m0, n0 = _run_lira(strength=0.0)
    assert abs(roc_auc(m0, n0) - 0.5) < 0.15
    assert audit_epsilon(m0, n0, threshold=0.0)["epsilon_lb"] < 0.3
    assert audit_epsilon(m0, n0, seed=1)["epsilon_lb"] < 0.3  # threshold chosen on a split
    assert tpr_at_fpr(m0, n0, 0.05).tpr < 0.3


def test_signal_strength_ratio():
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(20, 20, generator=gen) < 0.5
    with_t = base.clone()
    with_t.view(-1)[:8] ^= True  # 2 % change
    others = [torch.rand(20, 20, generator=gen) < 0.5 for _ in range(3)]
    r = signal_strength(with_t, base, others)
    assert r["target_hamming"] == pytest.approx(0.02)
    assert r["ratio"] == pytest.approx(0.02 / mean_pairwise_hamming(others))
    assert signal_strength([with_t, base], [base, base], 0.04)["ratio"] == pytest.approx(0.25)


# --------------------------------------------------------------------------- defence


@pytest.mark.parametrize("eps", [0.0, 0.5, 1.0, 3.0])
def test_randomized_response_flip_rate(eps):
    mask = torch.rand(400, 500, generator=torch.Generator().manual_seed(0)) < 0.5
    out = randomized_response(mask, eps, seed=11, name="layer")
    n = mask.numel()
    q = rr_flip_probability(eps)
    flips = int((out ^ mask).sum())
    sd = math.sqrt(n * q * (1 - q))
    assert abs(flips - n * q) < 4 * sd
    assert torch.equal(out, randomized_response(mask, eps, seed=11, name="layer"))
    if eps > 0:
        assert rr_epsilon(q) == pytest.approx(eps)
    assert q == pytest.approx(1 / (1 + math.exp(eps)))


def test_randomized_response_streams_and_inf():
    m = torch.zeros(50, 50, dtype=torch.bool)
    out = randomized_response_masks({"a": m, "b": m}, 1.0, seed=0)
    assert not torch.equal(out["a"], out["b"])
    assert torch.equal(randomized_response(m, math.inf, seed=0), m)


def test_debiased_counts_unbiased_and_topk_invariant():
    n_clients, eps = 20, 1.0
    gen = torch.Generator().manual_seed(5)
    truth = torch.rand(n_clients, 60, 60, generator=gen) < torch.linspace(0.05, 0.95, 60)
    true_counts = truth.sum(0)
    noisy = torch.stack([randomized_response(truth[i], eps, seed=i) for i in range(n_clients)])
    observed = noisy.sum(0)
    est = debias_counts(observed, n_clients, eps)
    q = rr_flip_probability(eps)
    # per-entry variance of the estimate: m q (1-q) / (p-q)^2; check the mean error
    sd_mean = math.sqrt(n_clients * q * (1 - q)) / (1 - 2 * q) / math.sqrt(est.numel())
    assert abs(float((est - true_counts).mean())) < 4 * sd_mean
    a = prune_lowest(-est.float(), 0.5, "row", 0, "x")
    b = prune_lowest(-observed.float(), 0.5, "row", 0, "x")
    assert torch.equal(a, b)


# --------------------------------------------------------------------------- inversion


def _tiny_llama(vocab=32, hidden=64, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden // 4,
    )
    return LlamaForCausalLM(cfg).eval()


def test_block0_masks_match_wanda_on_real_forward_and_are_position_free():
    model = _tiny_llama()
    tokens = [3, 17, 5, 5, 30, 1]
    q = model.model.layers[0].self_attn.q_proj
    pruner = WandaPruner(q, "model.layers.0.self_attn.q_proj")
    handle = q.register_forward_hook(lambda mod, inp, out: pruner.add_batch(inp[0]))
    with torch.no_grad():
        model(torch.tensor([tokens]))
    handle.remove()
    expected = pruner.prune(0.5, "row", 0)
    masks = wanda_block0_masks(model, tokens, ["model.layers.0.self_attn.q_proj"], 0.5, "row", 0)
    assert torch.equal(masks["model.layers.0.self_attn.q_proj"], expected)
    shuffled = wanda_block0_masks(model, tokens[::-1], ["self_attn.q_proj"], 0.5, "row", 0)
    assert torch.equal(shuffled["model.layers.0.self_attn.q_proj"], expected)
    with pytest.raises(ValueError):
        wanda_block0_masks(model, tokens, ["mlp.up_proj"])


@pytest.mark.parametrize("model_seed,tokens", [(0, [21]), (1, [4, 11]), (2, [15, 26]), (3, [7])])
def test_inversion_recovers_tiny_text_exactly(model_seed, tokens):
    model = _tiny_llama(seed=model_seed)
    masks = wanda_block0_masks(model, tokens, ["self_attn.q_proj"], 0.5, "row", 0)
    r = invert_block0_masks(model, masks, len(tokens), steps=200, refine_sweeps=0,
                            target_tokens=tokens, seed=1)
    assert r.mask_agreement == 1.0 and r.true_tokens_agreement == 1.0
    assert r.bag_overlap == 1.0
    assert sorted(r.tokens) == sorted(tokens)
    if len(tokens) == 1:
        assert r.position_match == 1.0
    assert r.baseline_agreement < 1.0


def test_inversion_refinement_alone_and_qkv_layers():
    model = _tiny_llama(seed=4)
    tokens = [9, 9, 2]
    masks = wanda_block0_masks(model, tokens, ["self_attn.q_proj", "self_attn.k_proj",
                                               "self_attn.v_proj"], 0.5, "row", 0)
    # no gradient steps: exhaustive coordinate search over the 32-token vocabulary
    r = invert_block0_masks(model, masks, 3, steps=0, refine_sweeps=4, n_candidates=32,
                            target_tokens=tokens)
    assert r.mask_agreement >= r.gradient_agreement
    assert r.bag_overlap == 1.0 and r.mask_agreement == 1.0
    assert set(r.mask_agreement_layers) == set(masks)
    full = invert_block0_masks(model, masks, 3, steps=200, target_tokens=tokens)
    assert sorted(full.tokens) == [2, 9, 9] and full.mask_agreement == 1.0


def test_bag_and_position_metrics():
    assert bag_overlap([1, 2, 2, 3], [2, 2, 2, 4]) == 0.5
    assert position_match([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


@pytest.mark.parametrize("group", ["row", "column", "layer"])
def test_relaxed_and_hard_masks_agree_with_prune_lowest(group):
    from fedlib.privacy.inversion import _hard_masks, _soft_logits

    x = torch.randn(3, 20, 30, generator=torch.Generator().manual_seed(2))
    for sparsity in (0.0, 0.5, 0.7):
        expected = torch.stack([prune_lowest(x[i], sparsity, group, 0) for i in range(3)])
        assert torch.equal(_hard_masks(x, sparsity, group), expected)
        assert torch.equal(_soft_logits(x, sparsity, group, 0.01) > 0, expected)
