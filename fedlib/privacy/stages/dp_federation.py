"""A simulated DP federation (``fedlib privacy dp-federation``): every client's normalised DP
mask file and the distributed mechanism's mask, for several mechanisms and ε, from one pass of
the clients' data through the public mask's prefix (:func:`fedlib.dp.public.federation_pass`).

Each file is what the protocol produces: a client's file is the one ``fedlib client-mask
--dp-mechanism normalised`` writes with the same noise (a test checks it bit for bit), with
its guarantee in ``x_dp``; the distributed mask is the Wanda mask of the SecAgg sum (client_id
``secagg``, ``n_samples`` the federation's), its guarantee against the server in ``x_dp``.

One noisy release per (mechanism, ε, δ, clip, basis, unit): release specs that differ only in
their estimator read the same noisy sums (post-processing, one ε), and their files carry the
same ``x_dp_release`` digest. The pass's ledger (:class:`fedlib.dp.ledger.Ledger`) records
each noisy release once. The noise is seeded by ``noise_seed`` (a simulation: ``noise:
seeded``, not private) or, without one, drawn from the OS's cryptographic generator.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from fedlib.client import Pruning
from fedlib.dp.accountant import DISTRIBUTED
from fedlib.dp.distributed import DistributedTarget
from fedlib.dp.ledger import Ledger
from fedlib.dp.public import (
    NORMALISED,
    THRESHOLD,
    NormalisedTarget,
    Release,
    federation_pass,
    release_digest,
    tokens_digest,
)
from fedlib.dp.samplers import NoiseSource
from fedlib.dp.unit import CLIENT, ProtectedUnit

SECAGG_ID = "secagg"


def release_target(spec: Mapping, clients: int, unit: ProtectedUnit = ProtectedUnit()):
    """A release spec {"label", "mechanism", "epsilon", "delta", "clip", "basis", "estimator"
    (threshold when absent), "unit" (``client``: each client's contribution clipped once; absent:
    ``unit``, the windows' own)} as its target."""
    mechanism = spec["mechanism"]
    common = (float(spec["epsilon"]), float(spec["delta"]), float(spec["clip"]), int(spec.get("basis", 0)))
    if not math.isfinite(common[0]):
        # a file without noise would carry a guarantee the reader refuses (x_dp is strict JSON)
        raise ValueError(f"release {spec.get('label')!r}: epsilon must be finite, got {spec['epsilon']!r} (a mask "
                         f"without DP is client-mask's plain Wanda)")
    if spec.get("unit", CLIENT) != CLIENT:
        raise ValueError(f"release {spec.get('label')!r}: unit {spec['unit']!r}; a release names only 'client' (the "
                         f"windows' unit comes from the clients' token files)")
    unit = ProtectedUnit(CLIENT) if "unit" in spec else unit
    estimator = spec.get("estimator", THRESHOLD)
    if mechanism == NORMALISED:
        return NormalisedTarget(*common, estimator, unit)
    if mechanism == DISTRIBUTED:
        return DistributedTarget(*common, clients, estimator=estimator, unit=unit)
    raise ValueError(f"release {spec.get('label')!r}: unknown mechanism {mechanism!r}; known: {NORMALISED}, "
                     f"{DISTRIBUTED}")


def mask_paths(out_dir: Path, spec: Mapping, clients: int) -> list[Path]:
    """The files a release writes: one per client (normalised) or the secure sum's (distributed)."""
    folder = Path(out_dir) / spec["label"]
    if spec["mechanism"] == DISTRIBUTED:
        return [folder / f"{SECAGG_ID}.mask.safetensors"]
    return [folder / f"client_{c}.mask.safetensors" for c in range(clients)]


def simulate(handle, public_ids: torch.Tensor, clients_ids: Sequence[torch.Tensor], specs: Sequence[Mapping],
             out_dir: Path, pruning: Pruning, noise_seed: int | None, unit: ProtectedUnit = ProtectedUnit()) -> dict:
    """Write every release's mask files (:func:`mask_paths`), Wanda masks as ``pruning`` says;
    ``unit``: what the clients' windows were cut by. Returns a record of the guarantees, the
    pass's ledger and its time."""
    from fedlib.maskfile import MaskWriter
    from fedlib.methods import method_allocation

    layers = handle.layers()
    names = [info.name for info in layers]
    public = tokens_digest(public_ids)
    fingerprint = handle.fingerprint()
    noise = NoiseSource(noise_seed)
    record = {"public": public, "clients": len(clients_ids), "samples": [int(c.shape[0]) for c in clients_ids],
              "noise": noise.mode, "releases": {}}
    start = time.perf_counter()
    # one noisy release per target up to its estimator: label of its first spec, its sums
    noisy: dict[tuple, tuple[str, dict]] = {}
    with contextlib.ExitStack() as stack:
        releases, files = [], []
        for spec in specs:
            target = release_target(spec, len(clients_ids), unit)
            guarantee = replace(target.guarantee(names, public), noise=noise.mode)
            first, sums = noisy.setdefault((type(target), *(v for k, v in target.__dict__.items() if k != "estimator")),
                                           (spec["label"], {}))
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

            release = Release(spec["label"], guarantee, [noise.derive(first, c) for c in range(len(clients_ids))],
                              sink, shared=shared, secagg_seed=noise.secagg_seed(first, "secagg"), noisy_sums=sums)
            releases.append(release)
            files.append((release, writers, [None] if shared else list(range(len(clients_ids)))))
            record["releases"][spec["label"]] = {"guarantee": guarantee.header(), "files": [str(p) for p in paths],
                                                 "noisy_release": first}
        federation_pass(handle, public_ids, clients_ids, pruning, releases)
        ledger = Ledger(tokens_digest(torch.cat(list(clients_ids))))  # the pool: the clients' windows
        for release, writers, owners in files:
            digests = [release_digest(release, owner) for owner in owners]
            for writer, digest in zip(writers, digests):
                writer.metadata["x_dp_release"] = digest
            record["releases"][release.label]["digests"] = digests
        for first, _ in noisy.values():
            members = [r for r, _, _ in files if record["releases"][r.label]["noisy_release"] == first]
            ledger.add_release(first, json.loads(members[0].guarantee.header()),
                               [r.guarantee.estimator for r in members], record["releases"][first]["digests"])
    record["ledger"] = ledger.to_json()
    record["seconds"] = time.perf_counter() - start
    return record
