"""Time to draw the noise of one real DP release (fedlib.dp.samplers) on the embedded model's linears.

One client's share of the distributed mechanism's release at ε = 8 (4 clients, δ = 1e-5, every
block input of every block, per channel): exact discrete Gaussian draws (CKS 2020, integer
arithmetic) from the OS's cryptographic generator, the same from a seeded generator (the
simulations'), and the continuous normalised mechanism's float draws for comparison. Prints and
writes benchmarks/results/dp_noise.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from common import load_bench_model, write
from fedlib.dp.distributed import DistributedTarget
from fedlib.dp.gaussian import input_key
from fedlib.dp.samplers import NoiseSource
from fedlib.models import prunable_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--epsilon", type=float, default=8.0)
    args = parser.parse_args()
    model, _ = load_bench_model()
    layers = prunable_layers(model)
    dims = {}
    for info in layers:
        dims.setdefault(input_key(info.name), int(info.shape[1]))  # a linear reads in_features channels
    guarantee = DistributedTarget(args.epsilon, 1e-5, 2.0, 0, args.clients).guarantee([i.name for i in layers], "x")
    coordinates = sum(dims.values())
    rows = {}
    for name, source in (("secret", NoiseSource()), ("seeded", NoiseSource(0))):
        start = time.perf_counter()
        draws = [source.discrete_gaussian(guarantee.client_std(dim), dim, key) for key, dim in dims.items()]
        seconds = time.perf_counter() - start
        spread = float(np.std(np.concatenate(draws)) / np.mean([guarantee.client_std(d) for d in dims.values()]))
        rows[f"discrete_{name}"] = {"seconds": seconds, "us_per_draw": 1e6 * seconds / coordinates,
                                    "std_over_target": spread}
        print(f"discrete Gaussian, {name}: {seconds:.2f} s for {coordinates} coordinates "
              f"({1e6 * seconds / coordinates:.1f} us per draw; sample std / target {spread:.4f})")
    start = time.perf_counter()
    for key, dim in dims.items():
        NoiseSource().normal((dim,), key)
    seconds = time.perf_counter() - start
    rows["normal_secret"] = {"seconds": seconds, "us_per_draw": 1e6 * seconds / coordinates}
    print(f"continuous normal, secret: {seconds:.4f} s")
    path = write("dp_noise", {"model_layers": len(layers), "release_inputs": len(dims), "coordinates": coordinates,
                              "clients": args.clients, "epsilon": args.epsilon, "sigma": guarantee.sigma,
                              "client_std_steps": guarantee.client_std(max(dims.values())), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
