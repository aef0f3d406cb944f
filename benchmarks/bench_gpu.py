"""GPU clients at the hardware's rate: `fedlib client-mask` and `fedlib evaluate` on a LLaMA-2-7B-shaped
checkpoint on one CUDA device (`make bench-gpu`), written to ``benchmarks/results/gpu.json``.

The checkpoint is :mod:`bench_scale`'s (the real LLaMA-2-7B config, random bfloat16 weights) with the
weights drawn on the device (seconds instead of minutes; a device's random stream differs from the CPU's,
so the build record says where they were drawn). Random weights measure time and memory only.

Each run is its own process (``fedlib.jobsize.measured_run``: its own wall time and peak host RSS);
the client prints its seconds per block after the model is open, the time to open it and the device's
peak allocated memory. While a process runs, ``nvidia-smi`` samples the device's utilisation (the
fraction of each 0.5 s in which a kernel ran): the *busy* figure is their mean over the client's block
loop (the last ``blocks x seconds per block`` of its run).

Runs: processes that only start (Python; torch with a CUDA context; transformers' LLaMA; fedlib's
client modules): the floor under a client's time to open. Wanda and SparseGPT with its update at 2 x 2048 tokens (a FedPrLLM client) and 128 x 2048
(the papers' calibration set), perplexity of 16 x 2048 windows with the Wanda 128 x 2048 mask
applied, and block 0's masks on the host (float32) and on the device (float32) from the same
2 x 2048 tokens: how many weights the two devices decide differently (float sums in another order
flip near-ties; the selection itself gives the same mask for the same scores on every device).

Nothing here imports snakemake, lm-eval, constriction, dp-accounting or cryptography: a stock GPU image
(torch, transformers, safetensors, numpy, scipy) runs it.

    HF_HUB_OFFLINE=1 python benchmarks/bench_gpu.py                  # one H100: ~15 min with the build
    HF_HUB_OFFLINE=1 python benchmarks/bench_gpu.py --shape tiny --device cpu --no-write   # the script itself
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

# a GPU image runs this from a plain checkout (fedlib not installed): the repository is on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_scale import FEDLIB, FOLDERS, SCALE_DIR, SHAPES, build_checkpoint, calib_file, run_measured  # noqa: E402
from common import add_gpu_arguments, cuda_or_exit, synchronize, write  # noqa: E402

#: the issues' goals on one H100 at the 7B shape in bfloat16 (seconds after the model is open, but
#: the FedPrLLM client's whole process: from its start to the mask file)
GOALS = {
    "wanda 128x2048 seconds": 14.0,
    "wanda 2x2048 seconds": 10.0,
    "wanda 2x2048 process seconds": 8.0,
    "sparsegpt_update 128x2048 seconds": 90.0,
    "busy fraction during wanda 128x2048": 0.60,
    # the client keeps every sample's block input and output on the device when they fit a quarter
    # of its free memory (fedlib.runner.BlockRunner): those are part of the design, not overhead
    "device peak over one block + stored activations + a batch's (GiB)": 2.0,
}
SUMMARY = re.compile(r"in ([\d.]+)s \(([\d.]+)s per block, opened in ([\d.]+)s(?:, device peak ([\d.]+) GiB)?\)")


class UtilisationSampler:
    """``nvidia-smi`` utilisation samples (time, percent) of one device while the context runs;
    none where there is no ``nvidia-smi`` (a CPU run of this script)."""

    def __init__(self, index: int):
        self.index, self.samples, self.proc = index, [], None

    def __enter__(self) -> "UtilisationSampler":
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", str(self.index), "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "500"], stdout=subprocess.PIPE, text=True)
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.samples.append((time.perf_counter(), int(line)))

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def busy(self, start: float, stop: float) -> float | None:
        inside = [percent for t, percent in self.samples if start <= t <= stop]
        return round(sum(inside) / len(inside) / 100, 3) if inside else None


def run_with_samples(argv: list[str], label: str, device_index: int) -> tuple[dict, UtilisationSampler, float]:
    with UtilisationSampler(device_index) as sampler:
        row = run_measured(argv, label)
        end = time.perf_counter()
    return row, sampler, end


def client(folder: Path, calib: Path, out: Path, method: str, args, label: str, device: str, dtype: str,
           extra: list[str] = ()) -> dict:
    argv = FEDLIB + ["client-mask", "--model", str(folder), "--calib", str(calib), "--method", method,
                     "--sparsity", "0.5", "--local-group", "row", "--device", device, "--dtype", dtype,
                     "--batch-size", str(args.batch_size), "--threads", str(args.threads),
                     "--client-id", label.replace(" ", "-"), "--out", str(out), *extra]
    row, sampler, end = run_with_samples(argv, label, args.device_index)
    found = SUMMARY.search(row["stdout"])
    if found is None:
        raise RuntimeError(f"{label}: no summary line in {row['stdout']!r}")
    total, per_block, opened, peak = found.groups()
    blocks = 1 if "--round" in extra else args.n_blocks
    loop = float(per_block) * blocks
    row.update(label=label, method=method, device=device, dtype=dtype, seconds_per_block=float(per_block),
               seconds_after_open=round(loop, 2), seconds_to_open=float(opened),
               device_peak_gib=float(peak) if peak else None, busy_fraction=sampler.busy(end - loop, end))
    print(f"  {label}: {row['seconds_after_open']:.1f}s after open ({row['seconds_per_block']:.2f}s per block, "
          f"opened in {opened}s), busy {row['busy_fraction']}, device peak {row['device_peak_gib']} GiB, "
          f"host peak {row['peak_rss_mib']:.0f} MiB")
    return row


def evaluate(folder: Path, windows: Path, mask: Path, args, command: list[str] = FEDLIB, label: str = "evaluate",
             out: Path | None = None) -> dict:
    """``fedlib evaluate`` (``command``: this checkout's, or another's) in its own process."""
    out = out or windows.with_suffix(".json")
    argv = command + ["evaluate", "--model", str(folder), "--mask", str(mask), "--windows", str(windows),
                      "--label", "bench", "--batch-size", str(args.eval_batch_size), "--threads", str(args.threads),
                      "--device", args.device, "--dtype", args.dtype, "--out", str(out)]
    row, sampler, end = run_with_samples(argv, label, args.device_index)
    result = json.loads(out.read_text())
    row.update(windows=args.eval_windows, seqlen=args.seqlen, ppl=result["perplexity"]["wikitext2"]["ppl"],
               busy_fraction=sampler.busy(end - row["seconds"], end))
    print(f"  {label} {args.eval_windows} x {args.seqlen}: {row['seconds']:.1f}s (process), "
          f"busy {row['busy_fraction']}")
    return row


def block0_agreement(folder: Path, calib: Path, work: Path, args) -> dict:
    """Block 0's Wanda masks from the same tokens on the host and on the device, both float32."""
    from fedlib.maskfile import MaskFile
    from fedlib.models import open_model

    files = {}
    for side, device in (("host", "cpu"), ("device", args.device)):
        files[side] = work / f"block0-{side}.mask.safetensors"
        client(folder, calib, files[side], "wanda", args, f"block0-{side}", device, "float32", ["--round", "0"])
    handle = open_model(str(folder), weights=False)
    layers = [info for info in handle.layers() if info.block == 0]
    host, dev = (MaskFile(files[side], handle.fingerprint(), layers, whole_model=False).masks()
                 for side in ("host", "device"))
    differ = sum(int((host[n] != dev[n]).sum()) for n in host)
    total = sum(m.numel() for m in host.values())
    print(f"  block 0, host vs {args.device} (float32): {differ} of {total} weights decided differently")
    return {"weights": total, "differ": differ, "fraction": differ / total, "dtype": "float32",
            "tokens": f"{args.small} x {args.seqlen}"}


def obs_solve(shape: dict, args) -> dict:
    """SparseGPT's OBS update of one block's linears (q/k/v/o of hidden x hidden, gate/up of
    intermediate x hidden, down of hidden x intermediate), ``solve="column"`` (the reference's
    column loop) against ``"block"`` (batched triangular solves), side by side on the device, in
    the update's default float64: random weights, a Hessian from random correlated tokens, "row"
    groups at 50 %. Same masks and weights up to rounding is what the CPU tests prove; this records
    both here."""
    from fedlib.methods.sparsegpt import damped_hessian, inverse_cholesky_upper, obs_prune

    dev, gen = torch.device(args.device), torch.Generator(device=args.device).manual_seed(0)
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    linears = [("q/k/v/o", 4, hidden, hidden), ("gate/up", 2, inter, hidden), ("down", 1, hidden, inter)]
    out = {"dtype": "float64", "group": "row", "sparsity": 0.5, "layers": {}}
    for solve in ("column", "block"):  # the first calls pay the device's library set-up: not timed
        small = torch.eye(256, device=dev, dtype=torch.float64)
        obs_prune(small[:64], small, sparsity=0.5, group="row", solve=solve)
    totals = {"column": 0.0, "block": 0.0}
    for label, copies, rows, cols in linears:
        x = torch.randn(2 * cols, cols, device=dev, dtype=torch.float64, generator=gen)
        x = x @ (torch.eye(cols, device=dev, dtype=torch.float64)
                 + 0.5 * torch.randn(cols, cols, device=dev, dtype=torch.float64, generator=gen) / cols**0.5)
        upper = inverse_cholesky_upper(damped_hessian(2.0 / x.shape[0] * x.T @ x, 0.01)[0], label)
        weight = torch.randn(rows, cols, device=dev, dtype=torch.float64, generator=gen)
        results, seconds = {}, {}
        for solve in ("column", "block"):
            synchronize(dev)
            t0 = time.perf_counter()
            results[solve] = obs_prune(weight, upper, sparsity=0.5, group="row", name=label, solve=solve)
            synchronize(dev)
            seconds[solve] = time.perf_counter() - t0
            totals[solve] += copies * seconds[solve]
        (wc, mc, lc), (wb, mb, lb) = results["column"], results["block"]
        out["layers"][label] = {
            "shape": [rows, cols], "per_block": copies, "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "masks_differ": int((mc != mb).sum()), "weights": mc.numel(),
            "max_weight_difference": float((wc - wb).abs().max()), "loss": {"column": lc, "block": lb}}
        print(f"  OBS update {label} {rows}x{cols}: column {seconds['column']:.2f}s, block {seconds['block']:.2f}s, "
              f"{out['layers'][label]['masks_differ']} mask entries differ")
    out["seconds_per_block"] = {k: round(v, 2) for k, v in totals.items()}
    out["speedup"] = round(totals["column"] / totals["block"], 2)
    print(f"  OBS update of one block: column {totals['column']:.2f}s, block {totals['block']:.2f}s "
          f"({out['speedup']}x)")
    return out


#: what a client process pays before it opens the model: each step's code runs after the steps before it
STARTUP = (
    ("python", "pass"),
    ("import torch, CUDA context", "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"),
    ("and transformers' LLaMA", "import transformers.models.llama.modeling_llama"),
    ("and fedlib's client", "import fedlib.cli, fedlib.uploads, fedlib.runner, fedlib.models"),
)


def startup(repeats: int = 2) -> dict:
    """Wall seconds of processes that only start (:data:`STARTUP`): the floor under a client's time
    to open (fastest of ``repeats``; the first run of a step also pays cold file caches)."""
    out, code = {}, []
    for label, step in STARTUP:
        code.append(step)
        seconds = [run_measured([sys.executable, "-c", "; ".join(code)], label)["seconds"] for _ in range(repeats)]
        out[label] = {"seconds": seconds, "fastest": min(seconds)}
        print(f"  start-up, {label}: {min(seconds):.2f}s (of {seconds})")
    return out


def block_bytes(folder: Path) -> int:
    from fedlib.checkpoint import Checkpoint

    return sum(t.nbytes for name, t in Checkpoint(folder).tensors.items() if name.startswith("model.layers.0."))


def goals(runs: dict, block: int, activation_bytes: int, stored_bytes: int, args) -> dict:
    big, small = f"{args.large}x{args.seqlen}", f"{args.small}x{args.seqlen}"
    measured = {
        "wanda 128x2048 seconds": runs.get(f"wanda {big}", {}).get("seconds_after_open"),
        "wanda 2x2048 seconds": runs.get(f"wanda {small}", {}).get("seconds_after_open"),
        "wanda 2x2048 process seconds": runs.get(f"wanda {small}", {}).get("seconds"),
        "sparsegpt_update 128x2048 seconds": runs.get(f"sparsegpt_update {big}", {}).get("seconds_after_open"),
        "busy fraction during wanda 128x2048": runs.get(f"wanda {big}", {}).get("busy_fraction"),
    }
    peak = runs.get(f"wanda {big}", {}).get("device_peak_gib")
    measured["device peak over one block + stored activations + a batch's (GiB)"] = (
        None if peak is None else round(peak - (block + stored_bytes + activation_bytes) / 2**30, 2))
    out = {}
    for name, goal in GOALS.items():
        value = measured[name]
        met = None if value is None else (value >= goal if name.startswith("busy") else value <= goal)
        out[name] = {"goal": goal, "measured": value, "met": met}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N (or cpu: to try the script itself)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--small", type=int, default=2, help="samples of the FedPrLLM-sized client")
    parser.add_argument("--large", type=int, default=128, help="samples of the papers' calibration set")
    parser.add_argument("--methods", nargs="+", default=["wanda", "sparsegpt_update"])
    parser.add_argument("--batch-size", type=int, default=8, help="client-mask --batch-size")
    parser.add_argument("--eval-windows", type=int, default=16)
    parser.add_argument("--eval-batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="host threads per process")
    parser.add_argument("--skip-agreement", action="store_true", help="no host-vs-device block-0 masks")
    parser.add_argument("--sparsegpt-options", default=None,
                        help='client-mask --method-options of the SparseGPT runs, e.g. \'{"batch_gram": "tensor-cores"}\'')
    parser.add_argument("--name", default="gpu", help="write benchmarks/results/NAME.json")
    parser.add_argument("--no-write", action="store_true", help="print only")
    add_gpu_arguments(parser)
    args = parser.parse_args()
    dev = cuda_or_exit(args.device, "bench_gpu", "--device cpu --shape tiny")
    args.device_index = (dev.index or 0) if dev.type == "cuda" else 0

    shape = dict(SHAPES[args.shape])
    args.n_blocks = shape["num_hidden_layers"]
    folder = SCALE_DIR / (FOLDERS[args.shape] + ("-drawn-on-device" if dev.type == "cuda" else ""))
    start = time.perf_counter()
    build = build_checkpoint(folder, shape, device="cuda" if dev.type == "cuda" else "cpu")
    build_seconds = time.perf_counter() - start
    size = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    # a batch's activations: the block input, its MLP's widest intermediate, and the output kept
    width = 2 * shape["hidden_size"] + 2 * shape["intermediate_size"]
    activation_bytes = args.batch_size * args.seqlen * width * size
    # every sample's block input and output of the large run, kept on the device between blocks
    stored_bytes = 2 * args.large * args.seqlen * shape["hidden_size"] * size
    block = block_bytes(folder)
    runs = {}
    record = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "shape": args.shape, "stored_dtype": "bfloat16", "compute_dtype": args.dtype,
        "seqlen": args.seqlen, "batch_size": args.batch_size, "threads": args.threads,
        "block_bytes": block, "activation_bytes_per_batch": activation_bytes, "stored_activation_bytes": stored_bytes,
        "build": {"seconds_this_run": round(build_seconds, 1), "drawn_on": build.get("device", "cpu"),
                  "bytes": build["bytes"]},
        "sparsegpt_options": json.loads(args.sparsegpt_options or "{}"),
        "runs": runs, "startup": None, "evaluate": None, "block0_host_vs_device": None, "obs_solve": None,
        "note": "random weights: time and memory only; busy = mean nvidia-smi utilization.gpu over the block loop",
        **({"commit": args.source_commit} if args.source_commit else {}),
    }

    def save(complete: bool) -> None:
        # written after every stage, so a run stopped at a device's time limit keeps what it measured
        record.update(goals=goals(runs, block, activation_bytes, stored_bytes, args), complete=complete)
        if not args.no_write:
            write(args.name, record)

    with tempfile.TemporaryDirectory(dir=SCALE_DIR) as tmp:
        work = Path(tmp)
        calib = {}
        for n in (args.small, args.large):
            (work / str(n)).mkdir()
            calib[n] = calib_file(work / str(n), 0, n, args.seqlen, shape["vocab_size"])
        # cheapest first: the start-up floor, the OBS solves side by side, Wanda, its evaluation and
        # the host check come before SparseGPT's long runs
        if dev.type == "cuda":
            os.sync()  # the checkpoint just written is on disk: its write-back would slow the imports timed
            record["startup"] = startup()
            save(False)
        if any(m.startswith("sparsegpt") for m in args.methods):
            record["obs_solve"] = obs_solve(shape, args)
            save(False)
        for method in args.methods:
            for n in (args.small, args.large):
                key = f"{method} {n}x{args.seqlen}"
                options = (["--method-options", args.sparsegpt_options]
                           if method.startswith("sparsegpt") and args.sparsegpt_options else [])
                runs[key] = client(folder, calib[n], work / f"{method}-{n}.mask.safetensors", method, args, key,
                                   args.device, args.dtype, options)
                save(False)
            mask = work / f"wanda-{args.large}.mask.safetensors"
            if method == "wanda" and mask.is_file():
                from fedlib.data import save_tokens

                windows = work / "windows.safetensors"
                gen = torch.Generator().manual_seed(7)
                save_tokens(windows, torch.randint(0, shape["vocab_size"], (args.eval_windows, args.seqlen),
                                                   generator=gen), dataset="wikitext2", total_windows=args.eval_windows)
                record["evaluate"] = evaluate(folder, windows, mask, args)
                if not args.skip_agreement:
                    record["block0_host_vs_device"] = block0_agreement(folder, calib[args.small], work, args)
                save(False)
    for name, row in record["goals"].items():
        print(f"  goal {name}: {row['measured']} (goal {row['goal']}): "
              f"{'met' if row['met'] else 'NOT met' if row['met'] is False else 'not measured'}")
    save(True)


if __name__ == "__main__":
    main()
