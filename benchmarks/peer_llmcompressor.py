"""The peer side of benchmarks/bench_peers.py: llmcompressor's oneshot Wanda or SparseGPT on the
token ids and dense model folder the bench wrote. Runs in .venv-peers (`make bench-peers`), so
it imports nothing from fedlib.

Writes ``--out`` (JSON: seconds of the ``oneshot`` call alone, after the model and tokens are
loaded, and the versions used) and, with ``--weights``, the pruned decoder-block linear weights
as safetensors (after the timed call).
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import version

import torch
from safetensors import safe_open
from safetensors.torch import save_file

MODIFIERS = ("wanda", "sparsegpt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="dense model folder (save_pretrained)")
    parser.add_argument("--tokens", required=True, help="safetensors file with an 'input_ids' tensor")
    parser.add_argument("--method", choices=MODIFIERS, required=True)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--weights", help="also write the pruned linear weights here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.pruning import SparseGPTModifier, WandaPruningModifier
    from transformers import AutoModelForCausalLM

    with safe_open(args.tokens, framework="pt") as handle:
        ids = handle.get_tensor("input_ids").long()
    dataset = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    # each tool's own defaults otherwise (SparseGPT: block 128, 1 % dampening, as fedlib)
    modifier = (WandaPruningModifier if args.method == "wanda" else SparseGPTModifier)(
        sparsity=args.sparsity, mask_structure="0:0", targets=["Linear"], ignore=["re:.*lm_head"])

    start = time.perf_counter()
    oneshot(model=model, dataset=dataset, recipe=modifier, num_calibration_samples=ids.shape[0],
            max_seq_length=ids.shape[1], batch_size=args.batch_size, shuffle_calibration_samples=False)
    seconds = time.perf_counter() - start

    if args.weights:
        layers = model.model.layers
        save_file({f"model.layers.{i}.{name}": module.weight.detach().contiguous()
                   for i, layer in enumerate(layers) for name, module in layer.named_modules()
                   if isinstance(module, torch.nn.Linear)}, args.weights)
    with open(args.out, "w") as out:
        json.dump({"seconds": seconds, "threads": torch.get_num_threads(), "batch_size": args.batch_size,
                   "versions": {p: version(p) for p in ("llmcompressor", "torch", "transformers")}}, out)


if __name__ == "__main__":
    main()
