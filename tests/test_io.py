"""write_safetensors: readable by safetensors itself, and the same content gives the same bytes."""

import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from fedlib.io import write_safetensors

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
