"""Overhead of secure aggregation (fedlib.server.secagg) on the embedded model's linear shapes.

Per number of clients n: the round's setup (X25519 keys, t-of-n Shamir shares, all clients),
one client's masking time over every prunable layer (every client does the same work: one
self stream and n - 1 pair streams), the server's unmasking time without and with one dropped
client, and the bytes a client uploads (k bit planes, 2^k > n) against a plain packed mask (1 bit
per weight) and against a real client mask file. Plain vote counting of the same masks is timed
for comparison, and the unmasked counts are checked against it (equal or the script fails).
Masks are random 50 % row masks (the cost does not depend on which bits are set).

``--protocol-only`` times the round's steps without the model (results/secagg_protocol.json):
per site, signing its keys and verifying the n advertised (Ed25519 against the roster), the
share step, confirming the survivors and verifying the others' confirmations before revealing;
the server's checks of n signatures, and its decoding of the reveals from every share, honest
and with one altered share (named and corrected).
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
from fedlib.server.secagg import (
    SIMULATION_PLAN, RoundContext, SecAggClient, SecAggServer, _Randomness, check_advertisement, finish_round,
    modulus_bits, pack_words, setup_round, simulation_sites,
)


def run(layers, n: int, seed: int) -> dict:
    start = time.perf_counter()
    clients, server = setup_round(n, seed=seed)
    setup = time.perf_counter() - start
    survivors = list(range(n))
    finish_round(clients, server, survivors)
    # every site reveals once per round: the dropout is another round of the same secrets
    clients_drop, server_drop = setup_round(n, seed=seed)
    finish_round(clients_drop, server_drop, survivors[1:])
    client_s = server_s = server_drop_s = plain_s = 0.0
    wire = plain_bytes = 0
    for info in layers:
        masks = [prune_lowest(torch.rand(info.shape, generator=torch.Generator().manual_seed(i)), 0.5, "row", i,
                              info.name) for i in range(n)]
        uploads = {}
        for j in survivors:
            t0 = time.perf_counter()
            uploads[j] = clients[j].masked_upload(info.name, masks[j])
            clients_drop[j].masked_upload(info.name, masks[j])  # the same words: the same secrets
            if j == 0:
                client_s += time.perf_counter() - t0
                wire += len(pack_words(uploads[j], server.bits))
                plain_bytes += (masks[j].numel() + 7) // 8
        t0 = time.perf_counter()
        counts = server.unmask(info.name, uploads, info.shape, {"group": "row", "sparsity": 0.5,
                                                                 "allocation": "uniform"})
        server_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        plain = torch.stack(masks).sum(0, dtype=torch.int16)
        plain_s += time.perf_counter() - t0
        if not torch.equal(counts, plain):
            raise SystemExit(f"{info.name}: unmasked counts differ from plain vote counting")
        t0 = time.perf_counter()
        counts_drop = server_drop.unmask(info.name, {j: uploads[j] for j in survivors[1:]}, info.shape, None)
        server_drop_s += time.perf_counter() - t0
        if not torch.equal(counts_drop.reshape(info.shape), torch.stack(masks[1:]).sum(0, dtype=torch.int16)):
            raise SystemExit(f"{info.name}: unmasked counts with a dropout differ from plain vote counting")
    return {"n_clients": n, "threshold": server.threshold, "modulus_bits": modulus_bits(n),
            "setup_seconds": setup, "client_masking_seconds": client_s, "server_unmask_seconds": server_s,
            "server_unmask_one_dropout_seconds": server_drop_s, "plain_vote_count_seconds": plain_s,
            "client_upload_bytes": wire, "plain_packed_mask_bytes": plain_bytes,
            "upload_vs_plain_packed": wire / plain_bytes}


def _seconds(func) -> tuple[float, object]:
    start = time.perf_counter()
    out = func()
    return time.perf_counter() - start, out


def protocol(n: int, seed: int) -> dict:
    """One round's steps at n sites without layers (one site's share of the work, and the server's)."""
    rng = _Randomness(seed)
    roster, ids, keys = simulation_sites(n, rng)
    context = RoundContext(f"bench-{seed}", 0, roster, SIMULATION_PLAN, n // 2 + 1)
    clients = [SecAggClient.create(context, cid, key, rng=rng) for cid, key in zip(ids, keys)]
    sites = list(range(n))
    sign, _ = _seconds(clients[0].advertise)
    advertised = {c.index: c.advertise() for c in clients}
    verify, _ = _seconds(lambda: [check_advertisement(context, j, a) for j, a in advertised.items()])
    server = SecAggServer(context)
    server_admit, _ = _seconds(lambda: server.admit(advertised))
    outboxes = {}
    for c in clients:  # each verifies the n keys, then shares
        seconds, outboxes[c.index] = _seconds(lambda: c.share_secrets(advertised, rng))
        share = seconds if c.index == 0 else share
    for c in clients:
        seconds, _ = _seconds(lambda: c.receive_shares({s: box[c.index] for s, box in outboxes.items()}, sites))
        receive = seconds if c.index == 0 else receive
        c.begin_upload(SIMULATION_PLAN)
    signatures = {}
    for c in clients:
        seconds, signatures[c.index] = _seconds(lambda: c.confirm_survivors(sites))
        confirm = seconds if c.index == 0 else confirm
    server_confirmations, confirmations = _seconds(lambda: server.admit_confirmations(sites, signatures))
    reveals = {}
    for c in clients:
        seconds, reveals[c.index] = _seconds(lambda: c.reveal(sites, confirmations))
        reveal = seconds if c.index == 0 else reveal
    recover, _ = _seconds(lambda: server.recover(reveals, sites))
    recover_altered = None
    if (n - context.threshold) // 2:  # n shares of a t-of-n secret correct floor((n - t) / 2) wrong ones
        kind, (x, y) = reveals[n - 1][0]
        reveals[n - 1][0] = (kind, (x, y + 1))  # the last site alters its share of site 0's seed
        altered = SecAggServer(context, dict(server.advertised))
        recover_altered, _ = _seconds(lambda: altered.recover(reveals, sites))
        if list(altered.suspects) != [ids[n - 1]] or server.suspects:
            raise SystemExit(f"n={n}: the altered share was not named alone ({altered.suspects}, {server.suspects})")
    return {"n_clients": n, "threshold": context.threshold, "site_sign_keys_seconds": sign,
            "site_verify_n_keys_seconds": verify, "site_share_step_seconds": share,
            "site_receive_step_seconds": receive, "site_confirm_sign_seconds": confirm,
            "site_reveal_verify_seconds": reveal, "server_admit_n_keys_seconds": server_admit,
            "server_admit_n_confirmations_seconds": server_confirmations, "server_recover_seconds": recover,
            "server_recover_one_altered_share_seconds": recover_altered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--protocol-only", action="store_true", help="time the round's steps without the model")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.protocol_only:
        records = [protocol(n, seed=0) for n in args.clients]
        for r in records:
            print(f"n={r['n_clients']}: a site signs its keys in {r['site_sign_keys_seconds'] * 1e3:.2f} ms, verifies "
                  f"the n advertised in {r['site_verify_n_keys_seconds'] * 1e3:.1f} ms, share step "
                  f"{r['site_share_step_seconds'] * 1e3:.1f} ms, reveal (n confirmations verified) "
                  f"{r['site_reveal_verify_seconds'] * 1e3:.1f} ms; server recovers in "
                  f"{r['server_recover_seconds'] * 1e3:.1f} ms"
                  + ("" if r["server_recover_one_altered_share_seconds"] is None else
                     f" ({r['server_recover_one_altered_share_seconds'] * 1e3:.1f} ms with one altered share)"))
        write("secagg_protocol", {"note": "one process, 1 thread, machine shared with other jobs; times of one "
                                          "call each (site 0's, the server's)", "records": records})
        return
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
