"""The privacy audit stages (fedlib.privacy.stages, `fedlib privacy ...`) on tiny models:
the wiring of the library into masks, files, attacks, the defence and the report tables."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
import torch

from fedlib.cli import main
from fedlib.maskfile import MaskFile, write_mask_file
from fedlib.models import fingerprint, load_model, prunable_layers
from fedlib.privacy import randomized_response, rr_flip_probability
from fedlib.provenance import written_by
from fedlib.client import Pruning, prune_locally
from fedlib.privacy.stages.defence import rr_count_cdf, sample_rr_counts
from fedlib.privacy.stages.inversion import tiny_inversion_cases
from fedlib.privacy.stages.membership import membership_audit
from fedlib.privacy.stages.recompute import client_masks
from fedlib.privacy.stages.sensitivity import sensitivity_audit
from fedlib.privacy.stages.similarity import similarity_audit
from fedlib.server.fedprllm import FedPrLLM

torch.set_num_threads(1)


def _ids(n, seqlen=12, vocab=128, seed=0):
    return torch.randint(0, vocab, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def test_first_block_masks_equal_the_full_run(model):
    ids = _ids(2)
    full = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0)).masks
    first = client_masks(model, ids, Pruning("wanda", 0.5, "row", 0), blocks=1)
    assert set(first) == {n for n in full if ".layers.0." in n}
    assert all(torch.equal(first[n], full[n]) for n in first)
    assert set(client_masks(model, ids, blocks=None)) == set(full)


def test_sensitivity_zero_for_identical_and_positive_for_different_data(model):
    ids = _ids(2)
    same = sensitivity_audit(model, ids, ids.clone(), neighbours=2)
    assert [nb["changed_bits"] for nb in same["neighbours"]] == [0, 0]
    other = sensitivity_audit(model, ids, _ids(2, seed=1), neighbours=2, blocks=1)
    assert all(nb["changed_bits"] > 0 for nb in other["neighbours"])
    assert other["total_entries"] == sum(other["type_sizes"].values())
    assert other["n_layers"] == 7  # block 0 only


def _write_client(path, model, ids, client_id):
    masks = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0)).masks
    write_mask_file(path, masks, prunable_layers(model), fingerprint=fingerprint(model), role="client",
                    client_id=client_id, method="wanda", group="row", sparsity=0.5, n_samples=ids.shape[0])
    return masks


def test_similarity_pairs_count_exact_hamming(tmp_path, model):
    a, b = _ids(2, seed=0), _ids(2, seed=5)
    paths = [tmp_path / f"c{i}.mask.safetensors" for i in range(3)]
    ma = _write_client(paths[0], model, a, "0")
    _write_client(paths[1], model, a, "1")  # same data as client 0
    mb = _write_client(paths[2], model, b, "2")
    res = similarity_audit(model, paths)
    diff = {(p["i"], p["j"]): sum(p["diff"].values()) for p in res["clients"]["pairs"]}
    assert diff[(0, 1)] == 0
    expected = sum(int((ma[n] ^ mb[n]).sum()) for n in ma)
    assert diff[(0, 2)] == expected == diff[(1, 2)] > 0
    assert res["total_entries"] == sum(m.numel() for m in ma.values())


def _membership(model, method):
    pop = _ids(24, seqlen=8, seed=3)
    return membership_audit(model, pop, targets=12, samples=2, pairs=4, blocks=1, pruning=Pruning(method),
                            epsilons=[0.01])


def test_membership_detects_a_leaking_mechanism_not_a_data_free_one(model):
    leak = _membership(model, "wanda")  # block-0 Wanda masks of 2 samples: the target is half the data
    assert leak["attack"]["auc"] > 0.9
    assert leak["attack"]["epsilon_lr1"]["epsilon_lb"] > 0  # leakage shown at 95 % confidence
    assert leak["observed_bits"] == sum(m.numel() for m in client_masks(model, _ids(1), blocks=1).values())
    assert leak["attack"]["n_members"] == leak["attack"]["n_nonmembers"] == 12
    low = leak["attack"]["tpr_at_fpr"][1]  # 0.1 % FPR with 12 non-members: not resolvable, said so
    assert not low["resolvable"] and low["fpr"] == 0.0 and "resolution" in low["note"]
    assert 0 <= leak["signal_strength"]["ratio"] < 5
    rr = leak["rr"][0]  # ε = 0.01 per bit: almost every bit a coin flip
    assert rr["epsilon"] == 0.01 and rr["auc"] < leak["attack"]["auc"]

    free = _membership(model, "magnitude")  # data-independent masks: nothing to infer
    assert free["attack"]["auc"] == pytest.approx(0.5)
    assert free["attack"]["epsilon_lr1"]["epsilon_lb"] == 0.0
    assert free["signal_strength"]["target_hamming"] == 0.0


def test_rr_count_sampler_matches_per_client_randomized_response():
    m, eps = 6, 0.7
    cdf = rr_count_cdf(m, eps)
    assert torch.allclose(cdf[:, -1], torch.ones(m + 1, dtype=cdf.dtype))
    true = torch.tensor([0, 2, 6]).repeat_interleave(20000)
    counts = sample_rr_counts(true, m, eps, torch.Generator().manual_seed(0), cdf)
    # the same clients' bits flipped one by one
    bits = torch.stack([true > i for i in range(m)])  # client i prunes the weight iff i < C
    flipped = sum(randomized_response(bits[i], eps, seed=i, name="x").long() for i in range(m))
    p = 1 - rr_flip_probability(eps)
    for c in (0, 2, 6):
        sel = true == c
        mean = c * p + (m - c) * (1 - p)
        var = m * p * (1 - p)
        for sample in (counts[sel].double(), flipped[sel].double()):
            assert abs(float(sample.mean()) - mean) < 0.05
            assert abs(float(sample.var()) - var) < 0.1


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dir):
    """The tiny model with the real tokenizer, loaded once for every CLI call of this module."""
    return load_model(str(tiny_model_dir))


@pytest.fixture
def cli_model(monkeypatch, tiny_loaded):
    """`fedlib privacy ...` verbs get the already loaded tiny model (the CLI wiring is
    unchanged; only the ~1 s model load per call is saved)."""
    from fedlib import privacy_cli
    from fedlib.models import ModelHandle

    handle, opened = ModelHandle.of(tiny_loaded[0]), privacy_cli._open

    def open_loaded(args, pruned=True, many_masks=False):  # nor the allocator setting of many_masks
        with monkeypatch.context() as patch:
            patch.setattr("fedlib.models.open_model", lambda *_args, **_kwargs: handle)
            return opened(args, pruned)

    monkeypatch.setattr(privacy_cli, "_open", open_loaded)
    return tiny_loaded[0]


@pytest.fixture(scope="module")
def tiny_clients(tmp_path_factory, tiny_loaded):
    """Three client mask files of the tiny model with the real tokenizer."""
    folder = tmp_path_factory.mktemp("privacy-clients")
    model = tiny_loaded[0]
    paths = []
    for i in range(3):
        path = folder / f"client_{i}.mask.safetensors"
        _write_client(path, model, _ids(2, seqlen=16, vocab=1000, seed=10 + i), str(i))
        paths.append(path)
    return folder, [str(p) for p in paths]


def _run(*argv):
    assert main([str(a) for a in argv]) == 0


def test_defence_flip_rate_and_server_invariance(tiny_model_dir, tiny_clients, cli_model):
    folder, paths = tiny_clients
    model = str(tiny_model_dir)
    for per_client in (True, False):
        out, rec = folder / f"rr_{per_client}.mask.safetensors", folder / f"rr_{per_client}.json"
        _run("privacy", "rr-aggregate", "--model", model, "--epsilon", "1", "--group", "layer", "--out", out,
             "--record", rec, *(["--per-client"] if per_client else []), *paths)
        r = json.loads(rec.read_text())
        q = rr_flip_probability(1.0)
        assert r["flip_probability"] == pytest.approx(q)
        assert abs(r["flip_rate_measured"] - q) < 0.02
        if per_client:
            assert abs(r["flip_rate_per_client"] - q) < 0.01
        assert r["topk_debiased_equal"] and r["global_hamming_vs_clean"] > 0
        mf = MaskFile(out, fingerprint(cli_model))
        assert mf.header.role == "global" and mf.header.n_clients == 3  # a valid global mask file
    # ε = ∞: exactly the FedPrLLM server's global mask
    _run("privacy", "rr-aggregate", "--model", model, "--epsilon", "inf", "--group", "layer",
         "--out", folder / "inf.mask.safetensors", "--record", folder / "inf.json", *paths)
    FedPrLLM(group="layer", sparsity=0.5, seed=0).aggregate(
        paths, fingerprint(cli_model), prunable_layers(cli_model), folder / "plain.mask.safetensors")
    a, b = MaskFile(folder / "inf.mask.safetensors").masks(), MaskFile(folder / "plain.mask.safetensors").masks()
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert json.loads((folder / "inf.json").read_text())["global_hamming_vs_clean"] == 0.0


def test_cli_stages_and_report_tables(tmp_path, tiny_model_dir, tiny_clients, data_dir, cli_model):
    from fedlib.data import save_tokens

    folder, paths = tiny_clients
    model = str(tiny_model_dir)
    res = tmp_path / "res"
    _run("privacy", "entropy", "--model", model, "--out", res / "entropy.json", *paths)
    _run("privacy", "similarity", "--model", model, "--seeds", "1", "2", "--seed-samples", "1", "--seqlen", "16",
         "--data-dir", data_dir, "--docs", 0, 30, "--out", res / "similarity.json", *paths)
    save_tokens(tmp_path / "d.safetensors", _ids(2, 16, 1000, seed=10))
    save_tokens(tmp_path / "r.safetensors", _ids(2, 16, 1000, seed=11))
    _run("privacy", "sensitivity", "--model", model, "--calib", tmp_path / "d.safetensors", "--replacements",
         tmp_path / "r.safetensors", "--neighbours", 2, "--out", res / "sensitivity.json")
    save_tokens(tmp_path / "pop.safetensors", _ids(10, 8, 1000, seed=12))
    _run("privacy", "membership", "--model", model, "--population", tmp_path / "pop.safetensors", "--targets", 4,
         "--pairs", 2, "--blocks", 1, "--epsilons", 2, "--out", res / "membership.json")
    save_tokens(tmp_path / "t3.safetensors", _ids(1, 3, 1000, seed=13))
    _run("privacy", "inversion", "--model", model, "--texts", tmp_path / "t3.safetensors", "--steps", 30,
         "--prior-tokens", tmp_path / "pop.safetensors", "--tiny-lengths", 1, "--tiny-steps", 150,
         "--out", res / "inversion.json")
    _run("privacy", "rr-aggregate", "--model", model, "--epsilon", 2, "--out", res / "rr2.mask.safetensors",
         "--record", res / "rr2.json", *paths)

    entropy = json.loads((res / "entropy.json").read_text())
    assert {r["mask_bits"] for r in entropy["layers"]} == {1.0}  # 50 % row masks
    assert all(0 < r["fp16_bits"] <= 16 for r in entropy["layers"])
    assert all(0 <= r["ensemble_bits"] <= 1 for r in entropy["layers"])
    assert len(json.loads((res / "similarity.json").read_text())["seeds"]["pairs"]) == 1
    inversion = json.loads((res / "inversion.json").read_text())
    assert inversion["tiny"][0]["bag_overlap"] == 1.0 and inversion["rows"][0]["tokens"] == 3
    assert 0 <= inversion["rows"][0]["unigram_bag_overlap"] <= 1

    fp = entropy["model_fingerprint"]

    def fake_eval(name, ppl):
        (res / name).write_text(json.dumps({"model_fingerprint": fp, "perplexity": {
            "wikitext2": {"ppl": ppl, "windows": 2, "total_windows": 9, "seqlen": 16}}}))
        return str(res / name)

    spec = {
        "context": {"model": model, "config": "tiny.yaml", "seed": 0, "lines": ["tiny setting"]},
        "out_dir": str(tmp_path / "reports"), "suffix": "", "size": "run",
        **{a: str(res / f"{a}.json") for a in ("entropy", "similarity", "sensitivity", "membership", "inversion")},
        "defence": {"records": {"2": str(res / "rr2.json")}, "evals": {"2": fake_eval("e2.json", 50.0)},
                    "clean_eval": fake_eval("clean.json", 30.0), "dense_eval": fake_eval("dense.json", 20.0),
                    "datasets": ["wikitext2"], "group": "layer"},
    }
    _run("privacy", "report", "--spec", json.dumps(spec))
    reports = tmp_path / "reports"
    for name in ("entropy", "similarity", "sensitivity", "membership", "inversion", "defence"):
        md = (reports / f"privacy_{name}.md").read_text()
        assert md.startswith("# Privacy audit") and f"Model: {model}" in md and f"written by {written_by()}" in md
        assert (reports / f"privacy_{name}.csv").read_text().count("\n") >= 2
        assert "<table>" in (reports / f"privacy_{name}.html").read_text()  # the HTML report's page
    assert "not derived from any mechanism" in (reports / "privacy_sensitivity.md").read_text()
    membership = (reports / "privacy_membership.md").read_text()
    assert "What the attack observes" in membership and "Per-bit likelihood ratio knowing the noise, ε = 2" in membership
    assert "[1.000, 1.000]" not in membership  # perfect separation reads as the exact bound, not a point
    inversion_md = (reports / "privacy_inversion.md").read_text()
    recovered = f"{100 * inversion['rows'][0]['bag_overlap']:.1f} %"
    assert f"Measured in this run: T = 3: {recovered} of the bag of tokens recovered" in inversion_md
    assert "~512+" not in inversion_md  # the old fixed sentence
    assert "lower bound" in (reports / "privacy_defence.md").read_text()
    defence = (reports / "privacy_defence.csv").read_text().splitlines()
    assert defence[1].startswith("Dense") and defence[2].startswith("∞") and defence[3].startswith("2,")
    for png in ("privacy_membership_roc.png", "privacy_defence.png"):
        assert (reports / png).read_bytes()[:4] == b"\x89PNG"
    assert (reports / "privacy_entropy_layers.csv").read_text().count("\n") == 1 + len(entropy["layers"])


def test_tiny_inversion_is_exact():
    rows = tiny_inversion_cases([2], seed=0, steps=200)
    assert rows[0]["bag_overlap"] == 1.0 and rows[0]["mask_agreement"] == 1.0
    assert math.isclose(rows[0]["true_tokens_agreement"], 1.0)
    assert sorted(rows[0]["decoded_tokens"]) == sorted(rows[0]["target_tokens"])
    # a result row holds what was computed, no wall time: the same seed gives the same row
    assert tiny_inversion_cases([2], seed=0, steps=200) == rows


def test_method_options_reach_the_recomputed_masks(tmp_path, tiny_model_dir, cli_model, capsys):
    from fedlib.data import save_tokens

    model = str(tiny_model_dir)
    options = json.dumps({"lam": 0.2})
    calib, base = tmp_path / "d.safetensors", tmp_path / "d.mask.safetensors"
    save_tokens(calib, _ids(2, 16, 1000, seed=20))
    _run("client-mask", "--model", model, "--calib", calib, "--method", "owl", "--method-options", options,
         "--out", base)
    shared = MaskFile(base, fingerprint(cli_model)).masks()
    default = client_masks(cli_model, _ids(2, 16, 1000, seed=20), Pruning("owl"))
    assert any(not torch.equal(shared[n], default[n]) for n in shared)  # the options change this mask
    # the one neighbour replaces row 0 by itself, so it is D: no bit differs iff the options were used
    argv = ["privacy", "sensitivity", "--model", model, "--method", "owl", "--calib", calib, "--replacements",
            calib, "--neighbours", 1, "--base-mask", base, "--out", tmp_path / "s.json"]
    _run(*argv[:4], "--method-options", options, *argv[4:])
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["neighbours"][0]["changed_bits"] == 0 and result["method_options"] == {"lam": 0.2}
    assert main([str(a) for a in argv]) != 0  # refused: the shared file was computed with options
    assert "'method_options': {'lam': 0.2}}, not" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["privacy", "membership", "--method-options", "[1]", "--model", model, "--population", str(calib),
              "--out", str(tmp_path / "m.json")])


def test_secagg_audit_sums_cohorts_and_reports(model, tmp_path):
    from fedlib.privacy.audit_report import write_reports
    from fedlib.privacy.stages.secagg import secagg_membership_audit

    pop = _ids(40, seqlen=8, seed=3)
    res = secagg_membership_audit(model, pop, targets=12, samples=2, pairs=4, blocks=1, cohorts=[16, 1], pool=16)
    single = membership_audit(model, pop, targets=12, samples=2, pairs=4, blocks=1)
    assert [c["m"] for c in res["cohorts"]] == [1, 16]
    one, sixteen = res["cohorts"]
    # m = 1: the server sees the client's own mask, the global mask of one 50 % row mask under a layer
    # top-k at 50 % is that mask, so both views score alike, and the single-mask attack leaks as much
    assert one["votes"]["auc"] == one["global"]["auc"] and one["votes"]["auc"] > 0.9
    assert single["attack"]["auc"] > 0.9
    assert sixteen["votes"]["auc"] < one["votes"]["auc"]  # 15 other clients' masks hide part of the signal
    assert res["observed_bits"] == single["observed_bits"]
    with pytest.raises(ValueError, match="cannot fill a cohort of 16"):
        secagg_membership_audit(model, pop, targets=12, samples=2, pairs=4, blocks=1, cohorts=[16], pool=8)
    path = tmp_path / "secagg.json"
    path.write_text(json.dumps(res))
    spec = {"context": {"model": "tiny", "config": "tiny.yaml", "seed": 0}, "out_dir": str(tmp_path), "secagg": str(path)}
    written = write_reports(spec)
    assert sorted(p.name for p in written) == ["privacy_secagg.csv", "privacy_secagg.html", "privacy_secagg.md"]
    md = (tmp_path / "privacy_secagg.md").read_text()
    assert md.startswith("# Privacy audit 7") and "pool of 16 clients" in md
    rows = (tmp_path / "privacy_secagg.csv").read_text().splitlines()
    assert rows[-4].startswith("1,") and rows[-1].startswith("16,")


def test_membership_scale_table_pools_the_seeds_games(model, tmp_path):
    """Per-seed rows are each game's attack; the pooled row's AUC is the Mann-Whitney AUC of all
    games' scores together, computed here by brute force; a game of another size is refused."""
    from fedlib.privacy.tables.membership_scale import membership_scale_table

    pop = _ids(10, seqlen=8, seed=5)
    files = []
    for seed in (0, 1):
        res = membership_audit(model, pop, targets=4, samples=2, pairs=2, blocks=None, pruning=Pruning(seed=seed))
        files.append(tmp_path / f"seed{seed}.json")
        files[-1].write_text(json.dumps(res))
    games = [json.loads(f.read_text()) for f in files]
    assert all(g["blocks"] is None and g["observed_layers"] == 14 for g in games)
    spec = {"context": {"model": "tiny", "seed": 0}, "out_dir": str(tmp_path),
            "sizes": [{"samples": 2, "seqlen": 8, "results": [str(f) for f in files]}]}
    paths = membership_scale_table(spec)
    rows = list(csv.reader(io.StringIO(paths[1].read_text())))
    body = [r for r in rows if r and r[0] == "2 × 8"]
    assert [r[1] for r in body][:2] == ["0", "1"] and body[2][1].startswith("pooled, 2 seeds")
    for row, game in zip(body, games):
        assert row[3].startswith(f"{game['attack']['auc']:.3f}")
    members = [s for g in games for s in g["scores_members"]]
    nonmembers = [s for g in games for s in g["scores_nonmembers"]]
    wins = sum((m > n) + 0.5 * (m == n) for m in members for n in nonmembers)
    assert body[2][3].startswith(f"{wins / (len(members) * len(nonmembers)):.3f}")
    assert body[2][2] == "8 / 8"

    spec["sizes"][0]["seqlen"] = 16
    with pytest.raises(ValueError, match="seed0.json: a game of 2 x 8 tokens"):
        membership_scale_table(spec)


def test_every_analysis_has_its_report_verb_and_writer():
    """The report verbs of `fedlib privacy` are the registry's (fedlib.privacy_analyses); every analysis
    owns its table module (fedlib.privacy.tables.<name>) with its writer; the analyses of the bundled
    report are assembled by fedlib.privacy.audit_report.write_reports, the others' verbs call their writer."""
    import argparse
    from importlib import import_module

    from fedlib import privacy_cli
    from fedlib.cli import build_parser
    from fedlib.privacy.audit_report import write_reports
    from fedlib.privacy_analyses import ANALYSES, REPORT

    privacy = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["privacy"]
    verbs = next(a for a in privacy._actions if isinstance(a, argparse._SubParsersAction)).choices
    for analysis in ANALYSES:
        assert analysis.report in verbs and privacy_cli.COMMANDS[analysis.report] is privacy_cli._cmd_report_tables
        writer = getattr(import_module(analysis.table_module), analysis.writer)
        module, function = privacy_cli.REPORTS[analysis.report][0].split(":")
        verb_writer = getattr(import_module(module), function)
        assert verb_writer is (write_reports if analysis.report == REPORT else writer)
    assert {a.report for a in ANALYSES} == set(privacy_cli.REPORTS)
