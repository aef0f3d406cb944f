"""Masks computed in bfloat16 vs float32 on the embedded model, side by side in one run.

The same calibration windows go through the same client loop twice: weights and activations in
float32, then in bfloat16 (statistics accumulate in float32/float64 either way). Reported per
method: the fraction of weights whose keep/prune decision agrees (goal >= 99 %), and the
perplexity of the model pruned by each mask (evaluated in float32, so only the mask differs),
plus the bfloat16 evaluation of the bfloat16-pruned model.
"""

from __future__ import annotations

import argparse
import time

import torch

from common import DATA_DIR, mask_agreement, write
from fedlib.data import calibration_windows, evaluation_windows
from fedlib.evaluate.perplexity import perplexity
from fedlib.models import load_tokenizer, open_model
from fedlib.client import Pruning, prune_locally
from fedlib.runner import BlockDecision, Placement

GROUPS = {"wanda": "row", "sparsegpt": "row", "magnitude": "layer"}


def variant(masks: dict[str, torch.Tensor]):
    by_block: dict[int, dict] = {}
    for name, mask in masks.items():
        by_block.setdefault(int(name.split(".layers.")[1].split(".")[0]), {})[name] = mask
    return lambda index: BlockDecision(masks=by_block[index]) if index in by_block else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", nargs="+", default=["wanda", "sparsegpt"])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--windows", type=int, default=32, help="WikiText-2 test windows for perplexity")
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    calib = calibration_windows(tokenizer, "c4", DATA_DIR, args.samples, args.seqlen, 0, (0, 800))
    windows, _ = evaluation_windows(tokenizer, "wikitext2", DATA_DIR, args.seqlen, args.windows)
    f32, bf16 = Placement.resolve("cpu", "float32"), Placement.resolve("cpu", "bfloat16")
    handle = open_model(args.model)
    records = []
    dense = perplexity(handle, windows, batch_size=4)["ppl"]
    dense_bf16 = perplexity(handle, windows, batch_size=4, placement=bf16)["ppl"]
    print(f"dense perplexity: float32 {dense:.3f}, bfloat16 {dense_bf16:.3f}")
    for method in args.methods:
        group = GROUPS[method]
        masks, seconds = {}, {}
        for label, placement in (("float32", f32), ("bfloat16", bf16)):
            start = time.perf_counter()
            pruning = Pruning(method, args.sparsity, group, 0, batch_size=4, placement=placement)
            masks[label] = prune_locally(handle, calib, pruning).masks
            seconds[label] = time.perf_counter() - start
        agree, total = mask_agreement(masks["float32"], masks["bfloat16"])
        ppl = {label: perplexity(handle, windows, batch_size=4, variant=variant(m))["ppl"] for label, m in masks.items()}
        ppl_bf16_eval = perplexity(handle, windows, batch_size=4, placement=bf16, variant=variant(masks["bfloat16"]))["ppl"]
        record = {
            "method": method, "group": group, "sparsity": args.sparsity, "weights": total,
            "agreement": agree / total, "differing_weights": total - agree,
            "ppl_float32_masks": ppl["float32"], "ppl_bfloat16_masks": ppl["bfloat16"],
            "ppl_bfloat16_masks_bfloat16_eval": ppl_bf16_eval,
            "ppl_relative_difference": ppl["bfloat16"] / ppl["float32"] - 1,
            "seconds_float32": seconds["float32"], "seconds_bfloat16": seconds["bfloat16"],
        }
        records.append(record)
        print(f"{method} ({group}, {args.sparsity:.0%}): masks agree on {record['agreement']:.4%} of "
              f"{total:,} weights; perplexity float32 masks {ppl['float32']:.3f}, bfloat16 masks "
              f"{ppl['bfloat16']:.3f} ({record['ppl_relative_difference']:+.2%}), bfloat16 eval "
              f"{ppl_bf16_eval:.3f}; client {seconds['float32']:.0f} s vs {seconds['bfloat16']:.0f} s")
    write("precision", {
        "model": args.model, "calibration": {"dataset": "c4", "samples": args.samples, "seqlen": args.seqlen},
        "evaluation": {"dataset": "wikitext2", "windows": args.windows, "seqlen": args.seqlen},
        "dense_ppl_float32": dense, "dense_ppl_bfloat16": dense_bf16, "methods": records,
    })


if __name__ == "__main__":
    main()
