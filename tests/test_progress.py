"""Per-block progress of the long verbs, and the reader that loads block l+1 while block l computes."""

import io
import re
import threading

import torch

from fedlib import progress
from fedlib.cli import main
from fedlib.client import Pruning, prune_locally
from fedlib.data import save_tokens
from fedlib.models import open_model

from conftest import tiny_llama

LINE = re.compile(r"^([^:]+): (\w+) (\d+)/(\d+) in [0-9.]+s \([0-9.]+s per \w+, ETA \w+\)$")


def test_track_reports_each_step_only_when_asked():
    assert list(progress.track([1, 2, 3], "block")) == [1, 2, 3]  # off by default: silent
    stream = io.StringIO()
    with progress.reporting("client-mask", stream):
        seen = list(progress.track(["a", "b", "c"], "block"))
    assert seen == ["a", "b", "c"]
    lines = stream.getvalue().splitlines()
    assert [LINE.match(line).group(1, 2, 3, 4) for line in lines] == [
        ("client-mask", "block", str(i), "3") for i in (1, 2, 3)]
    assert lines[-1].endswith("ETA 0s)")
    assert list(progress.track([1], "block")) == [1]  # the context is left: silent again
    assert progress._duration(59.6) == "1m00s" and progress._duration(3725) == "1h02m"


def test_a_pruning_pass_reports_its_blocks():
    stream = io.StringIO()
    with progress.reporting("job", stream):
        prune_locally(tiny_llama(layers=3), torch.randint(0, 128, (2, 8)), Pruning("wanda", 0.5, "row", 0))
    assert [LINE.match(line).group(3, 4) for line in stream.getvalue().splitlines()] == [
        ("1", "3"), ("2", "3"), ("3", "3")]


def test_the_next_block_is_read_while_the_current_one_computes(tiny_model_dir):
    """A lazy model's block l+1 is read from the checkpoint (on another thread) before the
    caller is done with block l; the masks are those of the plain sequential reads."""
    handle = open_model(str(tiny_model_dir))
    events, read, second_read = [], handle.block_tensors, threading.Event()

    def recorded(index, pinned=False):
        events.append(("read", index, threading.current_thread() is threading.main_thread()))
        if index == 1:
            second_read.set()
        return read(index, pinned)

    def done(index, _decision):
        # block 0's caller waits (bounded) for the read of block 1 to start: it was submitted
        # before block 0 computed, and a loaded machine may only schedule its thread later
        if index == 0:
            second_read.wait(timeout=30)
        events.append(("done", index, True))

    handle.block_tensors = recorded
    ids = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(0))
    got = prune_locally(handle, ids, Pruning("wanda", 0.5, "row", 0), on_block=done)
    assert events.index(("read", 1, False)) < events.index(("done", 0, True))
    assert all(not main_thread for kind, _i, main_thread in events if kind == "read")
    reference = prune_locally(open_model(str(tiny_model_dir)).load_all(), ids, Pruning("wanda", 0.5, "row", 0))
    assert got.masks.keys() == reference.masks.keys()
    assert all(torch.equal(got.masks[n], reference.masks[n]) for n in got.masks)


def test_long_verbs_report_progress_in_their_log(tiny_model_dir, tmp_path, capsys):
    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1)))
    masks = []
    for client in range(2):
        masks.append(str(tmp_path / f"{client}.mask.safetensors"))
        assert main(["client-mask", "--model", str(tiny_model_dir), "--calib", str(calib), "--client-id",
                     str(client), "--out", masks[-1]]) == 0
    assert main(["aggregate", "--model", str(tiny_model_dir), "--out", str(tmp_path / "g.safetensors"),
                 *masks]) == 0
    assert main(["inspect", masks[0]]) == 0
    # the DP federation's one pass reports its blocks too (a privacy verb: its name is 'privacy <analysis>')
    spans = []
    for name in ("public", "a", "b"):
        spans.append(str(tmp_path / f"{name}.safetensors"))
        save_tokens(spans[-1], torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(len(spans))),
                    dataset="test", unit="span", windows_per_unit=1)
    release = '[{"label": "d", "mechanism": "distributed", "epsilon": 8, "delta": 1e-5, "clip": 2, "basis": 0}]'
    assert main(["privacy", "dp-federation", "--model", str(tiny_model_dir), "--public", spans[0], "--calib",
                 *spans[1:], "--releases", release, "--noise-seed", "0", "--out-dir", str(tmp_path / "dp"),
                 "--record", str(tmp_path / "dp.json")]) == 0
    lines = [LINE.match(line) for line in capsys.readouterr().err.splitlines()]
    steps = [m.group(1, 2, 3, 4) for m in lines if m]
    assert steps == [("client-mask", "block", "1", "2"), ("client-mask", "block", "2", "2")] * 2 + [
        ("aggregate", "layer", str(i), "14") for i in range(1, 15)] + [  # inspect reports nothing
        ("privacy dp-federation", "block", "1", "2"), ("privacy dp-federation", "block", "2", "2")]
