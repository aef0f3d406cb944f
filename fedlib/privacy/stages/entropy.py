"""Stage ``entropy``: bits per entry of a client's mask (zero-order entropy of its density)
against the empirical entropy of the float16 bit patterns of the same weights, per layer, per
layer type and over the whole model (FedPrLLM App. C: 1.0 vs 13.75 bits for LLaMA-7B's block-0
``q_proj``), plus the per-entry entropy *across* the clients' masks (the data-dependent part of
a mask)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedlib.privacy.bits import layer_type, open_mask_files, popcount
from fedlib.privacy.entropy import bernoulli_entropy_bits, histogram_entropy_bits


def entropy_audit(model, mask_paths: Sequence[Path]) -> dict:
    """Per-layer entropies: the first client's mask (bits/entry from its density), the
    float16 bit patterns of the weights, and the per-entry entropy across all given client
    masks (mean over entries of H(fraction of clients pruning it); 0 = every client shares
    the same bit). Also the model-wide figures and the pooled fp16 histogram entropy."""
    from fedlib.models import ModelHandle

    handle = ModelHandle.of(model)
    layers = handle.layers()
    fp = handle.fingerprint()
    block_weights: dict = {}  # the current block's tensors, read once (a lazy model reads from disk)
    pooled = torch.zeros(65536, dtype=torch.int64)
    rows = []
    with open_mask_files(mask_paths, handle) as (files, packed):
        m = len(files)
        h_of_count = np.array([bernoulli_entropy_bits(c / m) for c in range(m + 1)])
        for info in layers:
            numel = math.prod(info.shape)
            first = packed(0, info.name)
            p = popcount(first) / numel
            if block_weights.get("index") != info.block:
                block_weights = {"index": info.block, "tensors": handle.block_tensors(info.block)}
            weight = block_weights["tensors"][f"{info.name.removeprefix(f'{handle.prefix}.{info.block}.')}.weight"]
            bits = weight.to("cpu", torch.float16).contiguous().view(torch.int16).to(torch.int32).flatten() & 0xFFFF
            hist = torch.bincount(bits, minlength=65536)
            pooled += hist
            ensemble = None
            if m >= 2:
                counts = np.zeros(numel, dtype=np.uint16)
                for i in range(m):
                    counts += np.unpackbits(packed(i, info.name), count=numel, bitorder="little")
                ensemble = float((np.bincount(counts, minlength=m + 1) * h_of_count).sum() / numel)
            rows.append({
                "name": info.name, "type": layer_type(info.name), "block": info.block, "numel": numel,
                "mask_density": p, "mask_bits": bernoulli_entropy_bits(p), "fp16_bits": histogram_entropy_bits(hist),
                "fp16_distinct": int((hist > 0).sum()), "ensemble_bits": ensemble,
            })
        packed_bytes = sum(Path(f.path).stat().st_size for f in files[:1])
        client_ids = [f.header.client_id for f in files]
        header = files[0].header
    total = sum(r["numel"] for r in rows)
    return {
        "analysis": "entropy",
        "model_fingerprint": fp,
        "mask_files": [str(p) for p in mask_paths],
        "client_ids": client_ids,
        "n_clients": len(client_ids),
        "method": header.method, "group": header.group, "sparsity": header.sparsity,
        "n_samples": header.n_samples,
        "layers": rows,
        "total_entries": total,
        "fp16_pooled_bits": histogram_entropy_bits(pooled),
        "fp16_pooled_distinct": int((pooled > 0).sum()),
        "file_bits_per_entry": 8 * packed_bytes / total,
    }
