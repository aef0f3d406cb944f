"""How much Table 1's masks and perplexities move when the CPU kernels change (one machine).

Float sums are not associative: another CPU's vectorised kernels (AVX-512 / AVX2 / scalar) add
in another order, so statistics such as Wanda's input norms differ in their last bits, scores
that tie or nearly tie swap places, and the masks of the later blocks (whose inputs come from the
earlier, pruned blocks) drift further. This bench runs the workflow itself (`snakemake`, the
default config, 1 thread) for a few Table 1 variants once per kernel setting, in separate results
folders, and compares each setting with the default one: the fraction of mask bits that differ
(keep/prune decisions over every prunable weight) and the relative change of each perplexity
cell. The kernel settings emulate other CPUs on this one:

- ``aten-avx2``: ``ATEN_CPU_CAPABILITY=avx2`` (PyTorch's own kernels: reductions, softmax, ...);
- ``avx2``: that plus ``MKL_ENABLE_INSTRUCTIONS=AVX2`` and ``ONEDNN_MAX_CPU_ISA=AVX2`` (the
  matrix multiplications too): what an AVX2-only CPU computes.

The default setting's results folder is the workflow's own (``results/`` of `make run`: reused
when up to date); the others go under ``--workdir``. With ``--reference-results`` (e.g. another
checkout's ``results/`` of the same config), the default masks are also checked bit for bit
against those files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from common import write

REPO = Path(__file__).resolve().parents[1]
KERNELS = {
    "default": {},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
#: Table 1 variants compared (Dense isolates what the evaluation's own kernels move)
VARIANTS = ("dense", "centralized", "local_0", "fedprllm_oneshot_layer_noscale", "fedprllm_oneshot_row_noscale")


def catalog(results_dir: str):
    from fedlib.catalog import Catalog
    from fedlib.config_check import with_schema_defaults

    config = with_schema_defaults(yaml.safe_load((REPO / "config.yaml").read_text()))
    return Catalog({**config, "results_dir": results_dir})


def capability(env: dict) -> str:
    """What PyTorch reports under ``env`` (a fresh interpreter: the variable is read at import)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                          text=True, check=True).stdout.strip()


def run_workflow(results_dir: str, env: dict, targets: list[str], log: Path) -> float:
    """The workflow's jobs for ``targets`` under the kernel ``env``, one job and one thread at a time."""
    command = [sys.executable, "-m", "snakemake", "--cores", "1", "--config", f"results_dir={results_dir}",
               "threads=1", "--", *targets]
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(command, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
                              stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake failed under {env or 'the default kernels'}; see {log}")
    return time.perf_counter() - start


def mask_of(path: str) -> dict:
    from fedlib.maskfile import MaskFile

    mask = MaskFile(Path(path))
    return {layer["name"]: mask.layer_mask(layer["name"]) for layer in mask.header.layers}


def compare_masks(a: dict, b: dict) -> dict:
    """Keep/prune decisions that differ, in all and per block (names ``model.layers.<i>.``)."""
    if a.keys() != b.keys():
        raise ValueError(f"the mask files hold different layers: {sorted(a.keys() ^ b.keys())[:3]}")
    per_block: dict[int, int] = {}
    differing = weights = 0
    for name, mask in a.items():
        n = int((mask != b[name]).sum())
        block = int(name.split(".layers.")[1].split(".")[0])
        per_block[block] = per_block.get(block, 0) + n
        differing += n
        weights += mask.numel()
    blocks = [i for i, n in sorted(per_block.items()) if n]
    return {"differing": differing, "weights": weights, "fraction": differing / weights,
            "blocks_differing": len(blocks), "blocks": len(per_block), "first_block_differing": blocks[0] if blocks else None,
            "block0_fraction": per_block.get(0, 0) / sum(m.numel() for k, m in a.items() if ".layers.0." in k)}


def sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tokens_sha256(paths: list[str]) -> str:
    """One digest of the token ids of these token files (their headers name their own paths)."""
    from fedlib.data import load_tokens

    digest = hashlib.sha256()
    for path in paths:
        digest.update(load_tokens(Path(path))[0].numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="benchmarks/.cpu_tolerance", help="results folders of the other kernels")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--reference-results", help="a results/ of the same config: the default masks must equal its files")
    args = parser.parse_args()
    if args.kernels[0] != "default":
        raise SystemExit("--kernels: the first must be default (the others are compared with it)")
    base = catalog(yaml.safe_load((REPO / "config.yaml").read_text())["results_dir"])
    setting = base.setting()
    payload = {"config": "config.yaml", "setting": "/".join(setting), "variants": list(VARIANTS), "threads": 1,
               "evaluation": base.config["evaluation"], "kernels": {}}
    files: dict[str, dict[str, dict]] = {}
    for kernel in args.kernels:
        env = KERNELS[kernel]
        results = base.results if kernel == "default" else str(Path(args.workdir) / kernel / "results")
        cat = catalog(results)
        evals = {label: cat.eval_json(*setting, label) for label in VARIANTS}
        masks = {label: cat.variant_source(*setting, label)[0] for label in VARIANTS if label != "dense"}
        log = Path(args.workdir) / f"{kernel}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"{kernel}: {env or 'no variables'} (PyTorch capability {capability(env)}) -> {results}", flush=True)
        seconds = run_workflow(results, env, list(evals.values()), log)
        files[kernel] = {"evals": evals, "masks": masks}
        payload["kernels"][kernel] = {"env": env, "capability": capability(env), "seconds": seconds,
                                      "results": results,
                                      "perplexity": {label: {d: row["ppl"] for d, row in
                                                             json.loads(Path(p).read_text())["perplexity"].items()}
                                                     for label, p in evals.items()},
                                      "mask_sha256": {label: sha256(p) for label, p in masks.items()}}
        # the calibration and window token ids come from the tokenizer alone: the same under any kernel
        tokens = cat.client_shards(setting[0], setting[1]) + [f"{results}/eval_windows/{d}.safetensors"
                                                               for d in cat.config["evaluation"]["datasets"]]
        payload["kernels"][kernel]["tokens_sha256"] = tokens_sha256(tokens)
        print(f"{kernel}: {seconds:.0f} s", flush=True)
    default = payload["kernels"]["default"]
    for kernel in args.kernels[1:]:
        record = payload["kernels"][kernel]
        record["masks_vs_default"] = {label: compare_masks(mask_of(files["default"]["masks"][label]), mask_of(path))
                                      for label, path in files[kernel]["masks"].items()}
        record["ppl_change_vs_default"] = {label: {d: ppl / default["perplexity"][label][d] - 1 for d, ppl in cells.items()}
                                           for label, cells in record["perplexity"].items()}
        masked = [r["fraction"] for r in record["masks_vs_default"].values()]
        pruned = [abs(c) for label, cells in record["ppl_change_vs_default"].items() if label != "dense"
                  for c in cells.values()]
        record["summary"] = {"max_mask_fraction": max(masked), "max_abs_ppl_change": max(pruned),
                             "max_abs_dense_ppl_change": max(abs(c) for c in record["ppl_change_vs_default"]["dense"].values()),
                             "tokens_identical": record["tokens_sha256"] == default["tokens_sha256"]}
        print(f"{kernel}: mask bits that differ up to {max(masked):.3%}; pruned ppl moves up to {max(pruned):.2%}; "
              f"dense up to {record['summary']['max_abs_dense_ppl_change']:.2%}", flush=True)
    if args.reference_results:
        ref = catalog(args.reference_results)
        payload["default_equals_reference"] = all(
            sha256(ref.variant_source(*setting, label)[0]) == digest for label, digest in default["mask_sha256"].items())
        print(f"default masks equal {args.reference_results}'s: {payload['default_equals_reference']}")
    write("cpu_tolerance", payload)


if __name__ == "__main__":
    main()
