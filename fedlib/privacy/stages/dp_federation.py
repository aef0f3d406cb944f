"""A simulated DP federation (``fedlib privacy dp-federation``): every client's normalised DP
mask file and the distributed mechanism's mask, for several mechanisms and ε, from one pass of
the clients' data through the public mask's prefix (:func:`fedlib.dp.public.federation_pass`).

Each file is what the protocol produces: a client's file is the one ``fedlib client-mask
--dp-mechanism normalised`` writes with the same noise seed (a test checks it bit for bit), with
its guarantee in ``x_dp``; the distributed mask is the Wanda mask of the SecAgg sum (client_id
``secagg``, ``n_samples`` the federation's), its guarantee against the server in ``x_dp``. The noise
seeds are the study's stand-ins for the clients' secrets, derived from ``noise_seed``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from fedlib.client import Pruning
from fedlib.dp.accountant import DISTRIBUTED
from fedlib.dp.distributed import DistributedTarget
from fedlib.dp.public import (
    NORMALISED,
    THRESHOLD,
    NormalisedTarget,
    Release,
    _seed_of,
    federation_pass,
    tokens_digest,
)

SECAGG_ID = "secagg"


def release_target(spec: Mapping, clients: int):
    """A release spec {"label", "mechanism", "epsilon", "delta", "clip", "basis", "estimator"
    (threshold when absent)} as its target."""
    mechanism = spec["mechanism"]
    common = (float(spec["epsilon"]), float(spec["delta"]), float(spec["clip"]), int(spec.get("basis", 0)))
    if not math.isfinite(common[0]):
        # a file without noise would carry a guarantee the reader refuses (x_dp is strict JSON)
        raise ValueError(f"release {spec.get('label')!r}: epsilon must be finite, got {spec['epsilon']!r} (a mask "
                         f"without DP is client-mask's plain Wanda)")
    estimator = spec.get("estimator", THRESHOLD)
    if mechanism == NORMALISED:
        return NormalisedTarget(*common, estimator)
    if mechanism == DISTRIBUTED:
        return DistributedTarget(*common, clients, estimator=estimator)
    raise ValueError(f"release {spec.get('label')!r}: unknown mechanism {mechanism!r}; known: {NORMALISED}, {DISTRIBUTED}")


def mask_paths(out_dir: Path, spec: Mapping, clients: int) -> list[Path]:
    """The files a release writes: one per client (normalised) or the secure sum's (distributed)."""
    folder = Path(out_dir) / spec["label"]
    if spec["mechanism"] == DISTRIBUTED:
        return [folder / f"{SECAGG_ID}.mask.safetensors"]
    return [folder / f"client_{c}.mask.safetensors" for c in range(clients)]


def simulate(handle, public_ids: torch.Tensor, clients_ids: Sequence[torch.Tensor], specs: Sequence[Mapping],
             out_dir: Path, pruning: Pruning, noise_seed: int) -> dict:
    """Write every release's mask files (:func:`mask_paths`), Wanda masks as ``pruning`` says;
    returns a record of the guarantees and the pass's time."""
    from fedlib.maskfile import MaskWriter
    from fedlib.methods import method_allocation

    layers = handle.layers()
    names = [info.name for info in layers]
    public = tokens_digest(public_ids)
    fingerprint = handle.fingerprint()
    record = {"public": public, "clients": len(clients_ids), "samples": [int(c.shape[0]) for c in clients_ids],
              "releases": {}}
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        releases = []
        for spec in specs:
            target = release_target(spec, len(clients_ids))
            guarantee = target.guarantee(names, public)
            shared = target.mechanism == DISTRIBUTED
            paths = mask_paths(out_dir, spec, len(clients_ids))
            writers = []
            for c, path in enumerate(paths):
                path.parent.mkdir(parents=True, exist_ok=True)
                n = sum(int(ids.shape[0]) for ids in clients_ids) if shared else int(clients_ids[c].shape[0])
                writers.append(stack.enter_context(MaskWriter(
                    path, layers, fingerprint=fingerprint, role="client", client_id=SECAGG_ID if shared else str(c),
                    method="wanda", group=pruning.group, sparsity=pruning.sparsity,
                    allocation=method_allocation("wanda"), n_samples=n, seed=pruning.seed, extra={"dp": guarantee.header()})))

            def sink(client, _block, decision, writers=writers):
                writer = writers[0 if client is None else client]
                for name, mask in decision.masks.items():
                    writer.add(name, mask)

            seeds = [_seed_of(noise_seed, spec["label"], c) for c in range(len(clients_ids))]
            releases.append(Release(spec["label"], guarantee, seeds, sink, shared=shared,
                                    secagg_seed=_seed_of(noise_seed, spec["label"], "secagg")))
            record["releases"][spec["label"]] = {"guarantee": guarantee.header(), "files": [str(p) for p in paths]}
        federation_pass(handle, public_ids, clients_ids, pruning, releases)
    record["seconds"] = time.perf_counter() - start
    return record
