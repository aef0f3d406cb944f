"""Reading a Hugging Face safetensors checkpoint tensor by tensor (one file, or shards with an
``model.safetensors.index.json``).

Tensors are read with plain positioned reads into fresh buffers, not memory-mapped: a mapped
shard keeps every page it touched in the process's resident set until it is unmapped, so a
client streaming a 7B model block by block would end up "holding" the whole checkpoint. Read
this way, host memory holds only the tensors the caller keeps.

The model fingerprint (:func:`fedlib.models.fingerprint`) is computed here from the stored
bytes, in chunks, so it never needs the model in memory either.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedlib.io import SAFETENSORS_CODES

if TYPE_CHECKING:  # torch is imported where a tensor is read: job sizing reads headers without it
    import torch
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: bytes hashed per read when fingerprinting (bounded memory whatever the tensor size)
_CHUNK = 64 << 20
#: a safetensors header larger than this is not a model checkpoint
_MAX_HEADER = 100 << 20


class CheckpointError(ValueError):
    def __init__(self, path: Path | str, message: str):
        self.path = str(path)
        super().__init__(f"checkpoint {path}: {message}")


@dataclass(frozen=True)
class StoredTensor:
    file: Path
    code: str  # safetensors' dtype code
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int

    @property
    def itemsize(self) -> int:
        return SAFETENSORS_CODES[self.code][1]

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, SAFETENSORS_CODES[self.code][0])


def stored_tensors(path: Path) -> dict[str, StoredTensor]:
    """The tensors a safetensors file holds (from its header; nothing else is read)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise CheckpointError(path, "truncated (no safetensors header)")
        length = int.from_bytes(raw, "little")
        if not 0 < length <= min(_MAX_HEADER, size - 8):
            raise CheckpointError(path, f"header length {length} does not fit a {size}-byte file")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(path, f"header is not JSON ({err})") from None
    base = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            code = entry["dtype"]
            itemsize = SAFETENSORS_CODES[code][1]  # an unknown code: malformed
            shape = tuple(int(x) for x in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(path, f"tensor {name!r}: malformed entry ({err})") from None
        nbytes = math.prod(shape) * itemsize
        if end - begin != nbytes or begin < 0 or base + end > size:
            raise CheckpointError(path, f"tensor {name!r}: offsets {begin}..{end} do not hold {shape} {code}")
        tensors[name] = StoredTensor(path, code, shape, base + begin, nbytes)
    return tensors


class Checkpoint:
    """The tensors of the safetensors checkpoint in ``folder``, readable one by one."""

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        index = self.folder / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise CheckpointError(index, f"expected a JSON object with 'weight_map' ({err})") from None
            files = sorted(set(weight_map.values()))
        elif (self.folder / SINGLE).is_file():
            files = [SINGLE]
        else:
            raise CheckpointError(self.folder, f"no {SINGLE} or {INDEX}")
        self.tensors: dict[str, StoredTensor] = {}
        for name in files:
            path = self.folder / name
            if not path.is_file():
                raise CheckpointError(index, f"shard {name} is missing")
            self.tensors.update(stored_tensors(path))

    @staticmethod
    def exists(folder: Path | str) -> bool:
        folder = Path(folder)
        return (folder / INDEX).is_file() or (folder / SINGLE).is_file()

    def files(self) -> list[Path]:
        return sorted({t.file for t in self.tensors.values()})

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def read(self, name: str, pinned: bool = False) -> torch.Tensor:
        """The stored tensor (its stored dtype, on the host), read from disk now; ``pinned``:
        into page-locked memory (an asynchronous copy to a CUDA device reads it)."""
        try:
            stored = self.tensors[name]
        except KeyError:
            raise CheckpointError(self.folder, f"no tensor {name!r}") from None
        import torch

        buffer = torch.empty(stored.nbytes, dtype=torch.uint8, pin_memory=pinned)
        with open(stored.file, "rb", buffering=0) as handle:
            view = memoryview(buffer.numpy())
            done = 0
            while done < stored.nbytes:
                got = os.preadv(handle.fileno(), [view[done:]], stored.start + done)
                if got <= 0:
                    raise CheckpointError(stored.file, f"tensor {name!r}: file ended early")
                done += got
        return buffer.view(stored.dtype).reshape(stored.shape)

    def fingerprint(self, names: Sequence[str]) -> str:
        """sha256 over each named tensor's name, shape, dtype and stored bytes, in the given
        order: the same digest :func:`fedlib.models.fingerprint` computes from a model in memory
        whose parameters have these names and exactly these values."""
        digest = hashlib.sha256()
        for name in names:
            stored = self.tensors.get(name)
            if stored is None:
                raise CheckpointError(self.folder, f"no tensor {name!r} (needed for the fingerprint)")
            digest.update(f"{name}|{stored.shape}|{stored.dtype}\n".encode())
            with open(stored.file, "rb") as handle:
                handle.seek(stored.start)
                left = stored.nbytes
                while left:
                    chunk = handle.read(min(_CHUNK, left))
                    if not chunk:
                        raise CheckpointError(stored.file, f"tensor {name!r}: file ended early")
                    digest.update(chunk)
                    left -= len(chunk)
        return digest.hexdigest()


def file_stats(paths: Iterable[Path]) -> dict[str, list[int]]:
    """name -> [size, mtime_ns]: what a cached fingerprint is valid for."""
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(paths)}
