"""Upload size of a client's mask file: format version 1 (packed bits) vs 2 (coded against the
public model's magnitude ranks, fedlib.maskcode), on the embedded model.

For each method and sparsity: one client's masks from C4 calibration windows (row groups, as
the workflow's clients), written in both versions through fedlib's writer and read back through
its strict reader (lossless: the decoded masks must equal the client's). Bits per weight are the
whole file's bytes (header included) over the prunable weights. Also reported, for comparison:
the ideal cost of the same context model (the empirical conditional entropy given the buckets)
and XOR with the reference's mask (each group's ``k`` smallest ``|w|``) compressed with lzma.
Goal: <= 0.35 bits per weight at 50 % Wanda.

Each run's records replace the same (method, sparsity, version) records of the JSON when its
settings (model size, calibration) are the same, so runs can be split over several processes
(``--runs``); each record names the commit it was measured at.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import lzma
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import DATA_DIR, OUT_DIR, load_bench_model, write
from fedlib.provenance import source_commit
from fedlib.client import Pruning, prune_locally
from fedlib.data import calibration_windows
from fedlib.maskcode import MagnitudeReference, group_view
from fedlib.maskfile import MaskFile, pack_bits, write_mask_file
from fedlib.methods import method_allocation
from fedlib.models import fingerprint, linear_by_name, prunable_layers

RUNS = [("wanda", 0.5), ("wanda", 0.6), ("wanda", 0.7), ("sparsegpt", 0.5), ("owl", 0.5), ("besa", 0.5)]


def conditional_entropy_bits(masks, reference, group) -> float:
    """Sum over layers of count * H(pruned | bucket): what an ideal coder of this context model pays."""
    total = 0.0
    for name, mask in masks.items():
        keys = reference.buckets(name, group).reshape(-1).numpy()
        bits = mask.reshape(-1).numpy()
        counts = np.bincount(keys)
        p = np.bincount(keys[bits], minlength=counts.size) / counts
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -(np.nan_to_num(p * np.log2(p)) + np.nan_to_num((1 - p) * np.log2(1 - p)))
        total += float((counts * h).sum())
    return total


def xor_lzma_bytes(masks, weight_of, group) -> int:
    """lzma of the XOR with the reference mask: in each group, the k smallest |w| (k = the group's count)."""
    chunks = []
    for name, mask in masks.items():
        scores = group_view(weight_of(name).detach().float().abs(), group)
        m = group_view(mask, group)
        ranks = torch.argsort(torch.argsort(scores, dim=1, stable=True), dim=1)
        reference = ranks < m.sum(1, keepdim=True)
        chunks.append(pack_bits(reference ^ m).numpy().tobytes())
    return len(lzma.compress(b"".join(chunks), preset=6))


def key(record: dict) -> tuple:
    return record["method"], record["sparsity"], record["format_version"], record["blocks"]


def save(settings: dict, records: list[dict]) -> None:
    """Merge ``records`` into the JSON (under a lock: other processes may be saving their runs)."""
    with open(Path(tempfile.gettempdir()) / "fedlib-bench-mask-compression.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = OUT_DIR / "mask_compression.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        mine = {key(r) for r in records}
        kept = [r for r in old.get("records", []) if key(r) not in mine
                and all(old.get(k) == v for k, v in settings.items())]
        order = {run: i for i, run in enumerate(RUNS)}
        merged = sorted(kept + records, key=lambda r: (-r["blocks"], order.get((r["method"], r["sparsity"]), len(order)),
                                                       r["format_version"]))
        write("mask_compression", {**settings, "records": merged})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--blocks", type=int, help="prune and code only the first BLOCKS blocks (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", nargs="*", help="method:sparsity pairs (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = [(r.split(":")[0], float(r.split(":")[1])) for r in args.runs] if args.runs else RUNS
    model, tokenizer = load_bench_model()
    ids = calibration_windows(tokenizer, "c4", DATA_DIR, args.samples, args.seqlen, 0, (0, 800))
    layers = prunable_layers(model)
    n_blocks = len({info.block for info in layers})
    blocks = n_blocks if args.blocks is None else args.blocks
    layers = [info for info in layers if info.block < blocks]
    total_weights = sum(info.shape[0] * info.shape[1] for info in layers)
    fp = fingerprint(model)
    weight_of = lambda name: linear_by_name(model, name).weight  # noqa: E731
    group = "row"
    # one reference for every run, as a client or server keeps it: its buckets are computed once
    start = time.perf_counter()
    reference = MagnitudeReference(weight_of)
    reference.digest([info.name for info in layers], group)
    reference_seconds = time.perf_counter() - start
    records, commit = [], source_commit()
    settings = {
        "model": "smollm2-135m", "model_blocks": n_blocks,
        "calibration": {"dataset": "c4", "docs": [0, 800], "samples": args.samples, "seqlen": args.seqlen},
        "reference": "magnitude (64 rank buckets per group)",
        "goal": "bits_per_weight <= 0.35 at 50 % Wanda (format_version 2)",
    }
    with tempfile.TemporaryDirectory() as tmp:
        for method, sparsity in runs:
            start = time.perf_counter()
            masks = prune_locally(model, ids, Pruning(method, sparsity, group, 0), blocks=blocks).masks
            prune_seconds = time.perf_counter() - start
            header = dict(fingerprint=fp, role="client", client_id="0", method=method, group=group,
                          sparsity=sparsity, allocation=method_allocation(method), n_samples=ids.shape[0], seed=0)
            row = {}
            for version in (1, 2):
                path = Path(tmp) / f"{method}-{sparsity}.v{version}.safetensors"
                start = time.perf_counter()
                write_mask_file(path, masks, layers, format_version=version,
                                reference=reference if version == 2 else None, **header)
                encode = time.perf_counter() - start
                start = time.perf_counter()
                reader = MaskFile(path, fp, layers, whole_model=blocks == n_blocks, reference=reference)
                decoded = {info.name: reader.layer_mask(info.name) for info in layers}
                decode = time.perf_counter() - start
                if any(not torch.equal(decoded[name], mask) for name, mask in masks.items()):
                    raise SystemExit(f"{method} {sparsity}: version {version} did not decode to the client's masks")
                size = path.stat().st_size
                record = {"format_version": version, "method": method, "sparsity": sparsity, "group": group,
                          "blocks": blocks, "weights": total_weights,
                          "bits_per_weight": size * 8 / total_weights, "file_bytes": size,
                          "encode_seconds": encode, "decode_seconds": decode}
                if version == 2:
                    record["reference_seconds"] = reference_seconds
                    record["ideal_context_bits_per_weight"] = (
                        conditional_entropy_bits(masks, reference, group) / total_weights)
                    if (method, sparsity) == ("wanda", 0.5):  # two full sorts: for the goal's run only
                        record["xor_lzma_bits_per_weight"] = (
                            xor_lzma_bytes(masks, weight_of, group) * 8 / total_weights)
                record["prune_seconds"] = prune_seconds
                record["commit"] = commit
                records.append(record)
                row[version] = record
            two = row[2]
            xor = f", xor+lzma {two['xor_lzma_bits_per_weight']:.3f}" if "xor_lzma_bits_per_weight" in two else ""
            print(f"{method:10} {sparsity:.1f} blocks {blocks}  v1 {row[1]['bits_per_weight']:.3f}  "
                  f"v2 {two['bits_per_weight']:.3f} (ideal {two['ideal_context_bits_per_weight']:.3f}{xor}) "
                  f"bits/weight; v2 encode {two['encode_seconds']:.1f}s decode {two['decode_seconds']:.1f}s", flush=True)
            save(settings, records)  # after every run: a long run's finished parts are kept


if __name__ == "__main__":
    main()
