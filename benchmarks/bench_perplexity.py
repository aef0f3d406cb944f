"""Perplexity evaluation (`fedlib evaluate`'s path) vs a bare forward of the same windows.

Both score the same WikiText-2 test windows in the same batches with the same threads; the
bare forward is ``model(input_ids).logits`` under ``torch.inference_mode`` and nothing else
(no loss), so it is the hardware's rate for this model. fedlib's path is
:func:`fedlib.evaluate.perplexity.perplexities` (block-by-block BlockRunner walk, logits by the
model's own head, cross-entropy). Interleaved repeats; medians. Goal: fedlib >= 0.9x the bare
forward's tokens/s. The perplexity of the bare forward's logits is printed next to fedlib's, as
a check that both did the same work.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from common import DATA_DIR, MODEL, median, timed, write
from fedlib.data import evaluation_windows
from fedlib.evaluate.perplexity import perplexities
from fedlib.models import load_model, open_model


def bare_forward(model, windows: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(input_ids=batch.long()).logits for batch in windows.split(batch_size, dim=0)]


def reference_ppl(windows: torch.Tensor, logits: list[torch.Tensor], batch_size: int) -> float:
    nll, tokens = 0.0, 0
    for batch, out in zip(windows.long().split(batch_size, dim=0), logits):
        labels = batch[:, 1:].reshape(-1)
        nll += float(F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]).double(), labels, reduction="sum"))
        tokens += labels.numel()
    return math.exp(nll / tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--windows", type=int, default=4, help="evenly spaced WikiText-2 test windows")
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]  # other jobs on the machine: both paths are timed under the same load
    spec = MODEL if Path(MODEL).is_dir() else "smollm2-135m"
    handle = open_model(spec)  # as `fedlib evaluate` opens it (blocks on the meta device until reached)
    model, tokenizer = load_model(spec)  # the same weights, whole in memory, for the bare forward
    windows, total = evaluation_windows(tokenizer, "wikitext2", DATA_DIR, args.seqlen, args.windows)
    tokens = windows.numel()
    records = []
    for batch_size in args.batch_sizes:
        fedlib_s, in_memory_s, bare_s = [], [], []
        for _ in range(args.repeats):  # interleaved, so drifting machine load hits all alike
            fedlib_s += timed(lambda: perplexities(handle, [windows], batch_size), 1)
            in_memory_s += timed(lambda: perplexities(model, [windows], batch_size), 1)
            bare_s += timed(lambda: bare_forward(model, windows, batch_size), 1)
        ppl = perplexities(handle, [windows], batch_size)[0][0]["ppl"]
        ppl_in_memory = perplexities(model, [windows], batch_size)[0][0]["ppl"]
        ref = reference_ppl(windows, bare_forward(model, windows, batch_size), batch_size)
        record = {
            "batch_size": batch_size, "fedlib_seconds": fedlib_s, "fedlib_in_memory_seconds": in_memory_s,
            "bare_seconds": bare_s, "fedlib_tokens_per_s": tokens / median(fedlib_s),
            "fedlib_in_memory_tokens_per_s": tokens / median(in_memory_s), "bare_tokens_per_s": tokens / median(bare_s),
            "ratio": median(bare_s) / median(fedlib_s), "ratio_in_memory": median(bare_s) / median(in_memory_s),
            "fedlib_ppl": ppl, "fedlib_in_memory_ppl": ppl_in_memory, "bare_forward_ppl_float64_loss": ref,
        }
        records.append(record)
        print(f"batch {batch_size}: fedlib {record['fedlib_tokens_per_s']:.0f} tok/s ({record['ratio']:.3f}x), in memory "
              f"{record['fedlib_in_memory_tokens_per_s']:.0f} tok/s ({record['ratio_in_memory']:.3f}x), bare forward "
              f"{record['bare_tokens_per_s']:.0f} tok/s; ppl {ppl:.6f} / {ppl_in_memory:.6f} vs {ref:.6f}")
    write("perplexity", {
        "dataset": "wikitext2", "windows": args.windows, "total_windows": total, "seqlen": args.seqlen,
        "tokens": tokens, "threads": args.threads, "model": spec,
        "load_average_before_after": [load_before, os.getloadavg()[0]], "repeats": args.repeats, "goal": ">= 0.9",
        "records": records,
    })


if __name__ == "__main__":
    main()
