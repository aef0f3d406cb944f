"""Byzantine clients against the plain and the robust FedPrLLM server, on the embedded model.

The federation is the default experiment's, from a finished workflow run (``make run``): 16 IID
clients × 2 C4 samples × 512 tokens, Wanda 50 % row masks
(``results/masks/c4-32x512/iid-16/wanda-0.5-row/client_<i>.mask.safetensors``). 0, 2, 4 or 6
of the 16 (the last ones: 15, 14, ...) turn Byzantine and send, instead of their honest mask:

* ``inverted``: its complement, still exactly 50 % per row (so it passes every file check);
* ``random``: a seeded random 50 %-per-row mask (:func:`fedlib.baselines.random_masks`);
* ``garbage``: a real ``fedlib client-mask`` (the workflow's command) on seeded uniform random
  token ids instead of text, 2 × 512 like an honest shard.

Each setting is aggregated by ``fedlib aggregate`` (server group layer, no scaling: Table 1's
FedPrLLM layer row), plain and with ``--robust mad``, and scored by ``fedlib evaluate`` with the
workflow's WikiText-2 windows (8 evenly spaced windows of 512 tokens) and the options of its
evaluate rule. Recorded per row: perplexity, ratio to the honest federation's, and from the
outlier report the Byzantine and the honest clients the rule flagged (the plain server flags
for information only; it counts every vote) and the fraction of weights whose global bit
differs from the honest federation's. Goal: with at most 20 % Byzantine clients (2 of 16 here;
4 = 25 % and 6 = 37.5 % are shown too) the robust server within 5 % of the honest federation. Rows
whose global masks are bit for bit the same (``mask_sha256``; e.g. the robust server with every
attacker flagged) share one evaluation (``evaluated_as``: the row that ran it).

``fedlib aggregate`` runs with OMP_NUM_THREADS=1: its work is integer counting that two torch
threads only slow down on a busy two-core machine (the masks do not depend on it).

    python benchmarks/bench_byzantine.py --results results --model resources/models/smollm2-135m
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open

from common import MODEL, write
from fedlib.baselines import random_masks
from fedlib.data import save_tokens
from fedlib.maskfile import MaskFile, write_mask_file
from fedlib.models import open_model

N_CLIENTS = 16
SETTING = "c4-32x512/iid-16/wanda-0.5-row"
ATTACKS = ("inverted", "random", "garbage")
BYZANTINE_COUNTS = (2, 4, 6)
SERVERS = ("plain", "robust")
GOAL = "robust perplexity within 5 % of the honest federation's with <= 20 % Byzantine clients"


def fedlib(*args: str, env: dict | None = None) -> float:
    """Run a `fedlib` verb in its own process; seconds it took."""
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "fedlib", *args], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    if run.returncode != 0:
        raise RuntimeError(f"fedlib {args[0]} failed ({run.returncode}):\n{run.stderr[-2000:]}")
    return time.perf_counter() - start


def mask_digest(path: Path) -> str:
    """sha256 of a global file's mask bits: what an unscaled evaluation depends on."""
    digest = hashlib.sha256()
    with safe_open(str(path), framework="pt") as handle:
        for key in sorted(k for k in handle.keys() if k.startswith("mask:")):
            digest.update(key.encode() + handle.get_tensor(key).numpy().tobytes())
    return digest.hexdigest()


def mask_difference(a: Path, b: Path) -> float:
    """Fraction of weights whose bit differs between two global files."""
    fa, fb = MaskFile(a), MaskFile(b)
    differ = sum(int((fa.layer_mask(layer["name"]) != fb.layer_mask(layer["name"])).sum()) for layer in fa.header.layers)
    return differ / fa.header.total_weights


def byzantine_ids(n: int) -> list[str]:
    return [str(c) for c in range(N_CLIENTS - n, N_CLIENTS)]


def attack_file(attack: str, client: str, honest: Path, model: str, folder: Path, handle) -> Path:
    """What Byzantine client ``client`` sends in place of its honest mask file ``honest``."""
    out = folder / f"{attack}_{client}.mask.safetensors"
    if out.is_file():  # deterministic in (attack, client): reused when --work is kept
        return out
    if attack == "garbage":
        tokens = folder / f"garbage_{client}.safetensors"
        ids = torch.randint(0, handle.model.config.vocab_size, (2, 512),
                            generator=torch.Generator().manual_seed(2000 + int(client)))
        save_tokens(tokens, ids, dataset="uniform random token ids", seed=2000 + int(client))
        seconds = fedlib("client-mask", "--model", model, "--calib", str(tokens), "--method", "wanda",
                         "--sparsity", "0.5", "--local-group", "row", "--seed", "0", "--client-id", client,
                         "--batch-size", "8", "--device", "auto", "--dtype", "float32", "--threads", "2",
                         "--out", str(out))
        print(f"  garbage client {client}: fedlib client-mask on random tokens, {seconds:.0f}s")
        return out
    source = MaskFile(honest)
    h, layers = source.header, handle.layers()
    if attack == "inverted":
        masks = {name: ~mask for name, mask in source.masks().items()}
    elif attack == "random":
        masks = random_masks(layers, h.sparsity, 1000 + int(client), h.group)
    else:
        raise ValueError(f"unknown attack {attack!r}")
    write_mask_file(out, masks, layers, fingerprint=h.fingerprint, role="client", client_id=h.client_id,
                    method=h.method, group=h.group, sparsity=h.sparsity, allocation=h.allocation,
                    n_samples=h.n_samples, seed=h.seed, extra=h.extra)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", help="a finished workflow run's results folder")
    parser.add_argument("--model", default=MODEL, help="the materialized smollm2-135m folder")
    parser.add_argument("--work", help="folder for the attack, global and evaluation files (default: a temporary one)")
    args = parser.parse_args()
    results = Path(args.results)
    honest = [results / "masks" / SETTING / f"client_{c}.mask.safetensors" for c in range(N_CLIENTS)]
    windows = results / "eval_windows" / "wikitext2.safetensors"
    workflow_global = results / "global" / SETTING / "fedprllm_oneshot_layer.mask.safetensors"
    workflow_eval = results / "eval" / SETTING / "fedprllm_oneshot_layer_noscale.json"
    for path in [*honest, windows]:
        if not path.is_file():
            raise SystemExit(f"{path}: missing; run the workflow first (make run) or give --results")
    handle = open_model(args.model, weights=False)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        settings = [("none", 0)] + [(a, n) for a in ATTACKS for n in BYZANTINE_COUNTS]
        records, checks = [], {}
        honest_global = work / "none-0-plain.mask.safetensors"  # the first row's
        for attack, n in settings:
            bad = byzantine_ids(n)
            files = [attack_file(attack, str(c), honest[c], args.model, work, handle) if str(c) in bad else honest[c]
                     for c in range(N_CLIENTS)]
            for server in SERVERS:
                tag = f"{attack}-{n}-{server}"
                out = work / f"{tag}.mask.safetensors"
                robust = ["--robust", "mad"] if server == "robust" else []
                agg_seconds = fedlib("aggregate", "--model", args.model, "--strategy", "fedprllm", "--server-group", "layer",
                                     "--sparsity", "0.5", "--seed", "0", *robust, "--out", str(out), *map(str, files),
                                     env={"OMP_NUM_THREADS": "1"})
                report = json.loads(out.with_name(out.name.removesuffix(".safetensors") + ".clients.json").read_text())
                # rows whose global masks are bit for bit the same (e.g. every attacker flagged) share
                # one evaluation: the perplexity of an unscaled mask depends on its bits only
                digest = mask_digest(out)
                evaluation = work / f"eval-{digest[:16]}.json"
                if not evaluation.is_file():
                    fedlib("evaluate", "--model", args.model, "--mask", str(out), "--windows", str(windows),
                           "--label", tag, "--batch-size", "1", "--device", "auto", "--dtype", "float32",
                           "--threads", "2", "--out", str(evaluation))
                scored = json.loads(evaluation.read_text())
                ppl, eval_seconds = scored["perplexity"]["wikitext2"]["ppl"], scored["seconds"]
                flagged = {c["client_id"] for c in report["clients"] if c["flagged"]}
                z = {c["client_id"]: c["z"] for c in report["clients"]}
                records.append({
                    "attack": attack, "n_byzantine": n, "server": server, "perplexity": ppl,
                    "flagged_byzantine": len(flagged & set(bad)), "flagged_honest": len(flagged - set(bad)),
                    "n_used": report["n_used"], "threshold": report["threshold"],
                    "max_honest_z": max(v for c, v in z.items() if c not in bad),
                    "min_byzantine_z": min((z[c] for c in bad), default=None),
                    "mask_difference_from_honest": mask_difference(out, honest_global),
                    "mask_sha256": digest, "evaluated_as": scored["label"], "aggregate_seconds": agg_seconds,
                    "evaluate_seconds": eval_seconds,
                })
                same = "" if scored["label"] == tag else f" as {scored['label']}"
                print(f"{attack:8s} {n} {server:6s} ppl {ppl:8.3f}  flagged {sorted(flagged, key=int)}  "
                      f"differs from honest {records[-1]['mask_difference_from_honest']:.3%} "
                      f"(aggregate {agg_seconds:.0f}s, evaluate {eval_seconds:.0f}s{same})", flush=True)
                if (attack, server) == ("none", "plain"):
                    # the honest federation through this code is the workflow's own result
                    checks["honest_global_is_workflow_global"] = (workflow_global.is_file() and
                                                                  out.read_bytes() == workflow_global.read_bytes())
                    if workflow_eval.is_file():
                        checks["workflow_wikitext2_ppl"] = json.loads(workflow_eval.read_text())[
                            "perplexity"]["wikitext2"]["ppl"]
    honest_ppl = next(r["perplexity"] for r in records if (r["attack"], r["server"]) == ("none", "plain"))
    for r in records:
        r["ratio_to_honest"] = r["perplexity"] / honest_ppl
    within = [r for r in records if r["server"] == "robust" and r["n_byzantine"] / N_CLIENTS <= 0.2]
    met = all(r["ratio_to_honest"] <= 1.05 for r in within)
    print(f"\n{'attack':9s}{'byzantine':>10s}  {'plain ppl':>10s} {'ratio':>7s}  {'robust ppl':>10s} {'ratio':>7s}  "
          f"{'flagged byz/honest':>18s}")
    for attack, n in [("none", 0)] + [(a, n) for a in ATTACKS for n in BYZANTINE_COUNTS]:
        p, r = (next(x for x in records if (x["attack"], x["n_byzantine"], x["server"]) == (attack, n, s))
                for s in SERVERS)
        print(f"{attack:9s}{n:>6d}/{N_CLIENTS}  {p['perplexity']:10.3f} {p['ratio_to_honest']:7.3f}  "
              f"{r['perplexity']:10.3f} {r['ratio_to_honest']:7.3f}  {r['flagged_byzantine']:>8d}/{n} "
              f"{r['flagged_honest']:>4d}/{N_CLIENTS - n}")
    print(f"goal ({GOAL}): {'met' if met else 'NOT met'}; checks: {checks}")
    write("byzantine", {
        "model": "smollm2-135m", "goal": GOAL, "goal_met": met, "honest_perplexity": honest_ppl,
        "settings": {
            "federation": SETTING, "n_clients": N_CLIENTS, "clients": "16 x 2 C4 samples x 512 tokens, IID",
            "local": "wanda, row, 50 %", "server": "fedprllm one-shot, group layer, sparsity 0.5, no scaling, seed 0",
            "robust": "mad (k = 3.5)", "byzantine_clients": {str(n): byzantine_ids(n) for n in BYZANTINE_COUNTS},
            "attacks": {"inverted": "complement of the client's honest mask",
                        "random": "fedlib.baselines.random_masks, seed 1000 + client, row 50 %",
                        "garbage": "fedlib client-mask on uniform random token ids (2 x 512, seed 2000 + client)"},
            "evaluation": {"dataset": "wikitext2", "windows": 8, "seqlen": 512,
                           "command": "fedlib evaluate --batch-size 1 --device auto --dtype float32 --threads 2"},
        },
        "checks": checks, "records": records,
    })


if __name__ == "__main__":
    main()
