"""DP masks that degrade to the public mask (fedlib.dp.public, fedlib.dp.distributed): the
signed statistic's sensitivity by brute force, the no-noise limit against plain Wanda computed
independently, huge noise against the public mask, the low-dimensional release, the distributed
sum through real SecAgg, the discrete Gaussian and both accountants against exact bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from fedlib.client import Pruning, prune_locally
from fedlib.groups import prune_lowest
from fedlib.methods.wanda import wanda_scores
from fedlib.models import block_linears
from fedlib.dp.gaussian import calibrate_sigma, count_releases, input_key
from fedlib.dp.accountant import GRID, calibrate_distributed_sigma, rdp_epsilon, sensitivity_steps
from fedlib.dp.distributed import DistributedGuarantee, DistributedTarget
from fedlib.dp.samplers import NoiseSource, derive_seed
from fedlib.dp.unit import ProtectedUnit
from fedlib.dp.public import (
    FALSE_KEEP,
    NormalisedGuarantee,
    NormalisedTarget,
    PassShape,
    PublicPrior,
    Release,
    clip_rows,
    collecting_sink,
    federation_pass,
    noise_threshold,
    shrunk_energies,
    to_grid,
    tokens_digest,
)

SPARSITY, GROUP, SEED = 0.5, "row", 0


def _ids(n, seqlen=16, seed=0, vocab=128, low=0):
    return torch.randint(low, vocab, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def _names(model):
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]


def _pass(model, public, clients, guarantees, shared=False, blocks=None, noise_seeds=None):
    """Masks of each guarantee's release (one per client, or the shared one) and the public masks."""
    out, public_masks = [], {}
    releases = []
    for i, g in enumerate(guarantees):
        store = {}
        out.append(store)
        seeds = noise_seeds or list(range(len(clients)))
        releases.append(Release(f"r{i}", g, [NoiseSource(seed) for seed in seeds], collecting_sink(store),
                                shared=shared, secagg_seed=0))
    federation_pass(model, public, clients, Pruning("wanda", SPARSITY, GROUP, SEED, batch_size=4), releases, blocks=blocks,
                    public_sink=lambda _b, d: public_masks.update(d.masks))
    return out, public_masks


def _no_noise(model, public, basis=0, estimator="threshold"):
    target = NormalisedTarget(math.inf, 1e-5, math.inf, basis, estimator)
    return target.guarantee(_names(model), tokens_digest(public))


def reference_masks(model, ids, prefix_masks):
    """Plain Wanda computed by hand: block b's linears see the data through blocks < b pruned
    by ``prefix_masks`` (block b itself dense), mean x^2 per channel over all tokens."""
    masks = {}
    layers = model.model.layers
    for b in range(len(layers)):
        originals = {}
        with torch.no_grad():
            for lb in range(b):
                for local, lin in block_linears(layers[lb]).items():
                    name = f"model.layers.{lb}.{local}"
                    originals[name] = lin.weight.clone()
                    lin.weight[prefix_masks[name]] = 0
            seen = {}
            lins = {f"model.layers.{b}.{local}": lin for local, lin in block_linears(layers[b]).items()}
            hooks = [lin.register_forward_hook(lambda _m, inp, _o, n=n: seen.setdefault(n, []).append(inp[0]))
                     for n, lin in lins.items()]
            model(ids)
            for h in hooks:
                h.remove()
            for lb in range(b):
                for local, lin in block_linears(layers[lb]).items():
                    lin.weight.copy_(originals[f"model.layers.{lb}.{local}"])
        for n, lin in lins.items():
            x = torch.cat(seen[n]).double().reshape(-1, lin.in_features)
            energy = (x * x).mean(dim=0)
            masks[n] = prune_lowest(wanda_scores(lin.weight.detach().float(), energy.float()), SPARSITY, GROUP, SEED, n)
    return masks


def test_signed_statistic_needs_sensitivity_2c_by_brute_force(model):
    """Replace-one neighbours of a data set move the clipped sum by at most 2C (brute force over
    a pool on a tiny model's real activations), and two samples can reach 2C, beyond sqrt(2) C."""
    from fedlib.dp.public import ClippedDeviations, PublicWanda, View
    from fedlib.runner import BlockRunner

    pool = torch.cat([_ids(6, seed=1), torch.full((1, 16), 3), torch.full((1, 16), 77)])
    public = _ids(8, seed=2)
    # the statistic of one release (block 0's attention input) for each pool sample alone
    runner = BlockRunner(model, [public, pool], batch_size=1)
    step = next(runner.steps(1))
    name = "model.layers.0.self_attn.q_proj"
    pub = {name: PublicWanda(step.linears[name], name)}
    step.collect(0, pub)
    prior = pub[name].prior()
    view = View(0, 0.5)

    def statistic(x):
        stat = ClippedDeviations(step.linears[name], name, {view: prior})
        stat.add_batch(x)
        return stat.views[view].sum

    bound_multiplier = view.clip
    per_sample = [statistic(model.model.embed_tokens(pool[row:row + 1])) for row in range(pool.shape[0])]
    bound = bound_multiplier * prior.unit
    data = [0, 1, 2]
    total = sum(per_sample[i] for i in data)
    worst = 0.0
    for s in data:
        for r in range(pool.shape[0]):
            if r in data:
                continue
            moved = (total - per_sample[s] + per_sample[r] - total).norm().item()
            assert moved <= 2 * bound * (1 + 1e-9)
            worst = max(worst, moved)
    assert all(v.norm().item() <= bound * (1 + 1e-9) for v in per_sample)
    # synthetic activations above and below the public energies everywhere: opposite vectors
    loud, quiet = torch.full((1, 4, 32), 50.0), torch.full((1, 4, 32), 1e-3)
    stats_of = [statistic(loud), statistic(quiet)]
    assert (stats_of[0] - stats_of[1]).norm().item() > math.sqrt(2) * bound * 1.3
    assert (stats_of[0] - stats_of[1]).norm().item() <= 2 * bound * (1 + 1e-9)
    # and the mechanism's noise is calibrated to 2C
    g = NormalisedTarget(4.0, 1e-5, 1.0).guarantee(_names(model), "x")
    assert g.noise_std(bound) == pytest.approx(g.sigma * 2 * bound)


@pytest.mark.parametrize("estimator", ["threshold", "posterior"])
def test_no_noise_is_plain_wanda_through_the_public_prefix(model, estimator):
    """ε = ∞ (no clip, no noise): each client's masks are Wanda on its data through the public
    mask's prefix, and block 0 (no prefix) is plain Wanda bit for bit; the public masks are
    client-mask's plain Wanda on the public text. Either estimator leaves a noiseless mean as is."""
    public, a, b = _ids(8, seed=2), _ids(6, seed=3, low=64), _ids(6, seed=4)
    (per_client,), public_masks = _pass(model, public, [a, b], [_no_noise(model, public, estimator=estimator)])
    assert all(torch.equal(public_masks[n], m)
               for n, m in prune_locally(model, public, Pruning("wanda", SPARSITY, GROUP, SEED)).masks.items())
    for c, ids in enumerate((a, b)):
        ref = reference_masks(model, ids, public_masks)
        assert all(torch.equal(per_client[c][n], ref[n]) for n in ref)
        plain = prune_locally(model, ids, Pruning("wanda", SPARSITY, GROUP, SEED)).masks
        assert all(torch.equal(per_client[c][n], plain[n]) for n in plain if ".layers.0." in n)
    # the private data changes the masks: the check above can fail
    assert any(not torch.equal(per_client[0][n], public_masks[n]) for n in public_masks)


def test_distributed_without_noise_is_wanda_on_the_combined_data(model):
    """The secure sum of the clients' statistics without noise is Wanda on their union (through
    the public prefix); with a full basis the low-dimensional release changes nothing."""
    public, a, b = _ids(8, seed=2), _ids(5, seed=3, low=64), _ids(7, seed=4)
    full = torch.cat([a, b])
    # a clip no sample reaches, on a grid fine enough that rounding is below float32's resolution
    g = DistributedGuarantee(1.0, 1e-5, 1e3, 0, 0.0, count_releases(_names(model)), "x", clients=2, grid=2**40)
    (shared,), public_masks = _pass(model, public, [a, b], [g], shared=True, noise_seeds=[5, 6])
    ref = reference_masks(model, full, public_masks)
    assert all(torch.equal(shared[None][n], ref[n]) for n in ref)
    # a full basis (k = d) is a rotation: the same masks as the per-channel release
    (full_basis,), _ = _pass(model, public, [full], [_no_noise(model, public, basis=10**6)])
    assert all(torch.equal(full_basis[0][n], ref[n]) for n in ref)


def test_huge_noise_gives_exactly_the_public_mask(model):
    public, a = _ids(8, seed=2), _ids(6, seed=3, low=64)
    releases = count_releases(_names(model))
    loud = [NormalisedGuarantee(1e-6, 1e-5, 1.0, basis, 1e12, releases, "x") for basis in (0, 4)]
    loud.append(DistributedGuarantee(1e-6, 1e-5, 1.0, 4, 1e9, releases, "x", clients=2))
    (normalised, lowdim), public_masks = _pass(model, public, [a, a.flip(0)], loud[:2])
    (distributed,), _ = _pass(model, public, [a, a.flip(0)], loud[2:], shared=True)
    for masks in (normalised[0], normalised[1], lowdim[0], distributed[None]):
        assert all(torch.equal(masks[n], public_masks[n]) for n in public_masks)
    # moderate noise moves the masks: the check can fail
    mid = [NormalisedGuarantee(1.0, 1e-5, 1.0, 0, 1e-3, releases, "x")]
    (moved,), _ = _pass(model, public, [a], mid)
    assert any(not torch.equal(moved[0][n], public_masks[n]) for n in public_masks)


def test_low_dimensional_release_projects_and_cuts_noise_per_channel():
    gen = torch.Generator().manual_seed(0)
    d, k = 12, 3
    basis = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))[0].T
    prior = PublicPrior(torch.rand(d, generator=gen, dtype=torch.float64) + 0.5, basis, 1.0)
    assert prior.dim == k
    energies = torch.rand(5, d, generator=gen, dtype=torch.float64) * 10
    rep = prior.represent(energies, 4)
    u = energies / (4 * prior.scale) - 1
    assert torch.allclose(rep, u @ basis.T)
    # the mean deviation comes back as its projection onto the basis
    back = prior.energies(rep.mean(0))
    expected = prior.scale * (1 + basis.T @ basis @ u.mean(0)).clamp_min(0)
    assert torch.allclose(back, expected)
    # isotropic noise on k coordinates spreads over d channels: k/d of the variance per channel
    assert torch.trace(basis.T @ basis).item() == pytest.approx(k)
    # clipping: rows longer than the bound get exactly the bound, shorter ones stay
    rows = torch.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=torch.float64)
    assert torch.allclose(clip_rows(rows, 1.0), torch.tensor([[0.6, 0.8], [0.3, 0.4]], dtype=torch.float64))


def test_threshold_is_the_family_wise_normal_bound():
    """lambda / s is scipy's normal quantile at 1 - level / (2 coordinates), and noise alone
    clears it somewhere in a pass about ``level`` of the time (it can fail either way: a threshold
    per coordinate would be cleared almost always, one 10x too high never)."""
    for coordinates in (1, 576, 69120):
        assert noise_threshold(2.0, coordinates) == pytest.approx(
            2.0 * stats.norm.ppf(1 - FALSE_KEEP / (2 * coordinates)), rel=1e-9)
    gen = torch.Generator().manual_seed(0)
    trials, coordinates, level = 4000, 500, 0.05  # the default level is too rare to count here
    noise = torch.randn(trials, coordinates, generator=gen, dtype=torch.float64)
    cleared = (noise.abs() > noise_threshold(1.0, coordinates, level)).any(dim=1).double().mean().item()
    assert 0.6 * level < cleared < 1.4 * level


def test_estimate_soft_thresholds_the_noisy_mean_toward_the_public_prior():
    """m_j = p_j max(1 + sign(d_j) max(|d_j| - lambda, 0), 0), d the noisy mean deviation: written
    out here coordinate by coordinate; below lambda a coordinate is exactly the public value, and
    without noise the estimate is the mean itself."""
    scale = torch.tensor([1.0, 2.0, 4.0, 8.0, 0.5], dtype=torch.float64)
    prior = PublicPrior(scale, None, 1.0)
    n, std, coordinates = 4, 2.0, 5
    lam = noise_threshold(std / n, coordinates)
    mean = torch.tensor([0.1, -0.2, lam + 0.3, -(lam + 2.0), lam - 1e-9], dtype=torch.float64)
    got = shrunk_energies(prior, mean * n, n, std, PassShape(coordinates, 1))
    expected = [1.0, 2.0, 4.0 * (1 + 0.3), 8.0 * max(1 - 2.0, 0.0), 0.5]
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert shrunk_energies(prior, mean * n, n, 0.0, PassShape(coordinates, 1)).tolist() == pytest.approx(
        (scale * (1 + mean).clamp_min(0)).tolist(), rel=1e-12)


def test_a_simulated_release_needs_a_finite_epsilon():
    from fedlib.privacy.stages.dp_federation import release_target

    spec = {"label": "plain", "mechanism": "normalised", "epsilon": math.inf, "delta": 1e-5, "clip": math.inf}
    with pytest.raises(ValueError, match="'plain': epsilon must be finite"):
        release_target(spec, 4)
    assert release_target({**spec, "epsilon": 8.0, "clip": 2.0}, 4).epsilon == 8.0


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    def delta_of(eps):
        return stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)
    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 500.0, xtol=1e-10)


@pytest.mark.parametrize("epsilon,releases,clients", [(1.0, 8, 2), (8.0, 120, 4), (64.0, 120, 4)])
def test_accounting_against_the_exact_gaussian_bound(epsilon, releases, clients):
    delta = 1e-5
    # per client: PLD, tight against the exact Gaussian composition (mu = sqrt(k) / sigma)
    sigma = NormalisedTarget(epsilon, delta, 1.0).guarantee([f"model.layers.{i}.mlp.down_proj"
                                                            for i in range(releases)], "x").sigma
    assert sigma == calibrate_sigma(epsilon, delta, releases)
    exact = analytic_gaussian_epsilon(math.sqrt(releases) / sigma, delta)
    assert 0.98 * epsilon <= exact <= epsilon + 1e-6
    # distributed: RDP bounds the same Gaussian from above, so it needs at least as much noise
    d_sigma = calibrate_distributed_sigma(epsilon, delta, releases, clients)
    assert rdp_epsilon(d_sigma, releases, delta, clients) <= epsilon
    assert analytic_gaussian_epsilon(math.sqrt(releases) / d_sigma, delta) <= epsilon
    assert d_sigma >= sigma * (1 - 1e-6)
    assert d_sigma <= 1.5 * sigma  # RDP's conversion costs some noise, not orders of magnitude
    # the discrete term is negligible at these per-client stds, and counted
    g = DistributedTarget(epsilon, delta, 1.0, 0, clients).guarantee(
        [f"model.layers.{i}.mlp.down_proj" for i in range(releases)], "x")
    assert g.client_std(576) > 1000 and g.sigma == d_sigma


def test_discrete_gaussian_shares_sum_to_the_servers_noise():
    # K shares of std s sum to variance K s^2 (what the server's noise is); the sampler's pmf is
    # tested in test_dp_samplers
    source = NoiseSource(seed=1)
    big = sum(source.discrete_gaussian(3000.0, 20_000, "share", c) for c in range(4))
    assert big.std() == pytest.approx(2 * 3000.0, rel=0.02)


def test_secure_sum_equals_the_plain_sum_of_noisy_uploads(model):
    """The distributed release through real SecAgg equals the sum of what the clients would
    upload in the clear (grid sums plus their noise shares), decoded."""
    public, a, b = _ids(8, seed=2), _ids(5, seed=3, low=64), _ids(7, seed=4)
    g = DistributedTarget(8.0, 1e-5, 1.0, 0, 2).guarantee(_names(model), "x")
    seen = {}
    import fedlib.dp.distributed as dd

    original = dd.secure_noisy_sum

    def spy(release, key, stats_list):
        total = original(release, key, stats_list)
        plain = sum(s.grid_sum.numpy() + release.noise[c].discrete_gaussian(g.client_std(s.prior.dim), s.prior.dim,
                                                                            "dp-distributed-noise", key)
                    for c, s in enumerate(stats_list))
        seen[key] = (total, torch.from_numpy(plain.astype(np.float64) * (stats_list[0].bound / g.grid)))
        return total

    dd.secure_noisy_sum = spy
    try:
        _pass(model, public, [a, b], [g], shared=True, noise_seeds=[11, 12], blocks=1)
    finally:
        dd.secure_noisy_sum = original
    assert len(seen) == 4
    for total, plain in seen.values():
        assert torch.equal(total, plain)
    # grid rounding keeps a clipped row's norm within sqrt(d)/2 steps of the bound
    rows = clip_rows(torch.randn(50, 9, dtype=torch.float64) * 5, 2.0)
    steps = to_grid(rows, 2.0, GRID).double().norm(dim=1)
    assert (steps <= GRID + math.sqrt(9) / 2 + 1e-9).all()
    assert sensitivity_steps(GRID, 9) == 2 * GRID + 3


def test_noise_is_seeded_and_shared_inputs_share_one_release(model):
    public, a = _ids(8, seed=2), _ids(6, seed=3, low=64)
    # noise that the data's deviations clear (at epsilon = 64 this tiny sample is all noise: the public mask)
    g = NormalisedGuarantee(1e3, 1e-5, 2.0, 0, 0.05, count_releases(_names(model)), "x")
    (one,), _ = _pass(model, public, [a], [g], noise_seeds=[1])
    (two,), _ = _pass(model, public, [a], [g], noise_seeds=[1])
    (other,), _ = _pass(model, public, [a], [g], noise_seeds=[2])
    assert all(torch.equal(one[0][n], two[0][n]) for n in one[0])
    assert any(not torch.equal(one[0][n], other[0][n]) for n in one[0])
    assert input_key("model.layers.0.mlp.gate_proj") == input_key("model.layers.0.mlp.up_proj")


def test_cli_client_equals_the_simulated_federation_and_the_reader_checks_the_guarantee(tiny_model_dir, tmp_path):
    """``client-mask --dp-mechanism normalised`` writes, bit for bit, the client file the
    simulated federation writes with the same noise seed; the reader checks each mechanism's
    fields and accounting (a signed statistic claiming sqrt(2) C, too little noise, a wrong
    number of releases are refused)."""
    import json

    from fedlib.cli import main
    from fedlib.data import load_tokens, save_tokens
    from fedlib.maskfile import MaskFile, MaskFileError, read_header, write_mask_file
    from fedlib.models import open_model
    from fedlib.privacy.stages.dp_federation import simulate

    gen = torch.Generator().manual_seed(0)
    public, a, b = (tmp_path / f"{n}.safetensors" for n in ("public", "a", "b"))
    for path, low in ((public, 0), (a, 500), (b, 900)):
        save_tokens(path, torch.randint(low, low + 400, (6, 12), generator=gen), dataset="test", unit="span",
                    windows_per_unit=1)
    releases = [{"label": "norm", "mechanism": "normalised", "epsilon": 8.0, "delta": 1e-5, "clip": 2.0, "basis": 0},
                {"label": "post", "mechanism": "normalised", "epsilon": 1000.0, "delta": 1e-5, "clip": 2.0,
                 "basis": 0, "estimator": "posterior"},
                {"label": "thr", "mechanism": "normalised", "epsilon": 1000.0, "delta": 1e-5, "clip": 2.0,
                 "basis": 0},
                {"label": "dist", "mechanism": "distributed", "epsilon": 8.0, "delta": 1e-5, "clip": 2.0, "basis": 4}]
    handle = open_model(str(tiny_model_dir))
    record = simulate(handle, load_tokens(public)[0], [load_tokens(a)[0], load_tokens(b)[0]], releases,
                      tmp_path / "fed", Pruning("wanda", 0.5, "row", 0), noise_seed=7, unit=ProtectedUnit("span", 1))
    main(["client-mask", "--model", str(tiny_model_dir), "--calib", str(b), "--dp-mechanism", "normalised",
          "--dp-public", str(public), "--dp-epsilon", "8", "--dp-delta", "1e-5", "--dp-clip", "2",
          "--dp-noise-seed", str(derive_seed(7, "norm", 1)), "--dp-allow-seeded-noise", "--client-id", "1",
          "--out", str(tmp_path / "cli.safetensors")])
    main(["client-mask", "--model", str(tiny_model_dir), "--calib", str(b), "--dp-mechanism", "normalised",
          "--dp-public", str(public), "--dp-epsilon", "1000", "--dp-delta", "1e-5", "--dp-clip", "2",
          "--dp-estimator", "posterior", "--dp-noise-seed", str(derive_seed(7, "post", 1)), "--dp-allow-seeded-noise",
          "--client-id", "1",
          "--out", str(tmp_path / "cli-post.safetensors")])
    for label, file in (("norm", "cli.safetensors"), ("post", "cli-post.safetensors")):
        simulated = MaskFile(tmp_path / "fed" / label / "client_1.mask.safetensors").masks()
        cli = MaskFile(tmp_path / file).masks()
        assert all(torch.equal(simulated[n], cli[n]) for n in cli)
        dp = json.loads(read_header(tmp_path / file).extra["dp"])
        assert dp == json.loads(record["releases"][label]["guarantee"])
        assert dp["estimator"] == {"norm": "threshold", "post": "posterior"}[label]
    # at the same ε the estimator changes the masks (the checks above can fail)
    post, thr = (MaskFile(tmp_path / "fed" / label / "client_1.mask.safetensors").masks() for label in ("post", "thr"))
    assert any(not torch.equal(post[n], thr[n]) for n in thr)
    # ... yet both are post-processing of one noisy release: the same digest, one ledger entry, one ε
    digest = {label: read_header(tmp_path / "fed" / label / "client_1.mask.safetensors").extra["dp_release"]
              for label in ("norm", "post", "thr")}
    assert digest["post"] == digest["thr"] != digest["norm"]
    ledger = record["ledger"]["releases"]
    assert [(r["label"], r["estimators"]) for r in ledger] == [("norm", ["threshold"]),
                                                               ("post", ["posterior", "threshold"]),
                                                               ("dist", ["threshold"])]
    assert all(r["x_dp"]["noise"] == "seeded" for r in ledger)
    dist = read_header(tmp_path / "fed" / "dist" / "secagg.mask.safetensors")
    assert dist.client_id == "secagg" and dist.n_samples == 12
    assert json.loads(dist.extra["dp"])["clients"] == 2
    layers = handle.layers()
    for path in (tmp_path / "cli.safetensors", tmp_path / "fed" / "dist" / "secagg.mask.safetensors"):
        header, masks = read_header(path), MaskFile(path).masks()
        dp = json.loads(header.extra["dp"])
        for i, value in enumerate([{**dp, "sensitivity": math.sqrt(2)}, {**dp, "sigma": dp["sigma"] / 2},
                                   {**dp, "releases": dp["releases"] + 1}, {**dp, "mechanism": "laplace"},
                                   {**dp, "public": "abc"}, {k: v for k, v in dp.items() if k != "basis"},
                                   {**dp, "estimator": "median"}, {**dp, "noise": "pseudo"}, {**dp, "unit": "page"},
                                   {**dp, "windows_per_unit": 2},  # k = 2 needs sensitivity 4
                                   {k: v for k, v in dp.items() if k != "noise"}]):
            bad = tmp_path / f"bad{i}.safetensors"
            write_mask_file(bad, masks, layers, fingerprint=header.fingerprint, role="client", client_id="0",
                            method="wanda", group=header.group, sparsity=header.sparsity, n_samples=header.n_samples,
                            seed=0, extra={"dp": json.dumps(value, separators=(",", ":"))})
            with pytest.raises(MaskFileError, match="x_dp"):
                read_header(bad)
        # files written before x_dp named its unit and noise, or its estimator (then always the threshold), still read
        before_unit = {k: v for k, v in dp.items() if k not in ("unit", "windows_per_unit", "noise")}
        for i, old in enumerate((before_unit, {k: v for k, v in before_unit.items() if k != "estimator"})):
            legacy = tmp_path / f"legacy{i}.safetensors"
            write_mask_file(legacy, masks, layers, fingerprint=header.fingerprint, role="client", client_id="0",
                            method="wanda", group=header.group, sparsity=header.sparsity, n_samples=header.n_samples,
                            seed=0, extra={"dp": json.dumps(old, separators=(",", ":"))})
            assert json.loads(read_header(legacy).extra["dp"]) == old
    # the CLI refuses what it cannot account: seeded noise not asked for, windows cut at random offsets
    base = ["client-mask", "--model", str(tiny_model_dir), "--calib", str(a), "--out", str(tmp_path / "x.safetensors")]
    norm = ["--dp-mechanism", "normalised", "--dp-public", str(public), "--dp-epsilon", "8", "--dp-delta", "1e-5",
            "--dp-clip", "2"]
    random_offsets = tmp_path / "random.safetensors"
    save_tokens(random_offsets, load_tokens(a)[0], dataset="test")
    assert main(base + norm + ["--dp-noise-seed", "3"]) == 2
    assert main(["client-mask", "--model", str(tiny_model_dir), "--calib", str(random_offsets), "--out",
                 str(tmp_path / "x.safetensors")] + norm) == 2
    assert main(base + norm + ["--dp-unit", "client"]) == 0  # a client unit needs no cut: its mean is clipped once
    assert json.loads(read_header(tmp_path / "x.safetensors").extra["dp"])["unit"] == "client"
    (tmp_path / "x.safetensors").unlink()
    for bad in (["--dp-mechanism", "normalised", "--dp-epsilon", "8", "--dp-delta", "1e-5", "--dp-clip", "2"],
                ["--dp-mechanism", "distributed", "--dp-public", str(public), "--dp-clients", "2",
                 "--dp-epsilon", "8", "--dp-delta", "1e-5", "--dp-clip", "2"],
                ["--dp-public", str(public), "--dp-epsilon", "8", "--dp-delta", "1e-5", "--dp-clip", "2"],
                ["--dp-estimator", "posterior", "--dp-epsilon", "8", "--dp-delta", "1e-5", "--dp-clip", "2"]):
        assert main(base + bad) == 2
        assert not (tmp_path / "x.safetensors").exists()


def test_membership_audit_of_the_normalised_mechanisms_stays_below_the_proven_epsilon(model):
    from fedlib.dp.distributed import public_dp
    from fedlib.privacy.stages.membership import membership_audit

    pop = torch.randint(0, 128, (40, 8), generator=torch.Generator().manual_seed(3))
    public = _ids(8, seqlen=8, seed=9)
    kwargs = dict(targets=24, samples=4, pairs=4, blocks=1, pruning=Pruning(seed=0))
    plain = membership_audit(model, pop, **kwargs)
    assert plain["attack"]["epsilon_lr1"]["epsilon_lb"] > 0.5  # the check below can fail
    for mechanism, clients in (("normalised", None), ("distributed", 2)):
        private = membership_audit(model, pop, **kwargs, dp=public_dp(mechanism, 0.5, 1e-5, 2.0, 0, clients, public))
        assert private["dp"]["epsilon"] == 0.5 and private["dp"]["releases"] == 4
        for bound in ("epsilon_lr1", "epsilon_split"):
            assert private["attack"][bound]["epsilon_lb"] <= 0.5


# --------------------------------------------------------------------------- the headroom analysis


def _headroom(model, public, clients, variants):
    from fedlib.privacy.dp_headroom import collect_statistics, variant_masks

    pruning = Pruning("wanda", SPARSITY, GROUP, SEED, batch_size=4)
    blocks = collect_statistics(model, public, clients, pruning)
    return [variant_masks(blocks, v, pruning) for v in variants]


def test_headroom_exact_row_is_wanda_on_the_pooled_data_through_the_public_prefix(model):
    """The exact row (fedlib.privacy.dp_headroom) against the hand-computed reference; far more
    noise than signal gives the public mask with no coordinate moved, and (almost) none gives
    the exact row back, for the shipped estimator and the oracle alike."""
    from fedlib.privacy.dp_headroom import Variant

    public, a, b = _ids(8, seed=2), _ids(5, seed=3, low=64), _ids(7, seed=4)
    _, public_masks = _pass(model, public, [a], [_no_noise(model, public)])
    ref = reference_masks(model, torch.cat([a, b]), public_masks)
    g = DistributedGuarantee(1.0, 1e-5, 1e3, 0, 2.0, count_releases(_names(model)), "x", clients=2)
    rows = [Variant("exact"), Variant("threshold", g, 1e3, 1e-9), Variant("oracle", g, 1e3, 1e-9),
            Variant("threshold", g, 1e3, 1e12), Variant("oracle", g, 1e3, 1e12)]
    (exact, moved), (loud_t, moved_t), (loud_o, _), (quiet_t, _), (quiet_o, _) = _headroom(model, public, [a, b], rows)
    assert all(torch.equal(exact[n], ref[n]) for n in ref)
    assert moved > 0 and any(not torch.equal(exact[n], public_masks[n]) for n in ref)  # the data moves the mask
    assert moved_t == 0
    for masks in (loud_t, loud_o):
        assert all(torch.equal(masks[n], public_masks[n]) for n in ref)
    for masks in (quiet_t, quiet_o):
        assert all(torch.equal(masks[n], ref[n]) for n in ref)


def test_headroom_variants_are_checked():
    from fedlib.privacy.dp_headroom import Variant, variants_from_spec

    g = DistributedGuarantee(1.0, 1e-5, 2.0, 0, 2.0, 4, "x", clients=2)
    with pytest.raises(ValueError, match="takes no guarantee"):
        Variant("exact", g, 2.0)
    with pytest.raises(ValueError, match="known exact, threshold, posterior, oracle"):
        Variant("median", g, 2.0)
    with pytest.raises(ValueError, match="finite clip"):
        Variant("oracle", g)
    with pytest.raises(ValueError, match="expected keys"):
        variants_from_spec([{"estimator": "threshold", "eps": 8}], [0], 2.0, ["model.layers.0.mlp.down_proj"], 2, "x")
    rows = variants_from_spec([{"estimator": "threshold", "epsilon": 8, "multipliers": [1, 4]},
                               {"estimator": "oracle", "epsilon": 8}], [0, 1], 2.0,
                              ["model.layers.0.mlp.down_proj"], 2, "x")
    assert [r.label for r in rows] == ["exact", "threshold-eps8-x1-n0", "threshold-eps8-x1-n1", "threshold-eps8-x4-n0",
                                       "threshold-eps8-x4-n1", "oracle-eps8-x1-n0", "oracle-eps8-x1-n1"]
    # the guarantee is the distributed mechanism's at that ε, over the given releases
    assert rows[1].guarantee.sigma == pytest.approx(calibrate_distributed_sigma(8.0, 1e-5, 1, 2, GRID))


def test_headroom_summary_pairs_rows_and_pools_noise_draws():
    """Kept share against a hand computation: a row at Centralized keeps 100 %, one at public 0 %,
    and two noise draws pool into their mean with an interval that covers both."""
    from fedlib.studies.headroom import headroom_summary

    rng = np.random.default_rng(1)
    public = rng.normal(5.0, 0.3, 20)
    central = public - 0.1 + rng.normal(0, 0.01, 20)
    half = public - 0.05
    rows = [{"estimator": "exact", "epsilon": None, "multiplier": 1.0, "window_nll": central.tolist(), "moved_coordinates": 9},
            {"estimator": "threshold", "epsilon": 8.0, "multiplier": 1.0, "window_nll": public.tolist(),
             "moved_coordinates": 0},
            {"estimator": "threshold", "epsilon": 8.0, "multiplier": 4.0, "window_nll": (half - 0.02).tolist(),
             "moved_coordinates": 3},
            {"estimator": "threshold", "epsilon": 8.0, "multiplier": 4.0, "window_nll": (half + 0.02).tolist(),
             "moved_coordinates": 5}]
    for i, row in enumerate(rows):
        row["label"] = f"row{i}"
    out = headroom_summary({"rows": rows, "samples": 10}, public, central)
    exact, none, pooled = out
    gain = (central - public).mean()
    assert exact["kept"] == pytest.approx(1.0) and none["kept"] == 0.0 and none["ci"] == (0.0, 0.0)
    assert pooled["kept"] == pytest.approx(-0.05 / gain) and pooled["noise_draws"] == 2
    assert pooled["kept_by_draw"] == pytest.approx([-0.07 / gain, -0.03 / gain])
    assert pooled["kept_ci"][0] < pooled["kept"] < pooled["kept_ci"][1] and pooled["samples"] == 40
    assert pooled["moved"] == 4
    with pytest.raises(ValueError, match="windows"):
        headroom_summary({"rows": rows, "samples": 10}, public[:5], central[:5])


def test_headroom_posterior_mean_against_the_true_prior():
    """The empirical-Bayes estimator against the Bayes posterior mean computed with the prior the
    data were drawn from (0 w.p. 0.9, 4 noise stds w.p. 0.1): close to it, and with a smaller
    squared error than the noisy values or the family-wise soft threshold."""
    from fedlib.dp.public import posterior_mean

    gen = torch.Generator().manual_seed(0)
    d, std, spike = 4000, 0.5, 2.0
    mu = torch.where(torch.rand(d, generator=gen, dtype=torch.float64) < 0.1, spike, 0.0)
    noisy = mu + std * torch.randn(d, generator=gen, dtype=torch.float64)
    odds = 0.1 * torch.exp(-0.5 * ((noisy - spike) / std) ** 2) / (0.9 * torch.exp(-0.5 * (noisy / std) ** 2))
    bayes = spike * odds / (1 + odds)
    fitted = posterior_mean(noisy, std)
    lam = noise_threshold(std, d)
    soft = noisy.sign() * (noisy.abs() - lam).clamp_min(0.0)
    err = {name: float((x - mu).pow(2).mean()) for name, x in
           (("fitted", fitted), ("bayes", bayes), ("noisy", noisy), ("soft", soft))}
    assert err["fitted"] < 1.1 * err["bayes"], err
    assert err["fitted"] < 0.5 * min(err["noisy"], err["soft"]), err
    assert float((fitted - bayes).abs().max()) < 0.3 * spike


def test_posterior_keeps_the_public_value_unless_the_input_stands_out_of_the_noise():
    """The posterior estimator's test: pure noise passes it at the family-wise rate (Monte Carlo
    against the nominal level), and then the estimate is exactly the public value, as the
    threshold's; without the test the fitted prior would let a few percent of the noise through.
    A deviation spread thinly over every coordinate (1 noise std each) passes, and the posterior
    recovers much of what the threshold (about 4 stds at this size) throws away."""
    from fedlib.dp.public import estimate_deviation, posterior_mean, stands_out

    gen = torch.Generator().manual_seed(0)
    d, trials, level = 64, 4000, 0.2
    noise = torch.randn(trials, d, generator=gen, dtype=torch.float64)
    rate = sum(stands_out(row, 1.0, releases=2, level=level) for row in noise) / trials
    assert abs(rate - level / 2) < 4 * math.sqrt(level / 2 * (1 - level / 2) / trials), rate
    shape = PassShape(coordinates=120 * 576, releases=120)
    quiet = 3.0 * torch.randn(576, generator=gen, dtype=torch.float64)
    assert torch.equal(estimate_deviation("posterior", quiet, 3.0, shape), torch.zeros(576, dtype=torch.float64))
    assert torch.equal(estimate_deviation("threshold", quiet, 3.0, shape), torch.zeros(576, dtype=torch.float64))
    assert 0 < float(posterior_mean(quiet, 3.0).abs().mean()) < 0.1 * float(quiet.abs().mean())
    mu = torch.where(torch.rand(576, generator=gen, dtype=torch.float64) < 0.5, 1.0, -1.0)
    noisy = mu + torch.randn(576, generator=gen, dtype=torch.float64)
    post, soft = (estimate_deviation(e, noisy, 1.0, shape) for e in ("posterior", "threshold"))
    assert float((post - mu).square().mean()) < 0.5 * float((soft - mu).square().mean())
    with pytest.raises(ValueError, match="estimator 'median'"):
        estimate_deviation("median", noisy, 1.0, shape)
