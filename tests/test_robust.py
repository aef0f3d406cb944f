"""Byzantine-robust FedPrLLM and the outlier report (fedlib.server.robust), checked against
brute-force counting and against the plain server on the honest files only."""

import json
import random
import statistics

import pytest
import torch

from fedlib.baselines import random_masks
from fedlib.cli import main
from fedlib.client import Pruning, prune_locally
from fedlib.maskfile import MaskFile, MaskWriter, read_header, write_mask_file
from fedlib.models import fingerprint, load_model, prunable_layers
from fedlib.server import FedPrLLM
from fedlib.server.fedprllm import global_mask_from_votes
from fedlib.server.robust import MIN_SPREAD, MedianMAD

N_HONEST = 8


def _honest_masks(model, n=N_HONEST, vocab=128):
    """Wanda 50 % row masks of clients with independent random data (2 x 16 tokens each).

    With 8 clients the MAD is a noisy estimate of the honest spread, and an honest client can
    pass z = 3.5: on this tiny model with 4 x 32 tokens per client it happens for 2 of 6 seeds
    (z = 5.0 and 7.8), never with 2 x 16 (largest z 2.4 over 6 seeds). Dropping such a client
    costs its 1/n of the votes; the measurement on the embedded model flags no honest client."""
    return [prune_locally(model, torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(c)),
                          Pruning("wanda", 0.5, "row", 0)).masks for c in range(n)]


def _write(model, masks, folder, ids):
    layers, fp = prunable_layers(model), fingerprint(model)
    paths = []
    for cid, m in zip(ids, masks):
        path = folder / f"client_{cid}.mask.safetensors"
        write_mask_file(path, m, layers, fingerprint=fp, role="client", client_id=cid, method="wanda",
                        group="row", sparsity=0.5, n_samples=2)
        paths.append(path)
    return paths


def _inverted(masks):
    """The complement of a 50 % row mask is a 50 % row mask: it passes every file check."""
    return {name: ~m for name, m in masks.items()}


def _aggregate(model, paths, out, **options):
    return FedPrLLM(group="layer", sparsity=0.5, seed=0, **options).aggregate(
        paths, fingerprint(model), prunable_layers(model), out)


def _brute_force_distances(model, masks):
    """Per client: weights where it disagrees with the strict majority of the others (half a
    weight where they split evenly), over all weights; plain Python counting."""
    n, out = len(masks), []
    total = sum(info.shape[0] * info.shape[1] for info in prunable_layers(model))
    for i, mine in enumerate(masks):
        disagree = 0.0
        for info in prunable_layers(model):
            bits = [m[info.name].reshape(-1).tolist() for m in masks]
            for j, b in enumerate(bits[i]):
                others = sum(bits[k][j] for k in range(n) if k != i)
                disagree += 0.5 if 2 * others == n - 1 else float((2 * others > n - 1) != b)
        out.append(disagree / total)
    return out


@pytest.fixture
def federation(model, tmp_path):
    """8 honest clients' masks, ids and files, and the honest masks of 2 more clients, which turn
    Byzantine and send something else instead (so their own honest mask is not in the round)."""
    masks = _honest_masks(model, N_HONEST + 2)
    honest, turned = masks[:N_HONEST], masks[N_HONEST:]
    ids = [f"h{c}" for c in range(N_HONEST)]
    return honest, turned, ids, _write(model, honest, tmp_path, ids)


@pytest.mark.parametrize("attack", ["inverted", "random"])
def test_flags_exactly_the_byzantine_clients(model, tmp_path, federation, attack):
    _, turned, ids, paths = federation
    if attack == "inverted":
        bad = [_inverted(m) for m in turned]
    else:
        bad = [random_masks(prunable_layers(model), 0.5, seed, "row") for seed in (1, 2)]
    paths += _write(model, bad, tmp_path, ["b0", "b1"])
    summary = _aggregate(model, paths, tmp_path / "g.mask.safetensors", robust="mad")
    report = summary["clients"]
    assert [c["client_id"] for c in report["clients"] if c["flagged"]] == ["b0", "b1"]
    assert [c["client_id"] for c in report["clients"] if c["used"]] == ids
    assert summary["n_used"] == report["n_used"] == N_HONEST


def test_flags_no_honest_client(model, tmp_path, federation):
    _, _, _, paths = federation
    report = _aggregate(model, paths, tmp_path / "g.mask.safetensors", robust="mad")["clients"]
    assert not any(c["flagged"] for c in report["clients"]) and report["n_used"] == N_HONEST


def test_robust_global_is_the_plain_aggregation_of_the_kept_files(model, tmp_path, federation):
    _, turned, _, paths = federation
    bad = _write(model, [_inverted(m) for m in turned], tmp_path, ["b0", "b1"])
    robust, plain = tmp_path / "robust.mask.safetensors", tmp_path / "plain.mask.safetensors"
    _aggregate(model, paths + bad, robust, robust="mad")
    _aggregate(model, paths, plain)  # the honest files only, no screening
    r, p = MaskFile(robust), MaskFile(plain)
    assert (r.header.n_clients, r.header.n_samples) == (N_HONEST, 2 * N_HONEST) == (p.header.n_clients,
                                                                                       p.header.n_samples)
    assert r.header.extra == {"robust": "mad:k=3.5", "excluded_clients": '["b0", "b1"]'}
    for info in prunable_layers(model):
        assert torch.equal(r.layer_mask(info.name), p.layer_mask(info.name))
        assert torch.equal(r.layer_votes(info.name), p.layer_votes(info.name))
    # the plain server on all ten files counts the inverted votes, and its mask differs
    everyone = tmp_path / "everyone.mask.safetensors"
    _aggregate(model, paths + bad, everyone)
    assert not all(torch.equal(MaskFile(everyone).layer_mask(i.name), p.layer_mask(i.name))
                   for i in prunable_layers(model))


def test_file_order_changes_nothing(model, tmp_path, federation):
    _, turned, _, paths = federation
    paths += _write(model, [_inverted(turned[0]), random_masks(prunable_layers(model), 0.5, 4, "row")],
                    tmp_path, ["b0", "b1"])
    shuffled = list(paths)
    random.Random(0).shuffle(shuffled)
    assert shuffled != paths
    reports = []
    for tag, order in (("a", paths), ("b", shuffled)):
        out = tmp_path / f"{tag}.mask.safetensors"
        reports.append(_aggregate(model, order, out, robust="mad")["clients"])
    assert (tmp_path / "a.mask.safetensors").read_bytes() == (tmp_path / "b.mask.safetensors").read_bytes()
    by_id = [{c["client_id"]: c for c in r["clients"]} for r in reports]
    assert by_id[0] == by_id[1]


def test_report_distances_and_z_scores_against_brute_force(tiny_model_dir, tmp_path):
    """`fedlib aggregate` writes the report beside the global file: per client the distance to
    the leave-one-out majority (counted here weight by weight), the robust z-score, flagged and
    used; the plain server uses every client's votes and flags for information only."""
    model, _ = load_model(str(tiny_model_dir))
    vocab = model.config.vocab_size
    honest = _honest_masks(model, n=7, vocab=vocab)  # 7 clients: a client's 6 others can split evenly
    masks = honest[:6] + [_inverted(honest[6])]
    ids = [f"c{i}" for i in range(len(masks))]
    paths = _write(model, masks, tmp_path, ids)
    out = tmp_path / "global.mask.safetensors"
    assert main(["aggregate", "--model", str(tiny_model_dir), "--out", str(out), *map(str, paths)]) == 0
    report = json.loads((tmp_path / "global.mask.clients.json").read_text())
    expected = _brute_force_distances(model, masks)
    median = statistics.median(expected)
    scale = 1.4826 * statistics.median(abs(d - median) for d in expected)
    assert report["global"] == str(out) and report["strategy"] == "fedprllm" and report["robust"] is False
    assert report["n_clients"] == report["n_used"] == 7
    for row, cid, path, d in zip(report["clients"], ids, paths, expected):
        assert (row["client_id"], row["path"], row["used"]) == (cid, str(path), True)
        assert row["distance"] == pytest.approx(d, abs=1e-12)
        assert row["z"] == pytest.approx((d - median) / scale, rel=1e-9)
        assert row["flagged"] == (cid == "c6")
    assert "robust" not in read_header(out).extra
    # with --robust (and --report elsewhere) the inverted client's votes are dropped
    robust = tmp_path / "robust.mask.safetensors"
    assert main(["aggregate", "--model", str(tiny_model_dir), "--robust", "mad", "--report",
                 str(tmp_path / "r.json"), "--out", str(robust), *map(str, paths)]) == 0
    again = json.loads((tmp_path / "r.json").read_text())
    assert [c["used"] for c in again["clients"]] == [True] * 6 + [False] and again["robust"] is True
    assert read_header(robust).n_clients == 6


def test_without_robust_the_global_file_is_what_it_was(model, tmp_path, federation):
    """The global file of the server before screening existed, rebuilt here by hand: the same
    header, the top-k of the summed votes; the plain server's file has the same bytes."""
    honest, turned, _, paths = federation
    paths += _write(model, [_inverted(turned[0])], tmp_path, ["b0"])
    out = tmp_path / "plain.mask.safetensors"
    _aggregate(model, paths, out)
    layers = prunable_layers(model)
    expected = tmp_path / "expected.mask.safetensors"
    masks = honest + [_inverted(turned[0])]
    with MaskWriter(expected, layers, fingerprint=fingerprint(model), role="global", client_id="server",
                    method="fedprllm[wanda]", group="layer", sparsity=0.5, allocation="uniform",
                    n_samples=2 * len(masks), seed=0, n_clients=len(masks), votes=True) as writer:
        for info in layers:
            votes = sum(m[info.name].to(torch.int16) for m in masks)
            writer.add(info.name, global_mask_from_votes(votes, 0.5, "layer", 0, info.name), votes)
    assert out.read_bytes() == expected.read_bytes()


def test_a_failed_aggregation_writes_no_report(tiny_model_dir, tmp_path, capsys):
    model, _ = load_model(str(tiny_model_dir))
    path = _write(model, _honest_masks(model, n=1, vocab=model.config.vocab_size), tmp_path, ["a"])[0]
    paths = [path, path]  # the same client twice
    out = tmp_path / "g.mask.safetensors"
    assert main(["aggregate", "--model", str(tiny_model_dir), "--robust", "mad", "--out", str(out),
                 *map(str, paths)]) == 2
    assert "client_id" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "g.mask.clients.json").exists()


def test_robust_options_are_checked(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(ValueError, match="expected one of \\['mad'\\]"):
        FedPrLLM(robust="trimmed")
    with pytest.raises(ValueError, match="one-shot only"):
        FedPrLLM(robust="mad", mode="iterative")
    with pytest.raises(ValueError, match="k must be > 0"):
        MedianMAD(k=0)
    (tmp_path / "x.safetensors").write_bytes(b"")  # input files are checked while the arguments are read
    code = main(["aggregate", "--model", str(tiny_model_dir), "--strategy", "fedspallm", "--robust", "mad",
                 "--out", str(tmp_path / "g.safetensors"), str(tmp_path / "x.safetensors")])
    assert code == 2 and "--robust is not an option of the fedspallm strategy" in capsys.readouterr().err


def test_median_mad_rule():
    rule = MedianMAD()
    # at most half the clients can be flagged, whatever the distances
    spread = rule.screen({str(i): d for i, d in enumerate([0.01, 0.02, 0.9, 0.95, 0.97])})
    assert [c for c, f in spread.flagged.items() if f] == []  # a majority of attackers owns the median
    honest = rule.screen({"a": 0.030, "b": 0.032, "c": 0.034, "d": 0.036, "e": 0.5})
    assert honest.flagged == {"a": False, "b": False, "c": False, "d": False, "e": True}
    assert honest.median == 0.034 and honest.mad == pytest.approx(0.002)
    assert honest.threshold == pytest.approx(0.034 + 3.5 * 1.4826 * 0.002)
    # identical distances (MAD = 0): differences within k * MIN_SPREAD are not evidence
    tied = rule.screen({"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1 + 3 * MIN_SPREAD, "e": 0.1 + 4 * MIN_SPREAD})
    assert tied.scale == MIN_SPREAD and [c for c, f in tied.flagged.items() if f] == ["e"]
    # a client with no other client to compare with is not scored
    alone = rule.screen({"a": None})
    assert alone.z == {"a": None} and alone.flagged == {"a": False}


def test_robust_fields_are_checked_by_the_reader(tmp_path):
    """A global file's robust fields are read strictly: rule and k, an ascending list of client
    ids, and both or neither."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from fedlib.maskfile import MaskFile, MaskFileError

    from fedlib.models import LayerInfo

    shape = (4, 8)
    votes = torch.arange(32, dtype=torch.int16).reshape(shape) % 4
    good = tmp_path / "good.mask.safetensors"
    with MaskWriter(good, [LayerInfo("l", shape, 0)], fingerprint="f", role="global", client_id="server",
                    method="fedprllm[wanda]", group="row", sparsity=0.5, allocation="uniform", n_samples=3,
                    seed=0, n_clients=3, votes=True,
                    extra={"robust": "mad:k=3.5", "excluded_clients": '["b0", "b1"]'}) as writer:
        writer.add("l", global_mask_from_votes(votes, 0.5, "row", 0, "l"), votes)
    MaskFile(good)  # the writer's own file reads
    with safe_open(good, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = dict(f.metadata())
    for key, value, field in [("x_robust", "median:k=3.5", "x_robust"), ("x_robust", "mad:k=-1.0", "x_robust"),
                              ("x_robust", "mad:k=3.50", "x_robust"),
                              ("x_excluded_clients", '["b1", "b0"]', "x_excluded_clients"),
                              ("x_excluded_clients", '["b0","b1"]', "x_excluded_clients"),
                              ("x_excluded_clients", None, "x_excluded_clients")]:
        bad = dict(meta)
        if value is None:
            del bad[key]
        else:
            bad[key] = value
        path = tmp_path / "bad.mask.safetensors"
        save_file(tensors, path, metadata=bad)
        with pytest.raises(MaskFileError, match=field):
            MaskFile(path)
