"""`fedlib evaluate` on one CUDA device at the 7B shape: this checkout's fedlib against another
checkout's (``--baseline DIR``, e.g. a ``git worktree`` of the commit before a change), run
alternately on the same machine, the same checkpoint, mask and windows, written to
``benchmarks/results/gpu_evaluate.json``.

Each evaluation is its own process: its wall seconds, the seconds it reports itself (model open
included), the device's busy fraction over the process (``nvidia-smi``, as in :mod:`bench_gpu`)
and the perplexity, which must be the same on both sides (the same mask applied to the same
weights); the script fails otherwise.

    git worktree add /tmp/base <commit>
    HF_HUB_OFFLINE=1 python benchmarks/bench_gpu_evaluate.py --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_gpu import client, evaluate  # noqa: E402
from bench_scale import FEDLIB, FOLDERS, SCALE_DIR, SHAPES, build_checkpoint, calib_file  # noqa: E402
from common import write  # noqa: E402

REPORTED = re.compile(r"wrote .* in ([\d.]+)s")


def timed(side: str, command: list[str], folder: Path, windows: Path, mask: Path, args, out: Path) -> dict:
    """:func:`bench_gpu.evaluate` with ``command``, and the seconds the process reports itself."""
    row = evaluate(folder, windows, mask, args, command, f"evaluate ({side})", out)
    reported = REPORTED.search(row["stdout"])
    row.update(side=side, reported_seconds=float(reported.group(1)) if reported else None)
    print(f"  {side}: {row['reported_seconds']}s reported, ppl {row['ppl']}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="a checkout whose fedlib/ is the baseline")
    parser.add_argument("--baseline-label", default=None, help="what the baseline is (default: its folder)")
    parser.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--eval-windows", type=int, default=16)
    parser.add_argument("--eval-batch-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="the mask's client-mask --batch-size")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="baseline/this pairs")
    parser.add_argument("--source-commit", default=None, help="the commit measured (a copy without .git)")
    args = parser.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu_evaluate: no CUDA device here")
    args.device_index = (dev.index or 0) if dev.type == "cuda" else 0
    baseline = Path(args.baseline).resolve()
    if not (baseline / "fedlib" / "cli.py").is_file():
        sys.exit(f"bench_gpu_evaluate: {baseline} holds no fedlib/cli.py")
    sides = {
        "baseline": [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(baseline)!r}); "
                                           "from fedlib.cli import main; sys.exit(main())"],
        "this": FEDLIB,
    }

    shape = dict(SHAPES[args.shape])
    folder = SCALE_DIR / (FOLDERS[args.shape] + ("-drawn-on-device" if dev.type == "cuda" else ""))
    build_checkpoint(folder, shape, device="cuda" if dev.type == "cuda" else "cpu")
    rows = []
    with tempfile.TemporaryDirectory(dir=SCALE_DIR) as tmp:
        work = Path(tmp)
        calib = calib_file(work, 0, 2, args.seqlen, shape["vocab_size"])
        mask = work / "wanda.mask.safetensors"
        args.n_blocks = shape["num_hidden_layers"]
        client(folder, calib, mask, "wanda", args, "wanda mask", args.device, args.dtype)
        from fedlib.data import save_tokens

        windows = work / "windows.safetensors"
        gen = torch.Generator().manual_seed(7)
        save_tokens(windows, torch.randint(0, shape["vocab_size"], (args.eval_windows, args.seqlen), generator=gen),
                    dataset="wikitext2", total_windows=args.eval_windows)
        for repeat in range(args.repeats):
            for side, command in sides.items():
                rows.append(timed(side, command, folder, windows, mask, args, work / f"{side}-{repeat}.json")
                            | {"repeat": repeat})
    ppls = {row["ppl"] for row in rows}
    if len(ppls) != 1:
        sys.exit(f"bench_gpu_evaluate: the two sides disagree on the perplexity: {sorted(ppls)}")
    by_side = {side: [row["seconds"] for row in rows if row["side"] == side] for side in sides}
    ratio = min(by_side["baseline"]) / min(by_side["this"])
    print(f"  baseline / this (process seconds, best of {args.repeats}): {ratio:.2f}x")
    write("gpu_evaluate", {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
        "shape": args.shape, "compute_dtype": args.dtype, "windows": f"{args.eval_windows} x {args.seqlen}",
        "eval_batch_size": args.eval_batch_size, "threads": args.threads,
        "baseline": args.baseline_label or baseline.name, "rows": rows,
        "baseline_over_this": round(ratio, 2), "measured": time.strftime("%Y-%m-%d"),
        **({"commit": args.source_commit} if args.source_commit else {}),
        "note": "random weights: time only; the same mask and windows on both sides, perplexities equal",
    })


if __name__ == "__main__":
    main()
