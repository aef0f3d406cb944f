"""Writing files so that a crash or a bad input never leaves a half-written result behind, and
so that the same content always gives the same bytes."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yield a temporary path beside ``path``; move it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp creates 0600; give the result the permissions an ordinary open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


SAFETENSORS_DTYPES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
}


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
    """Write a safetensors file (atomically) whose bytes depend only on its content.

    safetensors' own writer emits ``__metadata__`` in a per-process hash order, so the same
    mask got a different sha256 on every run; here the header is JSON with sorted keys and the
    tensors are laid out in name order (little-endian, as the format requires)."""
    header: dict = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}} if metadata else {}
    views, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"{path}: tensor {name!r} has dtype {t.dtype}, which safetensors cannot store")
        data = t.reshape(-1).view(torch.uint8).numpy()  # a view of the tensor's bytes, not a copy
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        views.append(data)
        offset += data.nbytes
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the format aligns the data start to 8 bytes
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        out.write(len(raw).to_bytes(8, "little"))
        out.write(raw)
        for data in views:
            out.write(data.data)
