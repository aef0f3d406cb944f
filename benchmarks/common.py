"""Shared helpers for the benchmark scripts (figures printed and written as JSON)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

OUT_DIR = Path(__file__).resolve().parent / "results"
DATA_DIR = Path(os.environ.get("FEDLIB_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
MODEL = os.environ.get("FEDLIB_BENCH_MODEL", "resources/models/smollm2-135m")


def load_bench_model():
    from fedlib.models import load_model

    spec = MODEL if Path(MODEL).is_dir() else "smollm2-135m"
    return load_model(spec)


def timed(func, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        seconds.append(time.perf_counter() - start)
    return seconds


def mask_agreement(reference: dict, other: dict) -> tuple[int, int]:
    """(weights whose keep/prune decision agrees, weights) between two {layer: mask} dicts."""
    total = sum(m.numel() for m in reference.values())
    agree = sum(int((reference[n] == other[n]).sum()) for n in reference)
    return agree, total


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "machine": platform.machine()}


def write(name: str, payload: dict) -> Path:
    """benchmarks/results/<name>.json with the machine and the commit of the code measured."""
    from fedlib.provenance import source_commit

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "commit": source_commit(), **payload}, indent=2) + "\n")
    print(f"wrote {path}")
    return path


median = statistics.median


def add_gpu_arguments(parser) -> None:
    """--source-commit, for the GPU benchmarks run from a copy of the checkout without .git."""
    parser.add_argument("--source-commit", default=None,
                        help="the commit measured, where the checkout has no .git (a copy on a GPU machine)")


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on the host), so that a timer sees it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_or_exit(device: str, script: str, try_args: str) -> torch.device:
    """``device`` as a torch device; exits with a hint where it names CUDA and there is none."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{script}: no CUDA device here (use {try_args} to try the script)")
    return dev
