"""An upload pulled a chunk at a time: the coordinator's memory is bounded by the chunk, not the upload.

Flower assembles every message whole in the receiver's memory, with several copies of it on the
way (its chunks, the HTTP bodies, the assembled array), so a reply that carried a whole upload
cost the coordinator several uploads of memory. Instead a site writes its upload to its spool
(a folder of its own: node config ``spool``, default one in the system's temporary folder named
for the site's public key) and answers the upload step with the file's size and SHA-256 and its
first ``chunk-bytes`` bytes; the coordinator then asks ``query.upload_chunk`` for each next range
and appends it to a part file, and moves the file into place only once its size and digest
match what the site declared. Everything in a request is checked by the site (the kind from a
fixed set, the run and round as numbers: a coordinator cannot name another file), and everything
in a reply by the coordinator (the declared size against the largest honest upload before any
chunk is asked for, each chunk's length against the range asked).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from flwr.app import ConfigRecord, RecordDict

from fedlib_flower import wire

#: what a site may upload, each in its own file of the spool
KINDS = ("mask", "weights", "secagg")
#: the chunk sizes a site serves (a coordinator asking for more or less is refused)
MIN_CHUNK, MAX_CHUNK = 1 << 10, 64 << 20
#: the record an upload step's reply names its file in, and its keys
MANIFEST = {"size": int, "sha256": bytes}
#: a chunk request's keys (``query.upload_chunk``)
REQUEST = {"round": int, "kind": str, "offset": int, "length": int}
#: the record that carries the chunk size in an upload step (coordinator -> site)
TRANSFER = {"chunk-bytes": int}


def check_chunk(record: str, key: str, length: int) -> int:
    if not MIN_CHUNK <= length <= MAX_CHUNK:
        raise wire.WireError(record, key, f"{length}: a site serves chunks of {MIN_CHUNK} to {MAX_CHUNK} bytes")
    return length


class Spool:
    """A site's one upload waiting to be pulled (the folder holds the latest upload only)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        # the default lies in a shared temporary folder: one another user made first could read
        # the site's uploads (a plain mask, without secure aggregation)
        info = self.folder.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise ValueError(f"node config: key 'spool': {self.folder} must be a folder of this user's that no one "
                             "else may read or write (mode 700)")

    @classmethod
    def of_site(cls, node_config, public_key: bytes) -> "Spool":
        named = str(node_config.get("spool", ""))
        default = Path(tempfile.gettempdir()) / f"fedlib-spool-{hashlib.sha256(public_key).hexdigest()[:16]}"
        return cls(Path(named) if named else default)

    def path(self, run_id: int, round_index: int, kind: str) -> Path:
        if kind not in KINDS:
            raise wire.WireError("chunk", "kind", f"{kind!r}, expected one of {list(KINDS)}")
        if round_index < 0:
            raise wire.WireError("chunk", "round", f"{round_index}, expected a round index >= 0")
        return self.folder / f"{int(run_id)}.{round_index}.{kind}.safetensors"

    def offer(self, source: Path, run_id: int, round_index: int, kind: str, chunk: int) -> RecordDict:
        """Keep ``source`` as this site's upload (any earlier one removed) and give the upload
        step's reply: the manifest and the first chunk."""
        path = self.path(run_id, round_index, kind)
        for old in self.folder.iterdir():
            if old.is_file() and old != path:
                old.unlink()
        shutil.move(source, path)  # the spool may be on another file system than ``source``
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        size = path.stat().st_size
        return RecordDict({"upload": ConfigRecord({"size": size, "sha256": digest.digest()}),
                           "chunk": wire.file_record(self.read(path, 0, min(chunk, size)))})

    def chunk(self, run_id: int, request: dict) -> bytes:
        """The bytes a ``query.upload_chunk`` asks for, of this site's upload of that run and round."""
        path = self.path(run_id, request["round"], request["kind"])
        if not path.is_file():
            raise wire.WireError("chunk", "round", f"run {run_id}, round {request['round']}: this site holds no "
                                                   f"{request['kind']} upload of that round")
        length, size = check_chunk("chunk", "length", request["length"]), path.stat().st_size
        if not 0 <= request["offset"] < size:
            raise wire.WireError("chunk", "offset", f"{request['offset']}, the upload has {size} bytes")
        return self.read(path, request["offset"], min(length, size - request["offset"]))

    @staticmethod
    def read(path: Path, offset: int, length: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)


class Download:
    """One site's upload arriving a chunk at a time into ``path`` (via a part file beside it)."""

    def __init__(self, path: Path, manifest: dict, limit: int, round_index: int, kind: str, chunk: int):
        if not 0 < manifest["size"] <= limit:
            raise wire.WireError("upload", "size", f"{manifest['size']} bytes, an upload here has 1 to {limit}")
        if len(manifest["sha256"]) != 32:
            raise wire.WireError("upload", "sha256", f"{len(manifest['sha256'])} bytes, a SHA-256 digest has 32")
        self.path, self.size, self.sha256 = Path(path), manifest["size"], manifest["sha256"]
        self.round_index, self.kind, self.chunk = round_index, kind, chunk
        from fedlib.io import temp_beside

        self.part = temp_beside(self.path, suffix=".part")
        self.file = open(self.part, "wb")
        self.digest = hashlib.sha256()
        self.received = 0

    def add(self, content: RecordDict) -> None:
        """A reply's chunk: exactly the range asked for next."""
        data = wire.file_bytes(content, "chunk")
        expected = min(self.chunk, self.size - self.received)
        if len(data) != expected:
            raise wire.WireError("chunk", wire.FILE_KEY, f"{len(data)} bytes at offset {self.received}, "
                                                         f"expected {expected}")
        self.file.write(data)
        self.digest.update(data)
        self.received += len(data)

    @property
    def done(self) -> bool:
        return self.received == self.size

    def request(self) -> RecordDict:
        return RecordDict({"chunk": ConfigRecord({"round": self.round_index, "kind": self.kind,
                                                  "offset": self.received, "length": self.chunk})})

    def finish(self) -> Path:
        """The file in place, or a refusal if its bytes are not the ones the site declared."""
        self.file.close()
        if self.digest.digest() != self.sha256:
            self.abort()
            raise wire.WireError("upload", "sha256", "the chunks received do not have the digest the site declared")
        os.replace(self.part, self.path)
        return self.path

    def abort(self) -> None:
        self.file.close()
        self.part.unlink(missing_ok=True)


def words_layout(numel: dict[str, int], bits: int, client_id: str) -> tuple[dict, dict]:
    """The declared tensors and metadata of a secure-aggregation upload: per layer of ``numel``
    weights its ``bits`` packed bit planes (:func:`fedlib.server.secagg.pack_words`), as a
    safetensors file; the site writes it, the coordinator knows its exact bytes but the words."""
    import torch

    declared = {name: (torch.uint8, (bits * ((n + 7) // 8),)) for name, n in numel.items()}
    return declared, {"client_id": client_id, "bits": str(bits)}
