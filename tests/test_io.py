"""write_safetensors: readable by safetensors itself, and the same content gives the same bytes;
a writer killed with kill -9 leaves no output, and the next writer removes its temporary file."""

import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from fedlib.io import _writer_tag, atomic_folder, remove_stale_temps, write_safetensors, write_text_atomic

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _tensors():
    g = torch.Generator().manual_seed(0)
    out = {f"t_{str(d).split('.')[-1]}": (torch.randn(3, 5, generator=g) * 50).to(d) for d in DTYPES}
    out["scalar"] = torch.tensor(2.5)
    out["empty"] = torch.zeros(0, 4)
    out["odd"] = torch.ones(7, dtype=torch.bool)  # 7 bytes: later tensors start unaligned, as allowed
    return out


def test_safetensors_reads_what_we_write(tmp_path):
    path = tmp_path / "x.safetensors"
    tensors, meta = _tensors(), {"b": "2", "a": "{\"k\": 1}"}
    write_safetensors(path, tensors, meta)
    loaded = load_file(str(path))
    assert loaded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape and torch.equal(loaded[name], t)
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == meta


@pytest.mark.slow
def test_same_content_same_bytes_across_processes(tmp_path):
    """safetensors' own writer orders the metadata by a per-process hash: check two processes."""
    script = (
        "import sys, torch; from fedlib.io import write_safetensors\n"
        "meta = {f'key{i}': str(i) for i in range(20)}\n"
        "write_safetensors(sys.argv[1], {'b': torch.arange(6).reshape(2, 3), 'a': torch.ones(4, dtype=torch.bool)}, meta)\n"
    )
    paths = [tmp_path / f"{i}.safetensors" for i in range(2)]
    for p in paths:
        subprocess.run([sys.executable, "-c", script, str(p)], check=True)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    # an independent check of the layout: header length, JSON with sorted keys, data in name order
    raw = paths[0].read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0 and raw[8 + n:] == torch.ones(4, dtype=torch.bool).numpy().tobytes() + torch.arange(6).numpy().tobytes()


def test_unsupported_dtype_is_refused(tmp_path):
    with pytest.raises(TypeError, match="complex"):
        write_safetensors(tmp_path / "x.safetensors", {"c": torch.zeros(2, dtype=torch.complex64)}, {})
    assert not (tmp_path / "x.safetensors").exists()


# --------------------------------------------------------------------------- crash safety


def _killed_mid_write(tmp_path, body: str) -> int:
    """Run ``body`` (Python, with ``path`` the target) in a process that prints "ready" and then
    waits inside the write; kill -9 it there. Its pid."""
    script = ("import sys, time, torch\nfrom pathlib import Path\n"
              "from fedlib.io import SafetensorsWriter, atomic_folder, atomic_path\n"
              f"path = Path(sys.argv[1])\n{body}")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()  # SIGKILL: no finally block, no atexit runs
    proc.wait()
    return proc.pid


WAIT = "    print('ready', flush=True)\n    time.sleep(600)\n"


@pytest.mark.parametrize("body, rewrite", [
    ("with atomic_path(path) as tmp:\n    tmp.write_text('half')\n" + WAIT,
     lambda path: write_text_atomic(path, "whole\n")),
    ("with SafetensorsWriter(path, {'a': (torch.int32, (4,)), 'b': (torch.int32, (2,))}) as w:\n"
     "    w.add('a', torch.arange(4, dtype=torch.int32))\n" + WAIT,
     lambda path: write_safetensors(path, {"a": torch.arange(4, dtype=torch.int32)}, {})),
    ("with atomic_folder(path) as tmp:\n    (tmp / 'model.safetensors').write_bytes(b'x')\n" + WAIT,
     lambda path: atomic_folder_write(path)),
], ids=["atomic_path", "SafetensorsWriter", "atomic_folder"])
def test_kill_9_mid_write_leaves_no_output_and_the_next_write_removes_its_temp(tmp_path, body, rewrite):
    pid = _killed_mid_write(tmp_path, body)
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())  # nothing at the result's path
    stale = [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert len(stale) == 1 and f"-{pid}." in stale[0].name  # the killed writer's, named after it
    rewrite(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def atomic_folder_write(path):
    with atomic_folder(path) as tmp:
        (tmp / "model.safetensors").write_bytes(b"weights")
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]


def test_temp_files_of_live_writers_and_other_results_are_kept(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
        host = _writer_tag().rsplit("-", 1)[0]
        names = {"live": f".r.json.{host}-{sleeper.pid}.abc.tmp", "other host": f".r.json.elsewhere-{dead}.abc.tmp",
                 "other result": f".r.json.x.{host}-{dead}.abc.tmp", "dead": f".r.json.{host}-{dead}.abc.tmp",
                 "dead spool": f".r.json.{host}-{dead}.abc.spool"}
        for name in names.values():
            (tmp_path / name).write_text("")
        assert sorted(p.name for p in remove_stale_temps(tmp_path / "r.json")) == sorted(
            [names["dead"], names["dead spool"]])
        write_text_atomic(tmp_path / "r.json", "{}\n")
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(["r.json", names["live"], names["other host"], names["other result"]])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_error_inside_atomic_folder_moves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_folder(tmp_path / "model") as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("conversion failed")
    assert list(tmp_path.iterdir()) == []
