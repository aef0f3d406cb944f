"""The protocol through the CLI on a tiny model folder: client-mask -> aggregate -> evaluate/export."""

import json
import math

import torch
from transformers import AutoModelForCausalLM

from fedlib.cli import main
from fedlib.data import save_tokens
from fedlib.evaluate.perplexity import perplexity
from fedlib.maskfile import MaskFile
from fedlib.models import load_model


def test_protocol_round_trip(tiny_model_dir, tmp_path, capsys):
    model_dir = str(tiny_model_dir)
    vocab = load_model(model_dir)[0].config.vocab_size
    masks = []
    for client in range(3):
        calib = tmp_path / f"client_{client}.safetensors"
        save_tokens(calib, torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(client)))
        out = tmp_path / f"client_{client}.mask.safetensors"
        assert main(["client-mask", "--model", model_dir, "--calib", str(calib), "--client-id", str(client),
                     "--out", str(out)]) == 0
        masks.append(str(out))
    glob = tmp_path / "global.mask.safetensors"
    assert main(["aggregate", "--model", model_dir, "--group", "layer", "--out", str(glob), *masks]) == 0
    assert main(["inspect", str(glob)]) == 0
    windows = tmp_path / "win.safetensors"
    eval_ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(9))
    save_tokens(windows, eval_ids, dataset="wikitext2", total_windows=2)
    result = tmp_path / "eval.json"
    assert main(["evaluate", "--model", model_dir, "--mask", str(glob), "--windows", str(windows),
                 "--label", "x", "--out", str(result)]) == 0
    report = json.loads(result.read_text())
    assert report["measured_sparsity"] >= 0.5
    exported = tmp_path / "exported"
    assert main(["export", "--model", model_dir, "--mask", str(glob), "--out", str(exported)]) == 0
    # the exported checkpoint is a plain HF model with the global mask's zeros ...
    plain = AutoModelForCausalLM.from_pretrained(exported).eval()
    final = MaskFile(glob).masks()
    for name, mask in final.items():
        weight = dict(plain.named_modules())[name].weight
        assert (weight[mask] == 0).all() and (weight[~mask] != 0).all()
    # ... and its perplexity is exactly what evaluate reported for the in-memory pruned model
    assert math.isclose(perplexity(plain, eval_ids)["ppl"], report["perplexity"]["wikitext2"]["ppl"], rel_tol=1e-6)


def test_cli_errors_are_clear(tiny_model_dir, tmp_path, capsys):
    bogus = tmp_path / "client.mask.safetensors"
    bogus.write_bytes(b"\x00" * 64)
    code = main(["aggregate", "--model", str(tiny_model_dir), "--out", str(tmp_path / "g.safetensors"), str(bogus)])
    err = capsys.readouterr().err
    assert code == 2 and str(bogus) in err and "'file'" in err
    assert not (tmp_path / "g.safetensors").exists()


def test_simulation_verbs(tiny_model_dir, tmp_path):
    """iterative, fedspallm and random-mask produce files that evaluate accepts."""
    model_dir = str(tiny_model_dir)
    vocab = load_model(model_dir)[0].config.vocab_size
    calib = []
    for client in range(2):
        path = tmp_path / f"client_{client}.safetensors"
        save_tokens(path, torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(client)))
        calib.append(str(path))
    windows = tmp_path / "win.safetensors"
    save_tokens(windows, torch.randint(0, vocab, (1, 16)), dataset="ptb", total_windows=1)
    iterative = tmp_path / "iterative.mask.safetensors"
    assert main(["iterative", "--model", model_dir, "--calib", *calib, "--server-group", "layer",
                 "--out", str(iterative), "--record", str(tmp_path / "rounds.json")]) == 0
    record = json.loads((tmp_path / "rounds.json").read_text())
    assert record["rounds"] == 2 and record["bytes_up"] == record["bytes_down"] > 0  # broadcast to each client
    weights = tmp_path / "global.weights.safetensors"
    standalone = tmp_path / "standalone_0.weights.safetensors"
    assert main(["fedspallm", "--model", model_dir, "--calib", *calib, "--sparsity", "0.5",
                 "--standalone-out", str(standalone), "--out", str(weights),
                 "--record", str(tmp_path / "fs.json")]) == 0
    random_mask = tmp_path / "random.mask.safetensors"
    assert main(["random-mask", "--model", model_dir, "--sparsity", "0.5", "--out", str(random_mask)]) == 0
    for flag, path in [("--mask", iterative), ("--weights", weights), ("--weights", standalone), ("--mask", random_mask)]:
        out = tmp_path / f"{path.stem}.json"
        assert main(["evaluate", "--model", model_dir, flag, str(path), "--windows", str(windows),
                     "--label", path.stem, "--out", str(out)]) == 0
        assert json.loads(out.read_text())["measured_sparsity"] >= 0.49
