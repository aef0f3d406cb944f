"""Overhead of secure aggregation (fedlib.server.secagg) on the embedded model's linear shapes.

Per number of clients n: the round's setup (X25519 keys, t-of-n Shamir shares, all clients),
one client's masking time over every prunable layer (every client does the same work: one
self stream and n - 1 pair streams), the server's unmasking time without and with one dropped
client, and the bytes a client uploads (k bit planes, 2^k > n) against a plain packed mask (1 bit
per weight) and against a real client mask file. Plain vote counting of the same masks is timed
for comparison, and the unmasked counts are checked against it (equal or the script fails).
Masks are random 50 % row masks (the cost does not depend on which bits are set).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import load_bench_model, write
from fedlib.groups import prune_lowest
from fedlib.maskfile import write_mask_file
from fedlib.models import fingerprint, prunable_layers
from fedlib.server.secagg import modulus_bits, pack_words, setup_round


def run(layers, n: int, seed: int) -> dict:
    start = time.perf_counter()
    clients, server = setup_round(n, seed=seed)
    setup = time.perf_counter() - start
    survivors = list(range(n))
    reveals = {j: clients[j].reveal(survivors) for j in survivors}
    reveals_drop = {j: clients[j].reveal(survivors[1:]) for j in survivors[1:]}
    client_s = server_s = server_drop_s = plain_s = 0.0
    wire = plain_bytes = 0
    for info in layers:
        masks = [prune_lowest(torch.rand(info.shape, generator=torch.Generator().manual_seed(i)), 0.5, "row", i,
                              info.name) for i in range(n)]
        uploads = {}
        for j in survivors:
            t0 = time.perf_counter()
            uploads[j] = clients[j].masked_upload(info.name, masks[j])
            if j == 0:
                client_s += time.perf_counter() - t0
                wire += len(pack_words(uploads[j], server.bits))
                plain_bytes += (masks[j].numel() + 7) // 8
        t0 = time.perf_counter()
        counts = server.unmask(info.name, uploads, reveals)
        server_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        plain = torch.stack(masks).sum(0, dtype=torch.int16)
        plain_s += time.perf_counter() - t0
        if not torch.equal(counts.reshape(info.shape), plain):
            raise SystemExit(f"{info.name}: unmasked counts differ from plain vote counting")
        t0 = time.perf_counter()
        counts_drop = server.unmask(info.name, {j: uploads[j] for j in survivors[1:]}, reveals_drop)
        server_drop_s += time.perf_counter() - t0
        if not torch.equal(counts_drop.reshape(info.shape), torch.stack(masks[1:]).sum(0, dtype=torch.int16)):
            raise SystemExit(f"{info.name}: unmasked counts with a dropout differ from plain vote counting")
    return {"n_clients": n, "threshold": server.threshold, "modulus_bits": modulus_bits(n),
            "setup_seconds": setup, "client_masking_seconds": client_s, "server_unmask_seconds": server_s,
            "server_unmask_one_dropout_seconds": server_drop_s, "plain_vote_count_seconds": plain_s,
            "client_upload_bytes": wire, "plain_packed_mask_bytes": plain_bytes,
            "upload_vs_plain_packed": wire / plain_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, nargs="+", default=[4, 16])
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, _ = load_bench_model()
    layers = prunable_layers(model)
    weights = sum(int(np.prod(info.shape)) for info in layers)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "client.mask.safetensors"
        gen = torch.Generator().manual_seed(0)
        masks = {info.name: prune_lowest(torch.rand(info.shape, generator=gen), 0.5, "row", 0, info.name)
                 for info in layers}
        write_mask_file(path, masks, layers, fingerprint=fingerprint(model), role="client", client_id="0",
                        method="wanda", group="row", sparsity=0.5, n_samples=2, seed=0)
        mask_file_bytes = path.stat().st_size
    records = []
    for n in args.clients:
        r = run(layers, n, seed=0)
        r["mask_file_bytes"] = mask_file_bytes
        records.append(r)
        print(f"n={n}: k={r['modulus_bits']} bits, setup {r['setup_seconds']:.3f} s, client masking "
              f"{r['client_masking_seconds']:.1f} s, server unmask {r['server_unmask_seconds']:.1f} s "
              f"(one dropout {r['server_unmask_one_dropout_seconds']:.1f} s; plain counting "
              f"{r['plain_vote_count_seconds']:.1f} s), upload {r['client_upload_bytes'] / 2**20:.1f} MiB vs "
              f"{r['plain_packed_mask_bytes'] / 2**20:.1f} MiB packed mask ({r['upload_vs_plain_packed']:.1f}x), "
              f"mask file {mask_file_bytes / 2**20:.1f} MiB")
    write("secagg", {"model": "smollm2-135m", "layers": len(layers), "weights": weights,
                     "note": "one process, 1 torch thread, machine shared with other jobs (nice 5); random 50 % "
                             "row masks; times summed over every prunable layer",
                     "records": records})


if __name__ == "__main__":
    main()
