"""The server protocol: schedules of the three federations, vote hooks, and FedSpaLLM and
iterative FedPrLLM by files (configure -> client uploads -> aggregate) against the in-memory
simulation."""

import json

import pytest
import torch

from fedlib.cli import main
from fedlib.client import Pruning, prune_locally
from fedlib.data import save_tokens
from fedlib.federation import fedspallm_prune, iterative_prune, one_shot_prune
from fedlib.maskfile import MaskFile, write_mask_file
from fedlib.models import fingerprint, load_model, prunable_layers
from fedlib.server import STRATEGIES, FedPrLLM, FedSpaLLM
from fedlib.server.fedprllm import VoteHook
from fedlib.weightfile import open_weight_file

from conftest import tiny_llama


def test_schedules_of_the_three_federations():
    one_shot, iterative = FedPrLLM(mode="one-shot"), FedPrLLM(mode="iterative")
    assert one_shot.n_rounds(4) == 1 and one_shot.configure_round(0, 2, 4).blocks == ((0, 1, 2, 3),) * 2
    assert iterative.n_rounds(4) == 4
    assert [iterative.configure_round(r, 3, 4).blocks for r in range(4)] == [((r,),) * 3 for r in range(4)]
    spa = FedSpaLLM(rounds=3, resources=(0.25, 0.5), seed=1)
    plans = [spa.configure_round(t, 2, 4) for t in range(3)]
    assert [list(map(list, p.blocks)) for p in plans] == spa.assignments(2, 4)
    assert all(len(p.blocks[0]) == 1 and len(p.blocks[1]) == 2 for p in plans)
    with pytest.raises(ValueError, match="round 1 outside 0..0"):
        one_shot.configure_round(1, 2, 4)
    with pytest.raises(ValueError, match="mode"):
        FedPrLLM(mode="twice")
    assert set(STRATEGIES) == {"fedprllm", "fedspallm"}


class Inverting(VoteHook):
    """Every client reports the opposite of its mask (a Byzantine cohort, for the test)."""

    label = "+inverted"
    randomizes_clients = True

    def __init__(self):
        self.seen = []

    def client_mask(self, client_id, name, mask):
        return ~mask

    def finished(self, info, true_counts, observed, mask):
        self.seen.append((info.name, int(true_counts.sum()), int(observed.sum())))


def _client_masks(model, n=3):
    return [prune_locally(model, torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(c)),
                          Pruning("wanda", 0.5, "row", 0)).masks for c in range(n)]


def _write_clients(model, masks, tmp_path, prefix="c"):
    layers, fp = prunable_layers(model), fingerprint(model)
    paths = []
    for c, m in enumerate(masks):
        path = tmp_path / f"{prefix}{c}.mask.safetensors"
        write_mask_file(path, m, layers, fingerprint=fp, role="client", client_id=str(c), method="wanda",
                        group="row", sparsity=0.5, n_samples=2)
        paths.append(path)
    return paths


def test_a_vote_hook_changes_what_is_counted_not_the_server(model, tmp_path):
    masks = _client_masks(model)
    layers, fp = prunable_layers(model), fingerprint(model)
    hook = Inverting()
    FedPrLLM(group="layer", sparsity=0.5, seed=0, hook=hook).aggregate(
        _write_clients(model, masks, tmp_path), fp, layers, tmp_path / "hooked.mask.safetensors")
    # the same server without a hook, on files holding the inverted masks
    inverted = [{k: ~v for k, v in m.items()} for m in masks]
    FedPrLLM(group="layer", sparsity=0.5, seed=0).aggregate(
        _write_clients(model, inverted, tmp_path, "inv"), fp, layers, tmp_path / "plain.mask.safetensors")
    hooked, plain = MaskFile(tmp_path / "hooked.mask.safetensors"), MaskFile(tmp_path / "plain.mask.safetensors")
    assert hooked.header.method == "fedprllm[wanda]+inverted"
    for info in layers:
        assert torch.equal(hooked.layer_mask(info.name), plain.layer_mask(info.name))
        assert torch.equal(hooked.layer_votes(info.name).long(), plain.layer_votes(info.name).long())
    # the hook saw the true counts and the reported ones: they sum to n_clients * numel
    numel = {info.name: info.shape[0] * info.shape[1] for info in layers}
    assert [name for name, _, _ in hook.seen] == [info.name for info in layers]
    assert all(t + o == 3 * numel[name] for name, t, o in hook.seen)


def test_simulation_drivers_take_the_same_hook(model, tmp_path):
    ids = [torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(c)) for c in range(3)]
    layers, fp = prunable_layers(model), fingerprint(model)
    result = one_shot_prune(model, ids, Pruning("wanda", 0.5, "row", 0), "layer", hook=Inverting())
    inverted = [{k: ~v for k, v in m.items()} for m in _client_masks(model)]
    FedPrLLM(group="layer", sparsity=0.5, seed=0).aggregate(
        _write_clients(model, inverted, tmp_path), fp, layers, tmp_path / "g.mask.safetensors")
    files = MaskFile(tmp_path / "g.mask.safetensors")
    assert all(torch.equal(result.masks[i.name], files.layer_mask(i.name)) for i in layers)
    # iterative: round l's hook sees only block l's layers, in order
    hook = Inverting()
    iterative_prune(model, ids, Pruning("wanda", 0.5, "row", 0), "layer", hook=hook)
    assert [name for name, _, _ in hook.seen] == [info.name for info in layers]


def test_fedspallm_by_files_is_the_simulation(tiny_model_dir, tmp_path):
    """Two rounds with layer sampling, run as a real protocol: the server configures each round,
    every client prunes its blocks from the last global file, the server aggregates with the
    previous global; the result is the in-memory simulation's, bit for bit."""
    model_dir = str(tiny_model_dir)
    model = load_model(model_dir)[0]
    vocab, n_blocks = model.config.vocab_size, model.config.num_hidden_layers
    resources = ["0.5", "0.5", "0.5"]
    calib = []
    for c in range(3):
        path = tmp_path / f"calib_{c}.safetensors"
        save_tokens(path, torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(c)))
        calib.append(path)
    common = ["--model", model_dir, "--strategy", "fedspallm", "--sparsity", "0.6", "--seed", "2",
              "--rounds", "2", "--resources", *resources]
    previous = None
    for t in range(2):
        plan_path = tmp_path / f"plan_{t}.json"
        assert main(["configure", *common, "--clients", "3", "--round", str(t), "--out", str(plan_path)]) == 0
        plan = json.loads(plan_path.read_text())
        assert plan["n_rounds"] == 2 and plan["send"] == "weights+mask"
        uploads = []
        for c, blocks in enumerate(plan["blocks"]):
            out = tmp_path / f"up_{t}_{c}.weights.safetensors"
            args = ["client-weights", "--model", model_dir, "--calib", str(calib[c]), "--blocks", *map(str, blocks),
                    "--round", str(t), "--sparsity", "0.6", "--seed", "2", "--client-id", str(c), "--out", str(out)]
            assert main(args + (["--global-weights", str(previous)] if previous else [])) == 0
            uploads.append(str(out))
        glob = tmp_path / f"global_{t}.weights.safetensors"
        assert main(["aggregate", *common, "--round", str(t), "--out", str(glob), *uploads]
                    + (["--previous", str(previous)] if previous else [])) == 0
        previous = glob
    sim = fedspallm_prune(model, [_tokens(p) for p in calib],
                          FedSpaLLM(sparsity=0.6, seed=2, rounds=2, resources=(0.5, 0.5, 0.5), weight_dtype="float16"))
    final = open_weight_file(previous, fingerprint(model), prunable_layers(model))
    assert sorted(final.layer_names) == sorted(sim.weights) and n_blocks == 2
    for name in sim.weights:
        mask = final.layer_mask(name)
        assert torch.equal(mask, sim.masks[name])
        assert torch.equal(final.layer_weight(name, mask), sim.weights[name])
        assert torch.equal(final.layer_votes(name).long(), sim.votes[name].long())


def _tokens(path):
    from fedlib.data import load_tokens

    return load_tokens(path)[0]


def test_aggregate_refuses_options_of_another_strategy(tiny_model_dir, tmp_path, capsys):
    upload = tmp_path / "x"
    upload.write_bytes(b"")  # never opened: the options are refused first
    code = main(["aggregate", "--model", str(tiny_model_dir), "--rounds", "2", "--out", str(tmp_path / "g"), str(upload)])
    assert code == 2 and "--rounds is not an option of the fedprllm strategy" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["aggregate", "--model", str(tiny_model_dir), "--strategy", "fedavg", "--out", str(tmp_path / "g"), str(upload)])
    assert exited.value.code == 2 and "invalid choice: 'fedavg' (choose from 'fedprllm', 'fedspallm')" in capsys.readouterr().err


def test_a_registered_strategy_is_offered_with_its_options(monkeypatch, tmp_path):
    """A new strategy is its class, one line in fedlib.server.STRATEGIES and its options in
    fedlib.strategy_options.STRATEGY_OPTIONS: --strategy offers it, with the options its class declares
    (and no other strategy takes them)."""
    from dataclasses import dataclass

    from fedlib.cli import build_parser, strategy_from_args
    from fedlib.strategy_options import STRATEGY_OPTIONS
    from fedlib.server.strategy import Option, Strategy

    monkeypatch.setitem(STRATEGY_OPTIONS, "quantile", (Option("quantile", "the vote quantile", type=float),))

    @dataclass
    class Quantile(Strategy):
        group: str = "layer"
        sparsity: float = 0.5
        seed: int = 0
        quantile: float = 0.5
        name = "quantile"
        options = STRATEGY_OPTIONS["quantile"]

    monkeypatch.setitem(STRATEGIES, "quantile", Quantile)
    upload = tmp_path / "x"
    upload.write_bytes(b"")  # an upload is a file: checked while the arguments are read
    common = ["aggregate", "--model", "m", "--out", "g", "--quantile", "0.7", str(upload)]
    strategy = strategy_from_args(build_parser().parse_args([*common, "--strategy", "quantile", "--group", "row"]))
    assert strategy == Quantile(group="row", quantile=0.7)
    with pytest.raises(ValueError, match="--quantile is not an option of the fedprllm strategy"):
        strategy_from_args(build_parser().parse_args(common))


@pytest.mark.parametrize("method, scale", [("wanda", True), ("owl", False)])
def test_iterative_fedprllm_by_files_is_the_simulation(tmp_path, method, scale):
    """Iterative FedPrLLM as a real protocol on a 3-block model: in round l each client masks
    block l from the global file of rounds < l, the server aggregates block l onto that file.
    The last global file is byte for byte the one `fedlib iterative` simulates."""
    model = tiny_llama(layers=3)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    calib = []
    for c in range(3):
        path = tmp_path / f"calib_{c}.safetensors"
        save_tokens(path, torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(c)))
        calib.append(str(path))
    local = ["--method", method, "--sparsity", "0.5", "--group", "row", "--seed", "1", "--batch-size", "1"]
    server = ["--model", str(model_dir), "--mode", "iterative", "--group", "layer", "--sparsity", "0.5", "--seed", "1"]
    previous = None
    for block in range(3):
        plan = tmp_path / f"plan_{block}.json"
        assert main(["configure", *server, "--clients", "3", "--round", str(block), "--out", str(plan)]) == 0
        assert json.loads(plan.read_text())["blocks"] == [[block]] * 3
        uploads = []
        for c in range(3):
            out = tmp_path / f"mask_{block}_{c}.safetensors"
            args = ["client-mask", "--model", str(model_dir), "--calib", calib[c], *local, "--client-id", str(c),
                    "--round", str(block), "--out", str(out)]
            args += (["--global-masks", str(previous)] if previous else []) + (["--scale"] if scale else [])
            assert main(args) == 0
            uploads.append(str(out))
        glob = tmp_path / f"global_{block}.safetensors"
        assert main(["aggregate", *server, "--round", str(block), "--out", str(glob), *uploads]
                    + (["--previous", str(previous)] if previous else [])) == 0
        previous = glob
    simulated = tmp_path / "simulated.safetensors"
    assert main(["iterative", "--model", str(model_dir), "--calib", *calib, "--method", method, "--sparsity", "0.5",
                 "--local-group", "row", "--server-group", "layer", "--seed", "1", "--batch-size", "1",
                 "--out", str(simulated), "--record", str(tmp_path / "record.json")] + (["--scale"] if scale else [])) == 0
    assert previous.read_bytes() == simulated.read_bytes()
    # not one-shot under another name: block 1 onwards saw the global masks, not each client's own
    one_shot = [tmp_path / f"one_shot_{c}.safetensors" for c in range(3)]
    for c, out in enumerate(one_shot):
        assert main(["client-mask", "--model", str(model_dir), "--calib", calib[c], *local, "--client-id", str(c),
                     "--out", str(out)]) == 0
    assert main(["aggregate", "--model", str(model_dir), "--group", "layer", "--sparsity", "0.5", "--seed", "1",
                 "--out", str(tmp_path / "one_shot.safetensors"), *map(str, one_shot)]) == 0
    iterative, plain = MaskFile(previous).masks(), MaskFile(tmp_path / "one_shot.safetensors").masks()
    assert all(torch.equal(iterative[n], plain[n]) for n in iterative if ".layers.0." in n)
    assert any(not torch.equal(iterative[n], plain[n]) for n in iterative if ".layers.2." in n)


def test_iterative_rounds_refuse_the_wrong_files(tmp_path, capsys):
    model = tiny_llama(layers=2)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)))
    client = ["client-mask", "--model", str(model_dir), "--calib", str(calib), "--sparsity", "0.5"]
    assert main([*client, "--round", "0", "--out", str(tmp_path / "r0.safetensors")]) == 0
    assert main([*client, "--out", str(tmp_path / "all.safetensors")]) == 0
    server = ["aggregate", "--model", str(model_dir), "--mode", "iterative"]
    # round 1 without the global file of round 0, or with a client's file in its place
    assert main([*client, "--round", "1", "--out", str(tmp_path / "r1.safetensors")]) == 2
    assert "give --previous-global" in capsys.readouterr().err
    assert main([*client, "--round", "1", "--global-masks", str(tmp_path / "r0.safetensors"),
                 "--out", str(tmp_path / "r1.safetensors")]) == 2
    assert "field 'role': expected 'global'" in capsys.readouterr().err
    # the server: round 0's files hold block 0 only; a whole-model file is not a round-0 upload
    assert main([*server, "--round", "0", "--out", str(tmp_path / "g0.safetensors"), str(tmp_path / "all.safetensors")]) == 2
    assert "field 'layers'" in capsys.readouterr().err
    assert main([*server, "--out", str(tmp_path / "g0.safetensors"), str(tmp_path / "r0.safetensors")]) == 2
    assert "give the round" in capsys.readouterr().err
    assert main([*server, "--round", "0", "--out", str(tmp_path / "g0.safetensors"), str(tmp_path / "r0.safetensors")]) == 0
    # round 1 needs round 0's global file, made by the same server settings
    assert main([*client, "--round", "1", "--global-masks", str(tmp_path / "g0.safetensors"),
                 "--out", str(tmp_path / "r1.safetensors")]) == 0
    assert main([*server, "--round", "1", "--out", str(tmp_path / "g1.safetensors"), str(tmp_path / "r1.safetensors")]) == 2
    assert "give it as the previous file" in capsys.readouterr().err
    assert main([*server, "--round", "1", "--group", "row", "--previous", str(tmp_path / "g0.safetensors"),
                 "--out", str(tmp_path / "g1.safetensors"), str(tmp_path / "r1.safetensors")]) == 2
    assert "field 'group': expected 'row'" in capsys.readouterr().err
    assert not (tmp_path / "g1.safetensors").exists()
    assert main([*server, "--round", "1", "--previous", str(tmp_path / "g0.safetensors"),
                 "--out", str(tmp_path / "g1.safetensors"), str(tmp_path / "r1.safetensors")]) == 0
    assert MaskFile(tmp_path / "g1.safetensors").header.method == "fedprllm-iterative[wanda]"
