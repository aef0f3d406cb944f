"""fedlib over Flower on localhost, on the embedded model with the default federation's clients.

A SuperLink and 16 SuperNodes on this machine (Flower's insecure localhost mode:
flower/fedlib_flower/localhost.py), each site the default experiment's client (config.yaml:
C4, 16 IID clients x 2 samples x 512 tokens, Wanda, row groups, 50 %), one torch thread per site.
Per mask file format (1 and 2, and format 1 under secure aggregation): one one-shot FedPrLLM
federation (layer group), its rounds, the payload bytes sent down and up (the coordinator's
count) and Flower's own network traffic (``flwr ls``), seconds per round, and peak resident
memory per process: the coordinator (ServerApp), the largest site ClientApp, the SuperLink and
the largest SuperNode (their VmHWM since they started: peaks so far, monotone over the runs).
The coordinator's bound: what its peak grew by during the round, and by the time the last reply
was taken (before aggregating), against its largest upload on disk (its peak after hello, the
model's layers and the imports is the constant); the goal for taking the replies is at most 2
uploads (it pulls one reply at a time, each at most ``--chunk-bytes`` of an upload, and writes it
to disk: Flower's copies of that one chunk).
Each global file is checked to equal ``fedlib aggregate`` over the uploads the coordinator wrote
(byte for byte), and site 0's upload to equal ``fedlib client-mask`` on its data; secure
aggregation's global file to equal the plain format 1 federation's (the script fails otherwise). With 2 cores, at most ``--parallel`` sites compute at once (the coordinator's
``max-parallel``), so seconds per round are a 2-core figure, not a federation's with one
machine per site.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import DATA_DIR, MODEL, write

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "flower"))
from fedlib_flower.localhost import Localhost, peak_rss_mib, site_keys  # noqa: E402

FEDLIB = [sys.executable, "-m", "fedlib"]
#: name -> (label, mask file format, secure aggregation); secagg is checked against v1's global file
VARIANTS = {"v1": ("format 1", 1, False), "v2": ("format 2", 2, False),
            "secagg": ("format 1, secure aggregation", 1, True)}


def fedlib(*argv) -> None:
    subprocess.run([*FEDLIB, *map(str, argv)], check=True, stdout=subprocess.DEVNULL)


def prepare(root: Path, n_clients: int, samples: int, seqlen: int) -> tuple[Path, list[Path]]:
    model = Path(MODEL)
    if not model.is_dir():
        model = root / "model"
        fedlib("materialize-model", "--model", "smollm2-135m", "--out", model)
    pool = root / "pool.safetensors"
    fedlib("calibration-pool", "--model", model, "--dataset", "c4", "--data-dir", DATA_DIR,
           "--nsamples", n_clients * samples, "--seqlen", seqlen, "--seed", 0, "--c4-docs", 0, 800, "--out", pool)
    calib = []
    for c in range(n_clients):
        calib.append(root / f"client_{c}.safetensors")
        fedlib("client-data", "--pool", pool, "--n-clients", n_clients, "--client", c, "--partition", "iid",
               "--seed", 0, "--out", calib[-1])
    return model, calib


def federation(site: Localhost, model: Path, out: Path, roster: Path, n_clients: int, parallel: int, **config) -> dict:
    start = time.monotonic()
    run_id = site.run({"model": str(model), "out": str(out), "roster": str(roster), "min-clients": n_clients,
                       "connect-timeout": 300.0,
                       "round-deadline": 3600.0, "max-parallel": parallel, **config})
    run = site.wait(run_id, 4 * 3600)
    if run["status"] != "finished:completed":
        raise SystemExit(f"run {run_id}: {run['status']}: {run.get('status-details')}")
    state = json.loads((out / "federation.json").read_text())
    (record,) = state["rounds"]
    return {"run_seconds": time.monotonic() - start, "round": record, "flower": run,
            "refused": [r["reason"] for r in state["refused"]]}


def check_bytes(model: Path, out: Path, calib: Path, version: int, folder: Path) -> None:
    """The global file equals ``fedlib aggregate`` over the uploads, site 0's upload ``fedlib client-mask``."""
    uploads = sorted((out / "round-000").glob("site-*.mask.safetensors"))
    again = folder / f"aggregate-v{version}.safetensors"
    fedlib("aggregate", "--model", model, "--server-group", "layer", "--out", again, *uploads)
    if again.read_bytes() != (out / "global.mask.safetensors").read_bytes():
        raise SystemExit(f"{out}: the global file differs from fedlib aggregate over its uploads")
    mine = folder / f"site-00-v{version}.mask.safetensors"
    fedlib("client-mask", "--model", model, "--calib", calib, "--client-id", "site-00", "--method", "wanda",
           "--sparsity", 0.5, "--local-group", "row", "--format-version", version, "--threads", 1, "--out", mine)
    if mine.read_bytes() != (out / "round-000" / "site-00.mask.safetensors").read_bytes():
        raise SystemExit(f"{out}: site-00's upload differs from fedlib client-mask on its data")


def check_secagg(model: Path, out: Path, folder: Path, answered: list[str], absent: list[str]) -> str:
    """Secure aggregation's global file against the plain format 1 federation: byte for byte when every
    site answered; when some dropped out, against ``fedlib aggregate`` over the plain federation's
    uploads of the sites that answered (every tensor and header field equal, but the global file's
    record of who was absent). Returns what it was checked against."""
    plain = folder / "federation-v1"
    if not absent:
        if (out / "global.mask.safetensors").read_bytes() != (plain / "global.mask.safetensors").read_bytes():
            raise SystemExit("secure aggregation's global file differs from the plain federation's")
        return "the plain format 1 federation"
    from safetensors import safe_open
    import torch

    again = folder / "aggregate-secagg-survivors.safetensors"
    fedlib("aggregate", "--model", model, "--server-group", "layer", "--out", again,
           *(plain / "round-000" / f"{c}.mask.safetensors" for c in answered))
    with safe_open(str(again), "pt") as mine, safe_open(str(out / "global.mask.safetensors"), "pt") as theirs:
        header = {**mine.metadata(), "x_absent_clients": json.dumps(absent)}
        if header != theirs.metadata() or set(mine.keys()) != set(theirs.keys()) or \
                any(not torch.equal(mine.get_tensor(k), theirs.get_tensor(k)) for k in mine.keys()):
            raise SystemExit(f"secure aggregation's global file differs from fedlib aggregate over the "
                             f"{len(answered)} sites that answered")
    return f"fedlib aggregate over the same {len(answered)} sites' plain uploads (all but x_absent_clients)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--parallel", type=int, default=2, help="sites computing at once (max-parallel)")
    parser.add_argument("--chunk-bytes", type=int, default=4 << 20, help="the coordinator's chunk-bytes")
    parser.add_argument("--work", help="a folder to keep everything in (default: a temporary one)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                        help="which federations (default all; the JSON is written after each)")
    args = parser.parse_args()
    if "secagg" in args.variants and "v1" not in args.variants[:args.variants.index("secagg")]:
        parser.error("--variants: secagg is checked against the v1 federation's global file: list v1 before it")
    # a SIGTERM (timeout, kill) unwinds like ^C, so the deployment's process groups are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.work or tmp)
        root.mkdir(parents=True, exist_ok=True)
        model, calib = prepare(root, args.clients, args.samples, args.seqlen)
        site = Localhost(root / "deployment")
        records = []
        try:
            site.superlink()
            roster, keys = site_keys(root / "keys", [f"site-{c:02d}" for c in range(len(calib))])
            for c, path in enumerate(calib):
                site.supernode(f"site-{c:02d}", {"model": str(model), "calib": str(path), "threads": 1,
                                                  "signing-key": str(keys[f"site-{c:02d}"]), "roster": str(roster),
                                                  "ledger": str(root / "keys" / f"site-{c:02d}.ledger.json")})
            for name in args.variants:
                label, version, secagg = VARIANTS[name]
                out = root / f"federation-{name}"
                result = federation(site, model, out, roster, args.clients, args.parallel, mode="one-shot", group="layer",
                                    method="wanda", **{"local-group": "row", "format-version": version, "secagg": secagg,
                                                       "chunk-bytes": args.chunk_bytes})
                rnd, flower = result["round"], result["flower"]
                absent = rnd["absent"]
                if secagg:
                    same = check_secagg(model, out, root, rnd["clients"], absent)
                else:
                    check_bytes(model, out, calib[0], version, root)
                    same = "fedlib aggregate"
                largest = max(p.stat().st_size for p in (out / "round-000").glob("site-*.safetensors")) / 2 ** 20
                growth = rnd["coordinator_peak_rss_mib"] - rnd["coordinator_peak_rss_before_mib"]
                records.append({
                    "variant": label, "format_version": version, "secagg": secagg, "rounds": 1,
                    "seconds_per_round": rnd["seconds"], "run_seconds": result["run_seconds"],
                    "bytes_up": rnd["bytes_up"], "bytes_down": rnd["bytes_down"],
                    "flower_inbound_bytes": flower["network-traffic"]["inbound-bytes"],
                    "flower_outbound_bytes": flower["network-traffic"]["outbound-bytes"],
                    "coordinator_peak_rss_mib": rnd["coordinator_peak_rss_mib"],
                    "coordinator_peak_rss_before_round_mib": rnd["coordinator_peak_rss_before_mib"],
                    "coordinator_round_growth_mib": growth, "largest_upload_mib": largest,
                    "chunk_bytes": args.chunk_bytes,
                    "coordinator_replies_growth_mib":
                        rnd["coordinator_peak_rss_after_replies_mib"] - rnd["coordinator_peak_rss_before_mib"],
                    "coordinator_growth_in_uploads": growth / largest,
                    # the same before aggregation: what taking the 16 replies needed
                    "coordinator_replies_growth_in_uploads":
                        (rnd["coordinator_peak_rss_after_replies_mib"] - rnd["coordinator_peak_rss_before_mib"]) / largest,
                    "client_peak_rss_mib": rnd["client_peak_rss_mib"],
                    "client_seconds_max": max(rnd["client_seconds"]),
                    "superlink_peak_rss_mib": peak_rss_mib(site.procs["superlink"].pid),
                    "supernode_peak_rss_mib": max(peak_rss_mib(p.pid) for n, p in site.procs.items()
                                                  if n.startswith("site-")),
                    # checked above, or the script stopped: plain runs against fedlib aggregate over their
                    # uploads, secure aggregation against the plain format 1 federation (check_secagg)
                    "same_bytes_as": same,
                    # a site Flower lost (its SuperLink's store failing under load) drops out of the round
                    "sites_answered": len(rnd["clients"]), "absent": absent,
                    "refused": result["refused"],
                })
                print(json.dumps(records[-1]), flush=True)
                write("flower", {  # after each federation: an interrupted run keeps what it measured
                    "model": "smollm2-135m", "clients": args.clients, "samples_per_client": args.samples,
                    "seqlen": args.seqlen, "method": "wanda", "local_group": "row", "server_group": "layer",
                    "sparsity": 0.5, "mode": "one-shot", "parallel": args.parallel, "threads_per_site": 1,
                    "records": records,
                    "note": ("Flower 1.42 deployment engine on localhost (insecure test mode), every process on "
                             "this machine's 2 cores, shared with other jobs"),
                })
        finally:
            site.close()


if __name__ == "__main__":
    main()
