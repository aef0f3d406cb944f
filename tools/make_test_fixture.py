"""Write the workflow's test fixture under .test/ (the snakemake-workflows convention): a
2-block LLaMA with a byte-level tokenizer, and the first lines of each data mirror file.

Committed, so the workflow test and CI run on it as is; rerun this only to change it:

    python tools/make_test_fixture.py [--mirror ../shared/data] [--out .test]

The model is random (seeded) and tiny (257-token vocabulary, hidden 32: 140 KB), so a
workflow run costs seconds; it still has every part a real model has (rotary attention,
grouped KV heads, gated MLP, untied head, a Hugging Face fast tokenizer)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# lines (text files) or rows (JSONL) kept from the mirror: enough for the calibration and
# evaluation ranges of .test/config.yaml and its study targets (the non-IID pool mixes in
# WikiText-2 validation and PTB train windows; the domain study's headroom scores PTB validation),
# small enough to commit
DATA_SLICES = {
    "c4/train.jsonl": 60,
    "wikitext2/test.txt": 200,
    "wikitext2/validation.txt": 200,
    "ptb/test.txt": 200,
    "ptb/train.txt": 200,
    "ptb/validation.txt": 200,
    "zeroshot/rte.jsonl": 8,
    "zeroshot/arc_easy.jsonl": 8,
}
SEED = 0


def byte_tokenizer():
    """A byte-level BPE without merges (every UTF-8 byte is a token) plus one end-of-text token:
    it round-trips any text and needs no training."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")


def tiny_model(vocab_size: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1)
    model = LlamaForCausalLM(config).eval()
    model.config.use_cache = False
    return model


def write_model(out: Path) -> None:
    tokenizer = byte_tokenizer()
    model = tiny_model(len(tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def write_data(mirror: Path, out: Path) -> None:
    for name, lines in DATA_SLICES.items():
        source = mirror / name
        if not source.is_file():
            raise SystemExit(f"{source}: not found (the data mirror, see ../shared/data/README.md)")
        with source.open(encoding="utf-8") as handle:
            head = [next(handle) for _ in range(lines)]
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(head), encoding="utf-8")
    (out / "SOURCE.json").write_text(json.dumps(
        {"from": "the offline data mirror (../shared/data; see its README for provenance and licences)",
         "first_lines": DATA_SLICES}, indent=2) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / ".test")
    args = parser.parse_args(argv)
    write_model(args.out / "model")
    write_data(args.mirror, args.out / "data")
    print(f"wrote {args.out / 'model'} and {args.out / 'data'}")


if __name__ == "__main__":
    main()
