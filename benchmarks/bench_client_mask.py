"""Client Wanda mask time vs its floor, measured side by side in one run.

Floor: two dense passes of the same tokens through the decoder blocks (what any layer-wise
method must do at least: statistics, then propagation). Goal: Wanda <= 1.3x the floor.
"""

from __future__ import annotations

import argparse

import torch

from common import DATA_DIR, load_bench_model, median, timed, write
from fedlib.data import calibration_windows
from fedlib.client import Pruning, prune_locally
from fedlib.runner import BlockRunner


def two_dense_passes(model, ids, batch_size):
    for _ in range(2):
        runner = BlockRunner(model, [ids], batch_size=batch_size)
        for step in runner.steps():
            step.propagate(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_bench_model()
    ids = calibration_windows(tokenizer, "c4", DATA_DIR, args.samples, args.seqlen, 0, (0, 800))
    batch = args.samples
    floor, wanda = [], []
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
        floor += timed(lambda: two_dense_passes(model, ids, batch), 1)
        wanda += timed(lambda: prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0, batch_size=batch)), 1)
    result = {
        "tokens": args.samples * args.seqlen,
        "floor_seconds": floor, "wanda_seconds": wanda,
        "floor_median": median(floor), "wanda_median": median(wanda),
        "wanda_over_floor": median(wanda) / median(floor),
        "goal": "<= 1.3",
    }
    print(f"floor (2 dense passes) {median(floor):.2f}s, Wanda client mask {median(wanda):.2f}s, "
          f"ratio {result['wanda_over_floor']:.2f}x")
    write("client_mask", result)


if __name__ == "__main__":
    main()
