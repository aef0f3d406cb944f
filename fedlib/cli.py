"""`fedlib` command line: the verbs of the federated pruning protocol and the workflow's steps.

Practitioners: each site runs ``fedlib client-mask`` on its own data and sends the mask
file; the coordinator runs ``fedlib aggregate`` and ``fedlib export``. The workflow calls
the same verbs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fedlib import __version__


def _threads(args) -> None:
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def _write_json(path: Path, payload: dict) -> None:
    from fedlib.io import write_text_atomic

    write_text_atomic(Path(path), json.dumps(payload, indent=2, sort_keys=True) + "\n")


def _data_dir(value: str | None) -> Path | None:
    return None if value in (None, "", "hub") else Path(value)


# --------------------------------------------------------------------------- verbs


def cmd_materialize_model(args) -> None:
    from fedlib.models import materialize

    out = materialize(args.model, Path(args.out))
    print(f"wrote {out}")


def cmd_calibration_pool(args) -> None:
    from fedlib.data import calibration_windows, save_tokens
    from fedlib.models import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    ids = calibration_windows(
        tokenizer, args.dataset, _data_dir(args.data_dir), args.nsamples, args.seqlen,
        args.seed, tuple(args.docs) if args.docs else None,
    )
    save_tokens(Path(args.out), ids, dataset=args.dataset, seed=args.seed,
                docs=args.docs, data_dir=str(args.data_dir))
    print(f"wrote {args.out}: {tuple(ids.shape)} tokens from {args.dataset}")


def cmd_client_data(args) -> None:
    from fedlib.data import iid_partition, load_tokens, save_tokens

    ids, meta = load_tokens(Path(args.pool))
    if args.partition != "iid":
        raise SystemExit(f"unknown partition {args.partition!r}; known: iid")
    parts = iid_partition(ids.shape[0], args.n_clients, args.seed)
    if not 0 <= args.client < args.n_clients:
        raise SystemExit(f"--client must be in 0..{args.n_clients - 1}, got {args.client}")
    rows = parts[args.client]
    save_tokens(Path(args.out), ids[rows], pool=str(args.pool), rows=rows,
                client=args.client, n_clients=args.n_clients, partition=args.partition, **meta)
    print(f"wrote {args.out}: client {args.client} has samples {rows}")


def cmd_client_mask(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.maskfile import write_mask_file
    from fedlib.methods import method_allocation
    from fedlib.models import fingerprint, load_model, prunable_layers
    from fedlib.recursion import prune_locally

    _threads(args)
    start = time.perf_counter()
    model, _ = load_model(args.model)
    ids = None
    if args.calib:
        ids, _ = load_tokens(Path(args.calib))
    result = prune_locally(model, ids, args.method, args.sparsity, args.group, args.seed,
                           batch_size=args.batch_size)
    write_mask_file(
        Path(args.out), result.masks, prunable_layers(model),
        fingerprint=fingerprint(model), role="client", client_id=args.client_id,
        method=args.method, group=args.group, sparsity=args.sparsity,
        allocation=method_allocation(args.method),
        n_samples=0 if ids is None else ids.shape[0], seed=args.seed,
    )
    print(f"wrote {args.out} ({args.method}, {args.group}, {args.sparsity}) "
          f"in {time.perf_counter() - start:.1f}s")


def cmd_aggregate(args) -> None:
    from fedlib.models import fingerprint, load_model, prunable_layers
    from fedlib.server import STRATEGIES

    model, _ = load_model(args.model)
    strategy = STRATEGIES[args.strategy](group=args.group, sparsity=args.sparsity, seed=args.seed)
    summary = strategy.aggregate([Path(p) for p in args.masks], fingerprint(model),
                                 prunable_layers(model), Path(args.out))
    print(f"wrote {args.out}: {summary}")


def cmd_eval_windows(args) -> None:
    from fedlib.data import C4_HELDOUT_NOTE, evaluation_windows, save_tokens
    from fedlib.models import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    data_dir = _data_dir(args.data_dir)
    c4_docs = tuple(args.c4_docs) if args.c4_docs else None
    windows, total = evaluation_windows(tokenizer, args.dataset, data_dir, args.seqlen,
                                        args.windows, c4_docs)
    note = C4_HELDOUT_NOTE if args.dataset == "c4" and data_dir is not None else ""
    save_tokens(Path(args.out), windows, dataset=args.dataset, total_windows=total,
                c4_docs=args.c4_docs, note=note, data_dir=str(args.data_dir))
    print(f"wrote {args.out}: {windows.shape[0]} of {total} windows of {args.seqlen} tokens")


def cmd_evaluate(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.evaluate.perplexity import perplexity
    from fedlib.models import fingerprint, load_model
    from fedlib.pruned import apply_mask_file, measured_sparsity

    _threads(args)
    start = time.perf_counter()
    model, _ = load_model(args.model)
    base_fingerprint = fingerprint(model)
    applied = None
    if args.mask:
        applied = apply_mask_file(model, Path(args.mask), scale=args.scale, model_fingerprint=base_fingerprint)
    results = {}
    for path in args.windows:
        ids, meta = load_tokens(Path(path))
        row = perplexity(model, ids, batch_size=args.batch_size)
        row.update(total_windows=meta.get("total_windows"), seqlen=int(ids.shape[1]), note=meta.get("note", ""))
        results[meta["dataset"]] = row
        print(f"{args.label} {meta['dataset']}: ppl {row['ppl']:.3f} on {row['windows']} windows")
    _write_json(Path(args.out), {
        "label": args.label, "mask": args.mask, "model_fingerprint": base_fingerprint, "scale": bool(args.scale), "applied": applied,
        "measured_sparsity": measured_sparsity(model), "perplexity": results,
        "seconds": time.perf_counter() - start,
    })


def cmd_export(args) -> None:
    from fedlib.models import load_model
    from fedlib.pruned import apply_mask_file

    model, tokenizer = load_model(args.model)
    applied = apply_mask_file(model, Path(args.mask), scale=args.scale)
    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _write_json(out / "fedlib_export.json", {"base_model": args.model, "mask": args.mask, **applied})
    print(f"wrote {out}")


def cmd_inspect(args) -> None:
    from fedlib.maskfile import read_header

    header = read_header(Path(args.mask))
    print(json.dumps({
        "role": header.role, "client_id": header.client_id, "method": header.method,
        "group": header.group, "sparsity": header.sparsity, "allocation": header.allocation,
        "n_samples": header.n_samples, "n_clients": header.n_clients, "seed": header.seed,
        "model_fingerprint": header.fingerprint, "layers": len(header.layers),
        "weights": header.total_weights, "pruned": header.total_pruned,
        "bits_per_weight": 8 * Path(args.mask).stat().st_size / header.total_weights,
    }, indent=2))


def cmd_report(args) -> None:
    from fedlib.report import write_perplexity_table

    write_perplexity_table(json.loads(args.spec), Path(args.out_md), Path(args.out_csv))


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedlib", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fedlib {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def verb(name, func, help_text):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = verb("materialize-model", cmd_materialize_model,
             "convert a model (e.g. the embedded alias smollm2-135m) to a float32 safetensors folder")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)

    p = verb("calibration-pool", cmd_calibration_pool, "sample calibration token windows (seeded)")
    p.add_argument("--model", required=True, help="model folder (for its tokenizer)")
    p.add_argument("--dataset", default="c4", choices=["c4", "wikitext2", "ptb"])
    p.add_argument("--data-dir", default=None, help="offline mirror folder; omit for the hub")
    p.add_argument("--nsamples", type=int, required=True)
    p.add_argument("--seqlen", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs", type=int, nargs=2, metavar=("START", "STOP"), help="C4 documents to draw from")
    p.add_argument("--out", required=True)

    p = verb("client-data", cmd_client_data, "one client's share of a calibration pool")
    p.add_argument("--pool", required=True)
    p.add_argument("--n-clients", type=int, required=True)
    p.add_argument("--client", type=int, required=True)
    p.add_argument("--partition", default="iid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)

    p = verb("client-mask", cmd_client_mask, "compute this client's pruning mask file on its private data")
    p.add_argument("--model", required=True)
    p.add_argument("--calib", help="token file of this client's calibration samples")
    p.add_argument("--method", default="wanda")
    p.add_argument("--sparsity", type=float, default=0.5)
    p.add_argument("--group", default="row", help="local comparison group: layer, row, column or N:M")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client-id", default="0")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)

    p = verb("aggregate", cmd_aggregate, "server: aggregate client mask files into the global mask")
    p.add_argument("--model", required=True)
    p.add_argument("--strategy", default="fedprllm", choices=["fedprllm"])
    p.add_argument("--group", default="layer", help="server comparison group: layer, row, column or N:M")
    p.add_argument("--sparsity", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("masks", nargs="+")

    p = verb("eval-windows", cmd_eval_windows, "tokenize an evaluation set into non-overlapping windows")
    p.add_argument("--model", required=True)
    p.add_argument("--dataset", required=True, choices=["wikitext2", "c4", "ptb"])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--windows", type=int, default=None, help="evenly spaced subset; all when omitted")
    p.add_argument("--c4-docs", type=int, nargs=2, metavar=("START", "STOP"))
    p.add_argument("--out", required=True)

    p = verb("evaluate", cmd_evaluate, "perplexity of the base model, optionally with a mask applied")
    p.add_argument("--model", required=True)
    p.add_argument("--mask")
    p.add_argument("--scale", action="store_true", help="scale survivors by (m - votes)/m")
    p.add_argument("--windows", nargs="+", required=True, help="token files from eval-windows")
    p.add_argument("--label", default="model")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)

    p = verb("export", cmd_export, "write a normal Hugging Face checkpoint with the mask applied")
    p.add_argument("--model", required=True)
    p.add_argument("--mask", required=True)
    p.add_argument("--scale", action="store_true")
    p.add_argument("--out", required=True)

    p = verb("inspect", cmd_inspect, "print a mask file's header (checked)")
    p.add_argument("mask")

    p = verb("report", cmd_report, "write a perplexity table (Markdown + CSV) from evaluation results")
    p.add_argument("--spec", required=True, help="JSON: title, context, columns, rows -> result files")
    p.add_argument("--out-md", required=True)
    p.add_argument("--out-csv", required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from fedlib.data import DataError
    from fedlib.maskfile import MaskFileError

    try:
        args.func(args)
    except (MaskFileError, DataError, FileNotFoundError, ValueError) as err:
        print(f"fedlib {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
