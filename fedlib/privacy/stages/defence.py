"""Stage ``rr-aggregate``, the defence run: randomized response on every mask bit (client side,
ε per bit, :mod:`fedlib.privacy.defence`), the FedPrLLM server's top-k on the noisy vote counts;
writes the global mask file whose perplexity the workflow measures with ``fedlib evaluate``."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedlib.privacy.bits import open_mask_files


def rr_count_cdf(n_clients: int, epsilon: float) -> torch.Tensor:
    """(m+1, m+1) table: row C is the CDF over the observed count of Bin(C, p) + Bin(m-C, q),
    the number of "pruned" reports among m clients applying randomized response (keep
    probability p, flip probability q) to a weight that C of them truly pruned."""
    from scipy import stats

    from fedlib.privacy.defence import rr_keep_probability

    p = rr_keep_probability(epsilon)
    m = n_clients
    table = np.zeros((m + 1, m + 1))
    k = np.arange(m + 1)
    for c in range(m + 1):
        a = stats.binom.pmf(k[: c + 1], c, p)
        b = stats.binom.pmf(k[: m - c + 1], m - c, 1 - p)
        table[c] = np.convolve(a, b)
    return torch.from_numpy(np.cumsum(table, axis=1))


def sample_rr_counts(true_counts: torch.Tensor, n_clients: int, epsilon: float,
                     generator: torch.Generator, cdf: torch.Tensor | None = None) -> torch.Tensor:
    """Vote counts the server observes when each of ``n_clients`` clients applies randomized
    response (per-bit ε) to its mask, given the true counts: one uniform per weight and the
    exact CDF (:func:`rr_count_cdf`). Same distribution as summing
    :func:`fedlib.privacy.defence.randomized_response` over the clients' masks (the flips are
    independent across clients and weights), at a cost independent of the number of clients."""
    cdf = rr_count_cdf(n_clients, epsilon) if cdf is None else cdf
    u = torch.rand(true_counts.shape, generator=generator, dtype=torch.float64).numpy().reshape(-1)
    c = true_counts.to(torch.int64).numpy().reshape(-1)
    # observed = #{k < m : u > CDF_c(k)}: per true count c (entries sorted by c), a search of
    # u in that row of the CDF
    order = np.argsort(c.astype(np.uint8 if n_clients <= 255 else np.int16), kind="stable")  # radix sort
    table = cdf.numpy()
    observed = np.empty(c.size, dtype=np.int16)
    start = 0
    for value, n in enumerate(np.bincount(c, minlength=n_clients + 1)):
        if n:
            rows = order[start : start + n]
            observed[rows] = np.searchsorted(table[value][:-1], u[rows], side="left")
            start += n
    return torch.from_numpy(observed).reshape(true_counts.shape)


def rr_aggregate(
    model,
    mask_paths: Sequence[Path],
    epsilon: float,
    group: str,
    sparsity: float,
    seed: int,
    out: Path,
    per_client: bool = False,
    clean_global: Path | None = None,
) -> dict:
    """The defence end to end: every client applies randomized response with per-bit ε to
    its mask (``per_client``: literally, with :func:`randomized_response`; default: the
    server's noisy counts sampled exactly, :func:`sample_rr_counts`), the FedPrLLM server
    takes the top-k of the noisy counts per comparison group and writes the global mask
    file. Its ``votes:`` tensors hold the debiased counts (rounded, clipped to 0..m), so
    weight scaling (``--scale``) would use debiased counts; top-k on debiased counts equals
    top-k on raw counts (an increasing affine map), which is checked here on block 0.
    ``clean_global``: the noise-free FedPrLLM global mask file of the same clients (from
    ``fedlib aggregate``), read instead of recomputed for the distance to the noisy one."""
    from fedlib.groups import seeded_generator
    from fedlib.maskfile import write_mask_file
    from fedlib.models import fingerprint, prunable_layers
    from fedlib.privacy.defence import debias_counts, randomized_response, rr_flip_probability
    from fedlib.server.fedprllm import global_mask_from_votes

    layers = prunable_layers(model)
    fp = fingerprint(model)
    q = rr_flip_probability(epsilon)
    t0 = time.perf_counter()
    global_masks, votes = {}, {}
    stats = {"bits": 0, "global_diff": 0, "abs_err": 0.0, "flips": 0, "client_bits": 0,
             "zero_entries": 0, "zero_reports": 0, "full_entries": 0, "full_reports": 0,
             "topk_debiased_equal": True}
    clean_file = None
    if clean_global is not None:
        from fedlib.maskfile import MaskFile

        clean_file = MaskFile(Path(clean_global), fp, layers)
        h = clean_file.header
        if (h.role, h.group, h.sparsity, h.seed, h.n_clients) != ("global", group, sparsity, seed, len(mask_paths)):
            raise ValueError(f"{clean_global}: a {h.role} mask ({h.group}, {h.sparsity}, seed {h.seed}, "
                             f"{h.n_clients} clients) is not the noise-free global mask of this aggregation")
    with open_mask_files(mask_paths, fp, layers) as (files, packed):
        m = len(files)
        cdf = None if per_client or math.isinf(epsilon) else rr_count_cdf(m, epsilon)
        for info in layers:
            numel = math.prod(info.shape)
            # one client's bits at a time: memory does not grow with the number of clients
            total = np.zeros(numel, dtype=np.int16)
            noisy_total = torch.zeros(info.shape, dtype=torch.int16) if per_client else None
            for i in range(m):
                b = np.unpackbits(packed(i, info.name), count=numel, bitorder="little")
                total += b
                if per_client and not math.isinf(epsilon):
                    clean = torch.from_numpy(b.astype(bool)).reshape(info.shape)
                    gen = seeded_generator(seed, "rr", files[i].header.client_id, epsilon, info.name)
                    noisy = randomized_response(clean, epsilon, generator=gen)
                    stats["flips"] += int((noisy ^ clean).sum())
                    stats["client_bits"] += numel
                    noisy_total += noisy.to(torch.int16)
            true = torch.from_numpy(total).reshape(info.shape)
            if math.isinf(epsilon):
                observed = true.clone()
            elif per_client:
                observed = noisy_total
            else:
                gen = seeded_generator(seed, "rr-counts", epsilon, info.name)
                observed = sample_rr_counts(true, m, epsilon, gen, cdf)
            glob = global_mask_from_votes(observed, sparsity, group, seed, info.name)
            if clean_file is not None:
                clean_glob = clean_file.layer_mask(info.name)
            else:
                clean_glob = global_mask_from_votes(true, sparsity, group, seed, info.name)
            if math.isinf(epsilon):
                debiased = true.double()
            else:
                debiased = debias_counts(observed, m, epsilon)
                if info.block == 0:  # the invariance, checked exactly on block 0
                    again = global_mask_from_votes(debiased.float(), sparsity, group, seed, info.name)
                    stats["topk_debiased_equal"] &= bool(torch.equal(again, glob))
            zero, full = true == 0, true == m
            stats["zero_entries"] += int(zero.sum())
            stats["zero_reports"] += int(observed[zero].sum())
            stats["full_entries"] += int(full.sum())
            stats["full_reports"] += int((m - observed[full]).sum())
            stats["bits"] += numel
            stats["global_diff"] += int((glob ^ clean_glob).sum())
            stats["abs_err"] += float((debiased - true.double()).abs().sum())
            global_masks[info.name] = glob
            votes[info.name] = debiased.round().clamp(0, m).to(torch.int16)
        header = files[0].header
        n_samples = sum(f.header.n_samples for f in files)
    write_mask_file(
        Path(out), global_masks, layers, fingerprint=fp, role="global", client_id="server",
        method=f"fedprllm[{header.method}]+rr", group=group, sparsity=sparsity, n_samples=n_samples,
        seed=seed, n_clients=m, votes=votes,
        extra={"rr_epsilon_per_bit": repr(epsilon), "votes": "debiased counts, rounded and clipped"},
    )
    # measured flip rate: entries no client pruned report "pruned" only by a flip, and
    # entries every client pruned report "kept" only by a flip
    flip_rate_measured = (stats["zero_reports"] + stats["full_reports"]) / max(
        m * (stats["zero_entries"] + stats["full_entries"]), 1)
    return {
        "analysis": "defence", "model_fingerprint": fp, "epsilon": epsilon, "flip_probability": q,
        "n_clients": m, "group": group, "sparsity": sparsity, "seed": seed,
        "sampling": "per-client" if per_client else "exact count distribution",
        "bits_per_client": stats["bits"],
        "flip_rate_measured": flip_rate_measured,
        "flip_rate_per_client": stats["flips"] / stats["client_bits"] if stats["client_bits"] else None,
        "global_hamming_vs_clean": stats["global_diff"] / stats["bits"],
        "debiased_count_mae": stats["abs_err"] / stats["bits"],
        "topk_debiased_equal": stats["topk_debiased_equal"],
        "unanimous_fraction": (stats["zero_entries"] + stats["full_entries"]) / stats["bits"],
        "mask": str(out), "seconds": time.perf_counter() - t0,
    }
