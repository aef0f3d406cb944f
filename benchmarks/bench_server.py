"""Mask file size (bits per weight) and server aggregation time / peak memory vs clients.

Client masks are valid 50 % row masks with the real model's layers and fingerprint (random
choice of pruned weights: the server's cost does not depend on which bits are set). Each
aggregation runs as its own `fedlib aggregate` process so its peak RSS is measured alone.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from common import MODEL, load_bench_model, write
from fedlib.groups import prune_lowest
from fedlib.jobsize import measured_run
from fedlib.maskfile import write_mask_file
from fedlib.models import fingerprint, prunable_layers


def make_clients(model, folder: Path, n: int) -> list[Path]:
    layers, print_ = prunable_layers(model), fingerprint(model)
    paths = []
    for client in range(n):
        gen = torch.Generator().manual_seed(client)
        masks = {info.name: prune_lowest(torch.rand(info.shape, generator=gen), 0.5, "row", client, info.name)
                 for info in layers}
        path = folder / f"client_{client}.mask.safetensors"
        write_mask_file(path, masks, layers, fingerprint=print_, role="client", client_id=str(client),
                        method="wanda", group="row", sparsity=0.5, n_samples=2, seed=0)
        paths.append(path)
    return paths


def aggregate(paths: list[Path], out: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one `fedlib aggregate` process (its own, not this one's)."""
    run = measured_run([sys.executable, "-m", "fedlib.cli", "aggregate", "--model", MODEL, "--server-group", "layer",
                        "--out", str(out), *map(str, paths)], stdout=subprocess.DEVNULL)
    if run.returncode != 0:
        raise RuntimeError(f"fedlib aggregate failed ({run.returncode})")
    return run.seconds, run.peak_rss_mib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 64])
    args = parser.parse_args()
    model, _ = load_bench_model()
    weights = sum(info.shape[0] * info.shape[1] for info in prunable_layers(model))
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = make_clients(model, folder, max(args.clients))
        bits = 8 * paths[0].stat().st_size / weights
        for n in sorted(args.clients):
            seconds, peak = aggregate(paths[:n], folder / f"global_{n}.mask.safetensors")
            rows[n] = {"seconds": seconds, "peak_rss_mib": peak}
            print(f"{n:3d} clients: aggregate {seconds:.1f}s, peak RSS {peak:.0f} MiB")
    small, large = min(rows), max(rows)
    result = {
        "weights": weights, "mask_file_bits_per_weight": bits, "aggregate": rows,
        "peak_ratio_large_over_small": rows[large]["peak_rss_mib"] / rows[small]["peak_rss_mib"],
        "time_ratio_large_over_small": rows[large]["seconds"] / rows[small]["seconds"],
    }
    print(f"mask file: {bits:.4f} bits per weight; peak RSS {large} vs {small} clients: "
          f"{result['peak_ratio_large_over_small']:.2f}x")
    write("server", result)


if __name__ == "__main__":
    main()
