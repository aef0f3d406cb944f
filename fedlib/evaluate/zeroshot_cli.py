"""``fedlib zeroshot``: zero-shot accuracy of one variant, written as a JSON result file.

A variant is the base model plus a mask file (optionally with weight scaling from the
vote counts), a FedSpaLLM weight file, or nothing (Dense) -- exactly what
``fedlib evaluate`` scores for perplexity.  The mask is applied in memory and the
tasks are scored by :func:`fedlib.evaluate.zeroshot.evaluate_zeroshot` (lm-eval,
offline on ``<data-dir>/zeroshot/<task>.jsonl``, or the hub with ``--data-dir hub``).

The JSON holds, besides the accuracies, everything a report header needs: the tasks
in the order given, the per-task document limit and how many documents each task's
split has (offline), the base model's fingerprint and the measured sparsity.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from fedlib.cli_args import add_placement_arguments, add_threads_argument, input_file, parse_data_dir, set_threads

HELP = "zero-shot accuracy (lm-eval) of the base model, optionally with a mask or weight file applied"


def _limit(value: str) -> int | None:
    if value.lower() in ("none", "null", "all", "full"):
        return None
    limit = int(value)
    if limit < 1:
        raise argparse.ArgumentTypeError(f"--limit must be a positive number of documents or 'none', got {value}")
    return limit


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fedlib.evaluate.zeroshot import ZEROSHOT_TASKS

    p.add_argument("--model", required=True, help="the public base model (folder, embedded alias or hub id)")
    p.add_argument("--mask", type=input_file, help="a client or global mask file to apply")
    p.add_argument("--scale", action="store_true", help="scale survivors by (m - votes)/m (global masks)")
    p.add_argument("--weights", type=input_file, help="a FedSpaLLM weight file (global or a client's) to load instead of a mask")
    p.add_argument("--tasks", nargs="+", default=list(ZEROSHOT_TASKS), choices=list(ZEROSHOT_TASKS),
                   metavar="TASK", help=f"zero-shot tasks, in table order (default: all of {', '.join(ZEROSHOT_TASKS)})")
    p.add_argument("--data-dir", default=None,
                   help="offline mirror holding zeroshot/<task>.jsonl; 'hub' or omitted = lm-eval's stock tasks")
    p.add_argument("--limit", type=_limit, default=None,
                   help="score the first N documents of each task; 'none' (default) = the full split")
    p.add_argument("--batch-size", type=int, default=8, help="documents per forward pass")
    add_threads_argument(p)
    add_placement_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="lm-eval's seed")
    p.add_argument("--label", default="model", help="the variant's name in the result")
    p.add_argument("--log-samples", metavar="PATH",
                   help="also write lm-eval's per-document records (JSONL, one line per document) to PATH")
    p.add_argument("--out", required=True, help="the JSON result to write")


def split_sizes(tasks, data_dir: Path | None) -> dict[str, int | None]:
    """Documents in each task's scored split (offline: rows of the local file; hub: unknown)."""
    from fedlib.evaluate.zeroshot import task_file

    sizes: dict[str, int | None] = {}
    for task in tasks:
        if data_dir is None:
            sizes[task] = None
            continue
        with open(task_file(data_dir, task), encoding="utf-8") as fh:
            sizes[task] = sum(1 for line in fh if line.strip())
    return sizes


def _clean(value):
    """JSON has no NaN: an undefined standard error (n < 2) is written as null."""
    return None if isinstance(value, float) and math.isnan(value) else value


def zeroshot_variant(model_dir: str, tasks, data_dir: Path | None, limit: int | None = None,
                     mask: str | None = None, scale: bool = False, weights: str | None = None,
                     batch_size: int = 8, seed: int = 0, label: str = "model",
                     device: str = "cpu", dtype: str = "float32") -> tuple[dict, str]:
    """Put the base model on the device with the variant applied, score the tasks; the result
    record and lm-eval's per-document records (JSONL text, :func:`sample_lines`).

    Each task's table metric is ``acc_norm`` where lm-eval defines it, else ``acc``
    (:func:`table_metric`); ``mean_acc`` is their unweighted mean over the tasks."""
    from fedlib.evaluate.zeroshot import run_harness, sample_lines, summarize, table_metric
    from fedlib.models import load_tokenizer, open_model
    from fedlib.pruned import PrunedModel, measured_sparsity
    from fedlib.runner import Placement, place_model

    tasks = list(tasks)
    sizes = split_sizes(tasks, data_dir)  # fails on a missing task file before any model work
    placement = Placement.resolve(device, dtype)
    handle = open_model(model_dir, placement.dtype)
    variant = PrunedModel(handle, mask, scale, weights, device=placement.device)
    base_fingerprint = handle.fingerprint()
    model = place_model(handle, placement, variant.decision)
    raw, names = run_harness(model, load_tokenizer(model_dir), tasks, data_dir=data_dir, limit=limit,
                             batch_size=batch_size, seed=seed, log_samples=True)
    scores = summarize(raw, names)
    results = {}
    for task in tasks:
        row = {key: _clean(value) for key, value in scores[task].items()}
        row["total"] = sizes[task]
        results[task] = row
    metrics = {t: table_metric(t) for t in tasks}
    mean = sum(results[t][metrics[t]] for t in tasks) / len(tasks)
    return {
        "label": label, "mask": mask, "weights": weights, "scale": bool(scale), "applied": variant.summary(),
        "model_fingerprint": base_fingerprint, "measured_sparsity": measured_sparsity(model),
        "tasks": tasks, "limit": limit, "metrics": metrics, "seed": seed, "batch_size": batch_size,
        "data_dir": str(data_dir) if data_dir is not None else "hub",
        "device": str(placement.device), "dtype": dtype,
        "zeroshot": results, "mean_acc": mean,
    }, sample_lines(raw, names)


def run(args) -> None:
    """The ``fedlib zeroshot`` verb."""
    from fedlib.io import write_text_atomic

    set_threads(args)
    start = time.perf_counter()
    record, samples = zeroshot_variant(args.model, args.tasks, parse_data_dir(args.data_dir), args.limit,
                                       mask=args.mask, scale=args.scale, weights=args.weights,
                                       batch_size=args.batch_size, seed=args.seed, label=args.label,
                                       device=args.device, dtype=args.dtype)
    for task in record["tasks"]:
        row = record["zeroshot"][task]
        metric = record["metrics"][task]
        print(f"{args.label} {task}: {metric} {row[metric]:.4f} on {row['n']} documents")
    print(f"{args.label} mean {record['mean_acc']:.4f} in {time.perf_counter() - start:.1f}s")
    if args.log_samples:
        write_text_atomic(Path(args.log_samples), samples)
    write_text_atomic(Path(args.out), json.dumps(record, indent=2, sort_keys=True) + "\n")
