"""The protocol through the CLI on a tiny model folder: client-mask -> aggregate -> evaluate/export."""

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from fedlib.cli import build_parser, main
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


# --------------------------------------------------------------------------- the command line itself


def _options(parser, path=()):
    """(verb path, action) of every option and positional of every verb and sub-verb."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield " ".join(path), action


def test_every_option_says_what_it_is_and_its_default():
    parser = build_parser()
    for verb, action in _options(parser):
        assert action.help, f"fedlib {verb} {action.option_strings or action.dest}: no help"


def _verb_help(*verb) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        build_parser().parse_args([*verb, "--help"])
    return " ".join(out.getvalue().split())


def test_help_shows_defaults_and_hides_old_spellings():
    text = _verb_help("client-mask")
    assert "--local-group GROUP the clients' comparison group: layer, row, column or N:M (default: row)" in text
    assert "(default: wanda)" in text and "--group " not in text and "--global-masks" not in text
    assert "--schedule {one-shot,iterative}" in _verb_help("aggregate") and "--mode " not in _verb_help("aggregate")
    top = _verb_help()
    sections = [top.index(s) for s in ("site protocol (", "coordinator (", "workflow internals (")]
    assert sections == sorted(sections)
    assert sections[0] < top.index("client-mask compute") < sections[1] < top.index("aggregate server:") < sections[2]


def test_choices_come_from_the_registries(capsys):
    from fedlib.methods import METHODS

    with pytest.raises(SystemExit):
        build_parser().parse_args(["client-mask", "--model", "m", "--method", "fisher", "--out", "o"])
    err = capsys.readouterr().err
    assert "argument --method: invalid choice: 'fisher'" in err and all(name in err for name in METHODS)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["aggregate", "--model", "m", "--server-group", "diagonal", "--out", "o", "x"])
    assert "argument --server-group/--group: expected one of layer, row, column or N:M" in capsys.readouterr().err
    assert build_parser().parse_args(["random-mask", "--model", "m", "--server-group", "2of4", "--out", "o"]).server_group == "2:4"


@pytest.mark.parametrize("argv, dest, value, line", [
    # an option's old name, one of each kind of rename
    (["client-mask", "--model", "m", "--group", "layer", "--out", "o"], "local_group", "layer", "--group"),
    (["aggregate", "--model", "m", "--group", "row", "--out", "o", "F"], "server_group", "row", "--group"),
    (["client-mask", "--model", "m", "--global-masks", "F", "--out", "o"], "previous_global", "F", "--global-masks"),
    (["aggregate", "--model", "m", "--previous", "F", "--out", "o", "F"], "previous_global", "F", "--previous"),
    (["client-weights", "--model", "m", "--calib", "F", "--blocks", "0", "--global-weights", "F", "--out", "o"],
     "previous_global", "F", "--global-weights"),
    (["configure", "--model", "m", "--clients", "3"], "n_clients", 3, "--clients"),
    (["cost", "transfer", "--clients", "F", "--context", "{}", "--out-md", "a", "--out-csv", "b"],
     "client_masks", ["F"], "--clients"),
    (["calibration-pool", "--model", "m", "--nsamples", "1", "--seqlen", "8", "--docs", "0", "5", "--out", "o"],
     "c4_docs", [0, 5], "--docs"),
    (["aggregate", "--model", "m", "--mode", "iterative", "--out", "o", "F"], "mode", "iterative", "--mode"),
    # a value's old spelling
    (["aggregate", "--model", "m", "--schedule", "oneshot", "--out", "o", "F"], "mode", "one-shot", "'oneshot'"),
    (["configure", "--model", "m", "--n-clients", "2", "--schedule", "fedprllm-iterative"], "mode", "iterative",
     "'fedprllm-iterative'"),
])
def test_old_spellings_work_for_one_more_release(argv, dest, value, line, tmp_path, capsys):
    upload = tmp_path / "upload.safetensors"
    upload.write_bytes(b"")
    args = build_parser().parse_args([str(upload) if a == "F" else a for a in argv])
    got = getattr(args, dest)
    assert got == (value.replace("F", str(upload)) if isinstance(value, str) else
                   [str(upload) if v == "F" else v for v in value] if isinstance(value, list) else value)
    assert f"fedlib: warning: {line} is deprecated and goes in the next release; use " in capsys.readouterr().err


def test_missing_inputs_fail_before_any_model_loads(tmp_path, capsys):
    """The model named does not exist: reaching it would fail differently (and later)."""
    absent = str(tmp_path / "no-model")
    assert main(["client-mask", "--model", absent, "--out", str(tmp_path / "m.safetensors")]) == 2
    assert capsys.readouterr().err.strip() == ("fedlib client-mask: error: --calib: method wanda computes the mask on "
                                              "this client's calibration samples; give their token file(s)")
    with pytest.raises(SystemExit) as exited:
        main(["client-mask", "--model", absent, "--calib", str(tmp_path / "c.safetensors"), "--out", "o"])
    assert exited.value.code == 2
    assert f"argument --calib: no such file: {tmp_path / 'c.safetensors'}" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["client-mask", "client-weights"])
def test_a_client_id_the_readers_would_refuse_fails_before_any_model_loads(verb, tmp_path, capsys):
    """An id with a space or a path would be computed for minutes and then refused by every reader."""
    with pytest.raises(SystemExit) as exited:
        main([verb, "--model", str(tmp_path / "no-model"), "--client-id", "wanda 2x2048", "--out", "o"])
    assert exited.value.code == 2
    assert "argument --client-id: expected a client id: 1 to 128 of A-Z a-z 0-9 . _ -" in capsys.readouterr().err


def test_every_error_is_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch, capsys):
    from fedlib import cli

    def broken(args):
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(cli, "cmd_inspect", broken)
    mask = tmp_path / "m.safetensors"
    mask.write_bytes(b"")
    assert main(["inspect", str(mask)]) == 1
    assert capsys.readouterr().err == "fedlib inspect: error: RuntimeError: the disk went away\n"
    for argv in (["--debug", "inspect", str(mask)], ["inspect", "--debug", str(mask)]):
        with pytest.raises(RuntimeError, match="the disk went away"):
            main(argv)


HELP_SCRIPT = """
import contextlib, io, sys, time
start = time.perf_counter()
from fedlib.cli import build_parser
parser = build_parser()
verbs = [[]] + [[name] for name in parser._subparsers._group_actions[0].choices]
verbs += [["privacy", name] for name in parser._subparsers._group_actions[0].choices["privacy"]
          ._subparsers._group_actions[0].choices]
for verb in verbs:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        build_parser().parse_args([*verb, "--help"])
print(len(verbs), time.perf_counter() - start, ",".join(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_help_imports_no_torch():
    """`fedlib --help` and every `fedlib VERB --help` in a fresh interpreter: torch (and
    transformers) never imported. The time is printed, not asserted."""
    proc = subprocess.run([sys.executable, "-c", HELP_SCRIPT], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    count, seconds, *heavy = proc.stdout.split()
    print(f"\nparser built and {count} help pages printed in {float(seconds):.2f}s")
    assert int(count) > 30 and heavy == []
