"""fedlib.models.load_tokenizer opens a folder declaring transformers' generic TokenizersBackend
with that class directly (no model classes imported): the tokenizer AutoTokenizer gives, checked
here against AutoTokenizer itself on the test data, for every model type the shortcut admits."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedlib.models import GENERIC_TOKENIZER_TYPES, _declares_generic_tokenizer, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / ".test" / "model"
DATA = REPO / ".test" / "data"


def tokenizer_folder(tmp_path: Path, model_type: str, **declared) -> Path:
    """.test/model's tokenizer files, its config.json with ``model_type`` (and its tokenizer_config
    with ``declared`` changes)."""
    folder = tmp_path / model_type
    folder.mkdir()
    shutil.copy(MODEL / "tokenizer.json", folder)
    config = json.loads((MODEL / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    tokenizer_config = json.loads((MODEL / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, **declared}))
    return folder


def texts() -> list[str]:
    lines = [line for name in ("ptb/test.txt", "wikitext2/test.txt") for line in
             (DATA / name).read_text().splitlines()[:200] if line.strip()]
    docs = [json.loads(line)["text"] for line in (DATA / "c4" / "train.jsonl").read_text().splitlines()[:20]]
    return lines + docs + ["<|endoftext|> a b", "  leading spaces\tand tabs\n", "ünïcödé – “quotes” 数字 🙂"]


@pytest.mark.parametrize("model_type", sorted(GENERIC_TOKENIZER_TYPES))
def test_a_generic_tokenizer_folder_gives_what_autotokenizer_gives(tmp_path, model_type):
    from transformers import AutoTokenizer

    folder = tokenizer_folder(tmp_path, model_type)
    assert _declares_generic_tokenizer(folder)
    fast, auto = load_tokenizer(str(folder)), AutoTokenizer.from_pretrained(str(folder))
    assert type(fast) is type(auto)
    sample = texts()
    assert [fast(t)["input_ids"] for t in sample] == [auto(t)["input_ids"] for t in sample]
    assert fast("\n\n".join(sample), return_tensors="pt")["input_ids"].tolist() == \
        auto("\n\n".join(sample), return_tensors="pt")["input_ids"].tolist()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids", "model_max_length"):
        assert getattr(fast, name) == getattr(auto, name), name


@pytest.mark.parametrize("model_type, declared", [
    ("qwen2", {}),  # AutoTokenizer overrides the declared class for some model types
    ("llama", {"tokenizer_class": "LlamaTokenizer"}),
    ("llama", {"auto_map": {"AutoTokenizer": ["x.Tokenizer", None]}}),
])
def test_any_other_folder_goes_through_autotokenizer(tmp_path, model_type, declared):
    assert not _declares_generic_tokenizer(tokenizer_folder(tmp_path, model_type, **declared))


def test_a_folder_with_unreadable_or_odd_json_goes_through_autotokenizer(tmp_path):
    folder = tokenizer_folder(tmp_path, "llama")
    (folder / "config.json").write_text("[1, 2]")
    assert not _declares_generic_tokenizer(folder)
    (folder / "config.json").write_text("{not json")
    assert not _declares_generic_tokenizer(folder)
    assert not _declares_generic_tokenizer(tmp_path / "missing")


def test_a_data_job_imports_no_model_class(tmp_path):
    """What the shortcut is for: loading the tokenizer imports no transformers model module."""
    code = ("import sys; from fedlib.models import load_tokenizer; load_tokenizer(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.startswith('transformers.models.')))")
    out = subprocess.run([sys.executable, "-c", code, str(MODEL)], capture_output=True, text=True, check=True,
                         cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
