"""The DP client mechanism (fedlib.dp.gaussian): accounting checked against the analytic Gaussian
mechanism, clipping against brute force, the no-DP path bit for bit, seeded noise, the mask
file's guarantee, and the membership attack's audited epsilon against the proven one."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy import optimize, stats

from fedlib.client import Pruning, prune_locally
from fedlib.maskfile import MaskFileError, read_header
from fedlib.dp.samplers import NoiseSource
from fedlib.dp.gaussian import (
    DPTarget,
    calibrate_sigma,
    clipped_sample_sum,
    count_releases,
    dp_method,
    gaussian_epsilon,
    input_key,
    pld_epsilon,
)


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon at ``delta`` of a Gaussian mechanism with sensitivity/std = ``mu``
    (Balle & Wang 2018, Thm. 8): delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)."""
    def delta_of(eps):
        return stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)
    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 200.0, xtol=1e-10)


@pytest.mark.parametrize("epsilon,releases", [(1.0, 1), (4.0, 8), (8.0, 120)])
def test_calibrated_sigma_meets_target_by_an_independent_bound(epsilon, releases):
    delta = 1e-5
    sigma = calibrate_sigma(epsilon, delta, releases)
    # k Gaussian releases of multiplier sigma compose exactly to one of mu = sqrt(k) / sigma (GDP)
    exact = analytic_gaussian_epsilon(math.sqrt(releases) / sigma, delta)
    assert exact <= epsilon + 1e-6
    assert exact >= 0.98 * epsilon  # tight: PLD's discretisation costs little noise
    assert pld_epsilon(sigma, releases, delta) <= epsilon
    # more releases need more noise for the same budget
    assert calibrate_sigma(epsilon, delta, releases + 4) > sigma


@pytest.mark.parametrize("sigma,releases", [(1.0, 1), (6.575, 120), (0.5, 4), (40.867, 1)])
def test_exact_gaussian_epsilon_is_the_analytic_one(sigma, releases):
    """The release audit's exact ε of a release (fedlib.dp.gaussian.gaussian_epsilon) against
    scipy's root of Balle & Wang's δ(ε) here; PLD's ε bounds it from above."""
    exact = gaussian_epsilon(sigma, releases, 1e-5)
    assert exact == pytest.approx(analytic_gaussian_epsilon(math.sqrt(releases) / sigma, 1e-5), rel=1e-7)
    assert exact <= pld_epsilon(sigma, releases, 1e-5) + 1e-9
    assert gaussian_epsilon(0.0, 1, 1e-5) == math.inf
    assert gaussian_epsilon(1e6, 1, 1e-5) == 0.0


def test_input_keys_group_linears_that_share_an_input(model):
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]
    assert count_releases(names) == 4 * 2  # attention in, o_proj in, MLP in, down_proj in; 2 blocks
    assert input_key("model.layers.1.self_attn.k_proj") == input_key("model.layers.1.self_attn.v_proj")
    assert input_key("model.layers.1.mlp.up_proj") != input_key("model.layers.0.mlp.up_proj")
    # the grouping is true of the model: linears with one key see the same tensor
    seen = {}

    def keep(name):
        def hook(_module, inp, _out):
            seen[name] = inp[0].clone()
        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in model.named_modules() if n in names]
    model(torch.randint(0, 128, (2, 6)))
    for h in hooks:
        h.remove()
    for a in names:
        for b in names:
            assert (input_key(a) == input_key(b)) == torch.equal(seen[a], seen[b])


def test_clipping_bounds_one_sample_by_brute_force():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, 7, generator=gen) * torch.tensor([0.1, 1, 5, 20, 1, 3]).reshape(-1, 1, 1)
    clip = 4.0
    full = clipped_sample_sum(x, clip)
    for s in range(x.shape[0]):
        rest = torch.cat([x[:s], x[s + 1:]])
        assert (full - clipped_sample_sum(rest, clip)).norm() <= clip * (1 + 1e-12)  # add/remove: clip
        for r in range(x.shape[0]):  # replace-one: sqrt(2) clip, the mechanism's sensitivity
            replaced = torch.cat([x[:s], x[r:r + 1], x[s + 1:]])
            assert (full - clipped_sample_sum(replaced, clip)).norm() <= math.sqrt(2) * clip * (1 + 1e-12)
    # without clipping one loud sample moves the statistic far beyond clip: the check can fail
    unclipped = clipped_sample_sum(x, math.inf)
    assert (unclipped - clipped_sample_sum(x[:-1], math.inf)).norm() > 10 * clip
    # samples under the bound are summed unchanged
    quiet = x[:1] * 0.01
    assert torch.equal(clipped_sample_sum(quiet, 1e6), quiet.double().pow(2).sum(1)[0])


def _dp_masks(model, ids, epsilon, seed=0, clip=1.0):
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]
    method, guarantee = dp_method("wanda", DPTarget(epsilon, 1e-5, clip), names, NoiseSource(seed))
    return prune_locally(model, ids, Pruning(method, 0.5, "row", 0)).masks, guarantee


def test_no_dp_path_is_plain_wanda_and_noise_is_seeded(model):
    ids = torch.randint(0, 128, (8, 16), generator=torch.Generator().manual_seed(1))
    plain = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0)).masks
    assert not DPTarget(math.inf, 1e-5, 1.0).enabled  # the CLI's inf: the plain path, no header
    a, guarantee = _dp_masks(model, ids, 2.0, seed=0)
    b, _ = _dp_masks(model, ids, 2.0, seed=0)
    c, _ = _dp_masks(model, ids, 2.0, seed=1)
    assert guarantee.releases == 8 and guarantee.sigma > 0
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(a[n], c[n]) for n in a)
    assert any(not torch.equal(a[n], plain[n]) for n in a)
    # gate/up share one noisy statistic: with weights made equal, their masks are equal
    mlp = model.model.layers[0].mlp
    with torch.no_grad():
        mlp.up_proj.weight.copy_(mlp.gate_proj.weight)
    d, _ = _dp_masks(model, ids, 2.0, seed=0)
    assert torch.equal(d["model.layers.0.mlp.gate_proj"], d["model.layers.0.mlp.up_proj"])


def test_cli_records_the_guarantee_and_inf_is_byte_identical(tiny_model_dir, tmp_path, capsys):
    from fedlib.cli import main
    from fedlib.data import save_tokens

    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.randint(0, 100, (4, 12), generator=torch.Generator().manual_seed(0)), dataset="test",
                unit="span", windows_per_unit=1)
    base = ["client-mask", "--model", str(tiny_model_dir), "--calib", str(calib), "--sparsity", "0.5"]
    main(base + ["--out", str(tmp_path / "plain.safetensors")])
    main(base + ["--dp-epsilon", "inf", "--dp-delta", "1e-5", "--dp-clip", "1", "--out", str(tmp_path / "inf.safetensors")])
    assert (tmp_path / "plain.safetensors").read_bytes() == (tmp_path / "inf.safetensors").read_bytes()
    main(base + ["--dp-epsilon", "3", "--dp-delta", "1e-5", "--dp-clip", "2", "--out", str(tmp_path / "dp.safetensors")])
    header = read_header(tmp_path / "dp.safetensors")
    dp = json.loads(header.extra["dp"])
    assert dp["epsilon"] == 3.0 and dp["delta"] == 1e-5 and dp["clip"] == 2.0 and dp["accountant"] == "pld"
    assert dp["releases"] == count_releases(layer["name"] for layer in header.layers)
    assert pld_epsilon(dp["sigma"], dp["releases"], dp["delta"]) <= 3.0
    dp_args = ["--dp-epsilon", "3", "--dp-delta", "1e-5", "--dp-clip", "2"]
    for bad in (["--method", "magnitude"] + dp_args, ["--dp-epsilon", "3"], ["--dp-delta", "1e-5"],
                ["--dp-epsilon", "3", "--dp-delta", "2", "--dp-clip", "1"], dp_args[:4] + ["--dp-clip", "0"]):
        assert main(base + bad + ["--out", str(tmp_path / "bad.safetensors")]) == 2
        assert not (tmp_path / "bad.safetensors").exists()
    assert "wanda" in capsys.readouterr().err


def test_reader_refuses_a_guarantee_out_of_range(tiny_model_dir, tmp_path):
    from fedlib.cli import main
    from fedlib.data import save_tokens
    from fedlib.maskfile import MaskFile, write_mask_file

    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.randint(0, 100, (4, 12), generator=torch.Generator().manual_seed(0)), dataset="test",
                unit="span", windows_per_unit=1)
    good = tmp_path / "dp.safetensors"
    main(["client-mask", "--model", str(tiny_model_dir), "--calib", str(calib), "--dp-epsilon", "2",
          "--dp-delta", "1e-5", "--dp-clip", "1", "--out", str(good)])
    header = read_header(good)
    masks = MaskFile(good).masks()
    from fedlib.models import open_model

    layers = open_model(str(tiny_model_dir)).layers()
    dp = json.loads(header.extra["dp"])
    bad_values = [{**dp, "epsilon": -1.0}, {**dp, "delta": 1.0}, {**dp, "clip": 0.0}, {**dp, "sigma": 1}, {**dp, "sigma": dp["sigma"] / 2},
                  {**dp, "accountant": "rdp"}, {**dp, "neighbours": "add-remove"}, {**dp, "releases": dp["releases"] + 1},
                  {k: v for k, v in dp.items() if k != "sigma"}]
    for i, value in enumerate(bad_values):
        path = tmp_path / f"bad{i}.safetensors"
        write_mask_file(path, masks, layers, fingerprint=header.fingerprint, role="client", client_id="0",
                        method="wanda", group=header.group, sparsity=header.sparsity, n_samples=header.n_samples,
                        seed=0, extra={**header.extra, "dp": json.dumps(value, separators=(",", ":"))})
        with pytest.raises(MaskFileError, match="x_dp"):
            read_header(path)


@pytest.mark.slow
def test_membership_attack_stays_below_the_proven_epsilon(model):
    """The audit's check: the LiRA lower bound on a DP client's block-0 mask must not exceed the
    epsilon the accountant proves. Without DP the same attack's bound exceeds that epsilon, so
    the check can fail."""
    from fedlib.privacy.stages.membership import membership_audit

    pop = torch.randint(0, 128, (40, 8), generator=torch.Generator().manual_seed(3))
    kwargs = dict(targets=32, samples=2, pairs=4, blocks=1, pruning=Pruning(seed=0))
    epsilon = 0.5
    plain = membership_audit(model, pop, **kwargs)
    private = membership_audit(model, pop, **kwargs, dp=DPTarget(epsilon, 1e-5, 1.0))
    assert private["dp"]["epsilon"] == epsilon and private["dp"]["releases"] == 4  # block 0's four inputs
    assert plain["attack"]["epsilon_lr1"]["epsilon_lb"] > epsilon  # the check can fail
    for bound in ("epsilon_lr1", "epsilon_split"):
        assert private["attack"][bound]["epsilon_lb"] <= epsilon
        assert private["attack"][bound]["delta"] == 1e-5
    assert private["attack"]["auc"] < plain["attack"]["auc"]


def test_dp_report_checks_audited_against_proven(tiny_model_dir, tmp_path):
    """``fedlib privacy dp-report``: per setting the proven ε from the client's mask file, the
    audited bounds from ``fedlib privacy membership --dp-*``, and 'NO' when a bound exceeds the
    proven ε (here: the audit's file altered to claim a larger bound)."""
    import csv

    from fedlib.cli import main
    from fedlib.data import save_tokens

    calib, pop = tmp_path / "calib.safetensors", tmp_path / "pop.safetensors"
    save_tokens(calib, torch.randint(0, 100, (4, 12), generator=torch.Generator().manual_seed(0)), dataset="test",
                unit="span", windows_per_unit=1)
    save_tokens(pop, torch.randint(0, 100, (24, 8), generator=torch.Generator().manual_seed(1)), dataset="test")
    model = ["--model", str(tiny_model_dir)]
    settings = {}
    for eps in ("inf", "3"):
        dp = ["--dp-epsilon", eps, "--dp-delta", "1e-5", "--dp-clip", "1"]
        files = {k: tmp_path / f"{eps}.{k}" for k in ("client_mask", "eval", "membership")}
        assert main(["client-mask", *model, "--calib", str(calib), *dp, "--out", str(files["client_mask"])]) == 0
        assert main(["privacy", "membership", *model, "--population", str(pop), "--targets", "8", "--samples", "2",
                     "--pairs", "4", "--blocks", "1", *dp, "--out", str(files["membership"])]) == 0
        files["eval"].write_text(json.dumps({"model_fingerprint": "f" * 64, "applied": {}, "perplexity": {
            "wikitext2": {"ppl": 10.0 + float(eps), "windows": 1, "total_windows": 1, "seqlen": 8}}}))
        settings[eps] = {k: str(v) for k, v in files.items()}
    spec = {"context": {"model": "tiny", "config": "test", "seed": 0}, "out_dir": str(tmp_path), "suffix": "",
            "datasets": ["wikitext2"], "settings": settings}

    def table():
        assert main(["privacy", "dp-report", "--spec", json.dumps(spec)]) == 0
        return {row["proven ε"]: row for row in csv.DictReader((tmp_path / "privacy_dp.csv").open())}

    rows = table()
    assert set(rows) == {"3", "∞ (no DP)"} and rows["3"]["audit ≤ proven"] == "yes"
    audit = json.loads((tmp_path / "3.membership").read_text())
    lb = audit["attack"]["epsilon_lr1"]["epsilon_lb"]
    assert rows["3"]["audited ε LB (LR=1)"] == ("-" if lb is None else f"{lb:.2f}")
    assert rows["3"]["WikiText-2 ppl"] == "13.00" and rows["∞ (no DP)"]["audit ≤ proven"] == "-"
    # the guarantee as the mask file records it: a span, noise from the OS, a per-client mechanism
    guarantee = next(line for line in (tmp_path / "privacy_dp.md").read_text().splitlines() if "x_dp" in line)
    assert "protected unit one span (at most 1 window each)" in guarantee and "noise secret" in guarantee
    assert "simulation" not in guarantee and "leaves its ε unchanged" in guarantee
    audit["attack"]["epsilon_lr1"]["epsilon_lb"] = 3.5
    (tmp_path / "3.membership").write_text(json.dumps(audit))
    assert table()["3"]["audit ≤ proven"] == "NO"


def test_dp_utility_table_against_its_inputs(tiny_model_dir, tmp_path):
    """``privacy_dp_utility``: per federation the ratio to its own no-DP perplexity, the public
    ε = 0 row, and randomized response at bits per client × per-bit ε (recomputed here); a
    mask file that proves another ε than its row is refused, naming the file."""
    import csv

    from fedlib.cli import main
    from fedlib.data import save_tokens
    from fedlib.privacy.tables.dp import dp_utility_table

    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.randint(0, 100, (4, 12), generator=torch.Generator().manual_seed(0)), dataset="test",
                unit="span", windows_per_unit=1)

    def result(name, value):
        path = tmp_path / name
        path.write_text(json.dumps({"model_fingerprint": "f" * 64, "applied": {}, "perplexity": {
            "wikitext2": {"ppl": value, "windows": 1, "total_windows": 1, "seqlen": 8}}}))
        return str(path)

    masks = {}
    for eps in ("inf", "3"):
        dp = [] if eps == "inf" else ["--dp-epsilon", eps, "--dp-delta", "1e-5", "--dp-clip", "1"]
        masks[eps] = str(tmp_path / f"{eps}.mask")
        assert main(["client-mask", "--model", str(tiny_model_dir), "--calib", str(calib), *dp,
                     "--out", masks[eps]]) == 0
    record = tmp_path / "rr.record.json"
    record.write_text(json.dumps({"bits_per_client": 5000, "n_clients": 3}))
    federations = [{"clients": 2, "samples": s, "data": "test",
                    "settings": {"inf": {"client_mask": masks["inf"], "eval": result(f"{s}inf", 40.0)},
                                 "3": {"client_mask": masks["3"], "eval": result(f"{s}e3", ppl)}}}
                   for s, ppl in ((1, 90.0), (4, 50.0))]
    spec = {"context": {"model": "tiny", "config": "test", "seed": 0}, "out_dir": str(tmp_path), "suffix": "",
            "datasets": ["wikitext2"], "seqlen": 12, "samples_per_client": 1, "delta": 1e-5, "clip": 1.0,
            "utility": {"federations": federations,
                        "public": {"mask": masks["inf"], "eval": result("public", 45.0), "text": "t"},
                        "randomized_response": {"records": {"2": str(record)}, "evals": {"2": result("rr", 900.0)},
                                                "clients": 3},
                        "dense_eval": result("dense", 30.0)}}
    # one DP row with seeded noise: the table says it is a simulation
    seeded = str(tmp_path / "seeded.mask")
    assert main(["client-mask", "--model", str(tiny_model_dir), "--calib", str(calib), "--dp-epsilon", "3",
                 "--dp-delta", "1e-5", "--dp-clip", "1", "--dp-noise-seed", "4", "--dp-allow-seeded-noise",
                 "--out", seeded]) == 0
    federations[1]["settings"]["3"]["client_mask"] = seeded
    paths = dp_utility_table(spec)
    assert paths[-1].suffix == ".png" and paths[-1].stat().st_size > 0
    guarantee = next(line for line in paths[0].read_text().splitlines() if "x_dp" in line)
    assert "noise seeded (simulation: not private" in guarantee
    rows = [r for r in csv.reader((tmp_path / "privacy_dp_utility.csv").open()) if len(r) == 6][1:]
    assert [(r[2], r[4], r[5]) for r in rows] == [
        ("-", "30.00", "-"), ("∞", "40.00", "1×"), ("3", "90.00", f"{90 / 40:.3g}×"),
        ("∞", "40.00", "1×"), ("3", "50.00", f"{50 / 40:.3g}×"), ("0", "45.00", "-"),
        (f"{2 * 5000:.3g} (bits per client × per-bit ε)", "900.00", "-")]
    federations[0]["settings"]["5"] = federations[0]["settings"].pop("3")
    with pytest.raises(ValueError, match="3.mask.*ε=3"):
        dp_utility_table(spec)
