"""Writing files so that a crash or a bad input never leaves a half-written result behind, and
so that the same content always gives the same bytes.

Every result is written to a temporary file beside it and moved into place with
:func:`os.replace`, so a reader (or Snakemake after ``kill -9``) sees the whole file or none.
A temporary file's name carries the host and process id of its writer
(``.<name>.<host>-<pid>.<random>.tmp``): the next writer of the same result deletes those whose
writer is dead (a process killed with ``kill -9`` cannot clean up), and never one of a live
process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TEMP_SUFFIXES = (".tmp", ".spool")  # a file being written; a SafetensorsWriter's tensor data


def _writer_tag() -> str:
    host = re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname()) or "host"
    return f"{host}-{os.getpid()}"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temps(path: Path) -> list[Path]:
    """Delete the temporary files (and folders) of ``path`` whose writer was a process on this
    host that no longer runs; the ones deleted. A writer on another host (a shared file
    system) cannot be checked, so its files stay."""
    path = Path(path)
    suffixes = "|".join(re.escape(s) for s in TEMP_SUFFIXES)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?P<host>[^.]+)-(?P<pid>\d+)\.[^.]+(?:{suffixes})")
    host = _writer_tag().rsplit("-", 1)[0]
    removed = []
    try:
        siblings = list(path.parent.iterdir())
    except FileNotFoundError:
        return removed
    for sibling in siblings:
        match = pattern.fullmatch(sibling.name)
        if match and match["host"] == host and not _process_alive(int(match["pid"])):
            if sibling.is_dir() and not sibling.is_symlink():
                shutil.rmtree(sibling, ignore_errors=True)
            else:
                sibling.unlink(missing_ok=True)
            removed.append(sibling)
    return removed


def temp_beside(path: Path, suffix: str = ".tmp", folder: bool = False) -> Path:
    """A new temporary file (or folder) in ``path``'s folder, named for ``path`` and this
    process; the stale ones of earlier, killed writers of ``path`` are deleted first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    prefix = f".{path.name}.{_writer_tag()}."
    if folder:
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=path.parent))
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    os.close(fd)
    return Path(tmp)


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yield a temporary path beside ``path``; move it into place only if the block succeeds."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        yield tmp
        # mkstemp creates 0600; give the result the permissions an ordinary open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_folder(out: Path, last: Sequence[str] = ("config.json",)):
    """Yield a temporary folder beside ``out``; if the block succeeds, move every file written
    there into ``out`` (each with :func:`os.replace`: whole or absent), the names in ``last``
    after all others, so a folder that has them has the rest too (``config.json`` is what
    makes a folder a model)."""
    out = Path(out)
    tmp = temp_beside(out, folder=True)
    try:
        yield tmp
        out.mkdir(parents=True, exist_ok=True)
        for entry in sorted(tmp.iterdir(), key=lambda p: (p.name in last, p.name)):
            os.replace(entry, out / entry.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_at(path: Path, offset: int, nbytes: int) -> bytearray:
    """``nbytes`` bytes of ``path`` from ``offset`` into a writable buffer; fewer where the file
    ends sooner (a file changed since its header was read: the caller names the error)."""
    buffer = bytearray(nbytes)
    with open(path, "rb") as handle:
        handle.seek(offset)
        got = handle.readinto(buffer)
    del buffer[got:]
    return buffer


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


#: safetensors' dtype codes: (the torch dtype's name, bytes per element)
SAFETENSORS_CODES = {"BOOL": ("bool", 1), "U8": ("uint8", 1), "I8": ("int8", 1), "I16": ("int16", 2),
                     "I32": ("int32", 4), "I64": ("int64", 8), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
                     "F32": ("float32", 4), "F64": ("float64", 8)}
_CODE_OF = {name: code for code, (name, _) in SAFETENSORS_CODES.items()}  # torch dtype name -> code


def safetensors_code(dtype: torch.dtype) -> str | None:
    """The format's code of a torch dtype, None for one it cannot store (no torch import: the
    workflow's Snakefile imports this module)."""
    return _CODE_OF.get(str(dtype).removeprefix("torch."))


def safetensors_layout(tensors: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], metadata: Mapping[str, str],
            path: Path) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The header bytes (length prefix included) and each tensor's (offset, nbytes) in the data
    section: tensors in name order, sorted JSON, data aligned to 8 bytes. Depends only on the
    content, never on the order tensors arrive in (safetensors' own writer emits
    ``__metadata__`` in a per-process hash order)."""
    header: dict = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}} if metadata else {}
    spans, offset = {}, 0
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        code = safetensors_code(dtype)
        if code is None:
            raise TypeError(f"{path}: tensor {name!r} has dtype {dtype}, which safetensors cannot store")
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": code, "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        spans[name] = (offset, nbytes)
        offset += nbytes
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the format aligns the data start to 8 bytes
    return len(raw).to_bytes(8, "little") + raw, spans


def _bytes_of(tensor: torch.Tensor):
    """A view of a host tensor's bytes (little-endian, as the format requires), not a copy."""
    import torch

    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
    """Write a safetensors file (atomically) whose bytes depend only on its content."""
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    head, _ = safetensors_layout({name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}, metadata, path)
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        out.write(head)
        for name in sorted(tensors):
            out.write(_bytes_of(tensors[name]))


def _copy_range(src: int, dst: int, total: int, dst_offset: int) -> None:
    """Bytes 0..total of ``src`` to ``dst`` at ``dst_offset`` (in the kernel where it can)."""
    done = 0
    while done < total:
        try:
            step = os.copy_file_range(src, dst, min(total - done, 1 << 30), done, dst_offset + done)
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            chunk = os.pread(src, min(total - done, 16 << 20), done)
            step = os.pwrite(dst, chunk, dst_offset + done) if chunk else 0
        if step <= 0:
            raise OSError(f"spool ended after {done} of {total} bytes")
        done += step


class SafetensorsWriter:
    """A safetensors file whose tensors arrive one at a time, in any order, and whose
    metadata is known only at the end, with the bytes :func:`write_safetensors` would give.

    Names, dtypes and shapes are declared up front, so each tensor is written straight to its
    final offset in a spool file beside ``path``; :meth:`close` writes the header and the spool
    into place atomically. Memory holds one tensor at a time (a 7B model's mask file, or a
    server's vote counts, never sit in memory whole). On an error nothing is left behind.
    """

    def __init__(self, path: Path, tensors: Mapping[str, tuple[torch.dtype, Sequence[int]]]):
        self.path = Path(path)
        self.declared = {name: (dtype, tuple(int(x) for x in shape)) for name, (dtype, shape) in tensors.items()}
        _, self.spans = safetensors_layout(self.declared, {}, self.path)
        self._spool = temp_beside(self.path, suffix=".spool")
        self._fd = os.open(self._spool, os.O_RDWR)
        self.written: set[str] = set()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        dtype, shape = self.declared.get(name, (None, None))
        if dtype is None:
            raise KeyError(f"{self.path}: tensor {name!r} was not declared")
        if tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise ValueError(f"{self.path}: tensor {name!r} is {tensor.dtype} {tuple(tensor.shape)}, "
                             f"declared {dtype} {shape}")
        if name in self.written:
            raise ValueError(f"{self.path}: tensor {name!r} written twice")
        offset, nbytes = self.spans[name]
        data, done = _bytes_of(tensor), 0
        while done < nbytes:
            done += os.pwrite(self._fd, data[done:], offset + done)
        self.written.add(name)

    def close(self, metadata: Mapping[str, str]) -> None:
        missing = sorted(set(self.declared) - self.written)
        if missing:
            raise ValueError(f"{self.path}: {len(missing)} declared tensors never written, e.g. {missing[0]!r}")
        head, _ = safetensors_layout(self.declared, metadata, self.path)
        total = sum(nbytes for _, nbytes in self.spans.values())
        try:
            with atomic_path(self.path) as tmp, open(tmp, "wb") as out:
                out.write(head)
                out.flush()
                _copy_range(self._fd, out.fileno(), total, len(head))
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the spool (nothing is written at ``path``)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._spool.unlink(missing_ok=True)

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
