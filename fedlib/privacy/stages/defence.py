"""Stage ``rr-aggregate``, the defence run: randomized response on every mask bit (client side,
ε per bit, :mod:`fedlib.privacy.defence`) as a hook on the FedPrLLM server's votes, which then
takes its top-k of the noisy counts; writes the global mask file whose perplexity the workflow
measures with ``fedlib evaluate``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedlib.groups import seeded_generator
from fedlib.maskfile import MaskFile
from fedlib.models import LayerInfo
from fedlib.privacy.defence import debias_counts, randomized_response, rr_flip_probability
from fedlib.server.fedprllm import FedPrLLM, VoteHook, global_mask_from_votes


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


class RandomizedResponseVotes(VoteHook):
    """Randomized response with per-bit ε as a hook on FedPrLLM's votes. ``per_client``: every
    client flips its bits literally (:func:`randomized_response`, seeded by client and layer);
    otherwise the server's noisy counts are sampled from their exact law
    (:func:`sample_rr_counts`, one uniform per weight: much faster, same distribution). The
    global file records the debiased counts, rounded and clipped to 0..m. It also measures what
    the defence did (:meth:`summary`), against the noise-free global mask of the same clients
    (``clean``: read from that file, else recomputed from the true counts)."""

    label = "+rr"

    def __init__(self, epsilon: float, n_clients: int, server: FedPrLLM, per_client: bool = False,
                 clean: MaskFile | None = None):
        self.epsilon, self.m, self.server, self.per_client, self.clean = epsilon, n_clients, server, per_client, clean
        self.exact = math.isinf(epsilon)
        self.randomizes_clients = per_client and not self.exact
        self.cdf = None if per_client or self.exact else rr_count_cdf(n_clients, epsilon)
        self.stats = {"bits": 0, "global_diff": 0, "abs_err": 0.0, "flips": 0, "client_bits": 0,
                      "zero_entries": 0, "zero_reports": 0, "full_entries": 0, "full_reports": 0,
                      "topk_debiased_equal": True}

    def client_mask(self, client_id: str, name: str, mask: torch.Tensor) -> torch.Tensor:
        gen = seeded_generator(self.server.seed, "rr", client_id, self.epsilon, name)
        noisy = randomized_response(mask, self.epsilon, generator=gen)
        self.stats["flips"] += int((noisy ^ mask).sum())
        self.stats["client_bits"] += mask.numel()
        return noisy

    def counts(self, info: LayerInfo, counts: torch.Tensor, n_clients: int) -> torch.Tensor:
        if self.exact:
            return counts.clone()
        if self.per_client:
            return counts  # already the sum of the noisy reports
        gen = seeded_generator(self.server.seed, "rr-counts", self.epsilon, info.name)
        return sample_rr_counts(counts, n_clients, self.epsilon, gen, self.cdf)

    def _debiased(self, observed: torch.Tensor) -> torch.Tensor:
        return observed.double() if self.exact else debias_counts(observed, self.m, self.epsilon)

    def recorded_votes(self, info: LayerInfo, observed: torch.Tensor, n_clients: int) -> torch.Tensor:
        return self._debiased(observed).round().clamp(0, n_clients).to(torch.int16)

    def finished(self, info: LayerInfo, true_counts: torch.Tensor, observed: torch.Tensor,
                 mask: torch.Tensor) -> None:
        s, m, server = self.stats, self.m, self.server
        if self.clean is not None:
            clean = self.clean.layer_mask(info.name)
        else:
            clean = global_mask_from_votes(true_counts, server.sparsity, server.group, server.seed, info.name)
        debiased = self._debiased(observed)
        if not self.exact and info.block == 0:
            # top-k on debiased counts equals top-k on the raw ones (an increasing affine map): checked on block 0
            again = global_mask_from_votes(debiased.float(), server.sparsity, server.group, server.seed, info.name)
            s["topk_debiased_equal"] &= bool(torch.equal(again, mask))
        zero, full = true_counts == 0, true_counts == m
        s["zero_entries"] += int(zero.sum())
        s["zero_reports"] += int(observed[zero].sum())
        s["full_entries"] += int(full.sum())
        s["full_reports"] += int((m - observed[full]).sum())
        s["bits"] += true_counts.numel()
        s["global_diff"] += int((mask ^ clean).sum())
        s["abs_err"] += float((debiased - true_counts.double()).abs().sum())

    def header_extra(self) -> dict[str, str]:
        return {"rr_epsilon_per_bit": repr(self.epsilon), "votes": "debiased counts, rounded and clipped"}

    def summary(self) -> dict:
        s = self.stats
        # measured flip rate: entries no client pruned report "pruned" only by a flip, and
        # entries every client pruned report "kept" only by a flip
        flip_rate_measured = (s["zero_reports"] + s["full_reports"]) / max(
            self.m * (s["zero_entries"] + s["full_entries"]), 1)
        return {
            "epsilon": self.epsilon, "flip_probability": rr_flip_probability(self.epsilon), "n_clients": self.m,
            "sampling": "per-client" if self.per_client else "exact count distribution",
            "bits_per_client": s["bits"],
            "flip_rate_measured": flip_rate_measured,
            "flip_rate_per_client": s["flips"] / s["client_bits"] if s["client_bits"] else None,
            "global_hamming_vs_clean": s["global_diff"] / s["bits"],
            "debiased_count_mae": s["abs_err"] / s["bits"],
            "topk_debiased_equal": s["topk_debiased_equal"],
            "unanimous_fraction": (s["zero_entries"] + s["full_entries"]) / s["bits"],
        }


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
    """The defence end to end: the FedPrLLM server with :class:`RandomizedResponseVotes` on its
    votes aggregates the client mask files into the global mask file ``out``.
    ``clean_global``: the noise-free FedPrLLM global mask file of the same clients (from
    ``fedlib aggregate``), read instead of recomputed for the distance to the noisy one."""
    from fedlib.maskcode import MagnitudeReference
    from fedlib.models import ModelHandle

    handle = ModelHandle.of(model)
    layers, fp = handle.layers(), handle.fingerprint()
    clean_file = None
    if clean_global is not None:
        clean_file = MaskFile(Path(clean_global), fp, layers)
        h = clean_file.header
        if (h.role, h.group, h.sparsity, h.seed, h.n_clients) != ("global", group, sparsity, seed, len(mask_paths)):
            raise ValueError(f"{clean_global}: a {h.role} mask ({h.group}, {h.sparsity}, seed {h.seed}, "
                             f"{h.n_clients} clients) is not the noise-free global mask of this aggregation")
    server = FedPrLLM(group=group, sparsity=sparsity, seed=seed)
    server.hook = hook = RandomizedResponseVotes(epsilon, len(mask_paths), server, per_client, clean_file)
    server.aggregate(mask_paths, fp, layers, Path(out), reference=MagnitudeReference.of_model(handle))
    return {"analysis": "defence", "model_fingerprint": fp, "group": group, "sparsity": sparsity, "seed": seed,
            **hook.summary(), "mask": str(out)}
