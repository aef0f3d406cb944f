"""SparseGPT's Hessian and OBS update in float32 vs float64 on the embedded model, side by side.

fedlib accumulates SparseGPT's Hessian and runs its factorisations and update in float64 by default
(option ``dtype``); the reference runs them in float32. On a GPU float32 is the faster path (and
halves the 1 GB float64 Hessian of a 7B ``down_proj``), so this measures what float32 costs in
fidelity: the same calibration windows, the same client loop, ``sparsegpt_update`` (and the
mask-only metric ``sparsegpt``) with ``dtype`` float64 and float32. Reported per method: the
fraction of weights whose keep/prune decision agrees, and the perplexity of each pruned model
(weights updated as each run updated them), evaluated in float32.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_hessian_dtype.py --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch

from bench_precision import variant
from common import DATA_DIR, mask_agreement, write
from fedlib.client import Pruning, prune_locally
from fedlib.data import calibration_windows, evaluation_windows
from fedlib.evaluate.perplexity import perplexity
from fedlib.models import load_tokenizer, open_model
from fedlib.runner import BlockDecision


def pruned(result: BlockDecision):
    """The evaluation variant of a client's result: its masks, and its updated weights when the
    method updates them."""
    masks_only = variant(result.masks)
    if not result.weights:
        return masks_only
    return lambda index: _with_weights(masks_only(index), result.weights)


def _with_weights(decision: BlockDecision | None, weights: dict) -> BlockDecision | None:
    if decision is None:
        return None
    return BlockDecision(masks=decision.masks, weights={n: weights[n] for n in decision.masks if n in weights})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", nargs="+", default=["sparsegpt_update", "sparsegpt"])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--windows", type=int, default=32, help="WikiText-2 test windows for perplexity")
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--group", default="row")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    calib = calibration_windows(tokenizer, "c4", DATA_DIR, args.samples, args.seqlen, 0, (0, 800))
    windows, _ = evaluation_windows(tokenizer, "wikitext2", DATA_DIR, args.seqlen, args.windows)
    handle = open_model(args.model)
    dense = perplexity(handle, windows, batch_size=4)["ppl"]
    print(f"dense perplexity {dense:.3f}")
    records = []
    for method in args.methods:
        results, seconds = {}, {}
        for dtype in ("float64", "float32"):
            start = time.perf_counter()
            pruning = Pruning(method, args.sparsity, args.group, 0, options={"dtype": dtype}, batch_size=4)
            results[dtype] = prune_locally(handle, calib, pruning)
            seconds[dtype] = time.perf_counter() - start
        masks = {dtype: r.masks for dtype, r in results.items()}
        agree, total = mask_agreement(masks["float64"], masks["float32"])
        ppl = {dtype: perplexity(handle, windows, batch_size=4, variant=pruned(r))["ppl"] for dtype, r in results.items()}
        record = {
            "method": method, "group": args.group, "sparsity": args.sparsity, "weights": total,
            "agreement": agree / total, "differing_weights": total - agree,
            "ppl_float64": ppl["float64"], "ppl_float32": ppl["float32"],
            "ppl_relative_difference": ppl["float32"] / ppl["float64"] - 1,
            "seconds_float64": seconds["float64"], "seconds_float32": seconds["float32"],
        }
        records.append(record)
        print(f"{method} ({args.group}, {args.sparsity:.0%}): float32 and float64 masks agree on "
              f"{record['agreement']:.4%} of {total:,} weights; perplexity float64 {ppl['float64']:.3f}, float32 "
              f"{ppl['float32']:.3f} ({record['ppl_relative_difference']:+.2%}); client {seconds['float64']:.0f} s "
              f"vs {seconds['float32']:.0f} s")
    write("hessian_dtype", {
        "model": args.model, "calibration": {"dataset": "c4", "samples": args.samples, "seqlen": args.seqlen},
        "evaluation": {"dataset": "wikitext2", "windows": args.windows, "seqlen": args.seqlen},
        "threads": args.threads, "dense_ppl": dense, "methods": records,
    })


if __name__ == "__main__":
    main()
