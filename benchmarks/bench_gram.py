"""What SparseGPT's Gram sums cost per 7B block, by precision (``benchmarks/results/gram.json``).

A SparseGPT client adds ``x^T x`` for every calibration batch to one Gram matrix per distinct
layer input (:class:`fedlib.methods.sparsegpt.InputGram`): at the LLaMA-2-7B shape three of width
4096 (attention, ``o_proj``, MLP inputs) and one of 11008 (``down_proj``). This times those four
sums over the papers' calibration set (128 x 2048 tokens, batches of 8 x 2048) from bfloat16
activations, as the client holds them, in

* ``float64``: the default (bfloat16 products are exact in float64 and their sums barely round,
  so the result does not depend on how the set was cut into batches);
* ``float32``: ``dtype="float32"`` (float32 matrix products, TF32 off as torch's default);
* ``bf16-products``: ``batch_gram="tensor-cores"`` (CUDA only): each batch's ``x^T x`` from the
  bfloat16 activations on the tensor cores with float32 output, added to the float64 sum;

and reports each one's largest relative difference from float64 on the diagonal. Random
activations: time only. Nothing but torch is needed (a stock GPU image runs it):

    python benchmarks/bench_gram.py                        # a CUDA device
    python benchmarks/bench_gram.py --device cpu --scale 16 --no-write   # the script itself
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import add_gpu_arguments, cuda_or_exit, synchronize, write  # noqa: E402

from fedlib.methods.sparsegpt import InputGram  # noqa: E402

#: the LLaMA-2-7B block's distinct linear inputs (width, how many)
INPUTS = [(4096, 3), (11008, 1)]
#: variant -> InputGram's (dtype, batch_gram); the last needs CUDA
VARIANTS = {"float64": (torch.float64, "exact"), "float32": (torch.float32, "exact"),
            "bf16-products": (torch.float64, "tensor-cores")}


def block_sums(variant: str, batches: list[torch.Tensor], widths: list[int]) -> list[InputGram]:
    grams = [InputGram(*VARIANTS[variant]) for _ in widths]
    for batch in batches:
        for gram, width in zip(grams, widths):
            gram.add(batch[..., :width])
    return grams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--scale", type=int, default=1, help="divide the widths (a quick CPU try)")
    parser.add_argument("--no-write", action="store_true")
    add_gpu_arguments(parser)
    args = parser.parse_args()
    dev = cuda_or_exit(args.device, "bench_gram", "--device cpu --scale 16")
    widths = [w // args.scale for w, copies in INPUTS for _ in range(copies)]
    gen = torch.Generator(device=dev).manual_seed(0)
    n_batches = args.samples // args.batch_size
    # one batch reused: the sums cost the same whatever the values
    batch = torch.randn(args.batch_size, args.seqlen, max(widths), device=dev, generator=gen).to(torch.bfloat16)
    batches = [batch] * n_batches

    # the tensor cores' variant has no CPU kernel (torch's mm with out_dtype)
    variants = [v for v in VARIANTS if dev.type == "cuda" or VARIANTS[v][1] == "exact"]
    block_sums("float32", batches[:1], widths)  # the device's library set-up, not timed
    unavailable = None
    if "bf16-products" in variants:
        try:
            block_sums("bf16-products", batches[:1], widths)
        except (RuntimeError, TypeError) as err:  # a torch without mm's out_dtype
            unavailable = f"bf16-products: {err}"
            variants.remove("bf16-products")
    seconds, grams = {}, {}
    for name in variants:
        synchronize(dev)
        start = time.perf_counter()
        grams[name] = block_sums(name, batches, widths)
        synchronize(dev)
        seconds[name] = round(time.perf_counter() - start, 3)
    ref = [g.xxt.diagonal() for g in grams["float64"]]
    differ = {name: float(max(((g.xxt.diagonal().double() - r).abs() / r.abs()).max() for g, r in zip(gs, ref)))
              for name, gs in grams.items()}
    tokens = n_batches * args.batch_size * args.seqlen
    flops = sum(2 * tokens * w * w for w in widths)
    record = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "widths": widths, "tokens": tokens, "batch_tokens": args.batch_size * args.seqlen,
        "tflop_per_block": round(flops / 1e12, 1), "seconds_per_block": seconds,
        "tflops": {k: round(flops / v / 1e12, 1) for k, v in seconds.items()},
        "max_relative_diagonal_difference_from_float64": differ,
        "note": "random bfloat16 activations: time only" + (f"; {unavailable}" if unavailable else ""),
        **({"commit": args.source_commit} if args.source_commit else {}),
    }
    for name in seconds:
        print(f"  Gram sums of one block, {name}: {seconds[name]:.2f} s ({record['tflops'][name]} TFLOP/s), "
              f"diagonal within {differ[name]:.1e} of float64")
    if not args.no_write:
        write("gram", record)


if __name__ == "__main__":
    main()
