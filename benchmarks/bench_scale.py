"""Scale: `fedlib client-mask` and `fedlib aggregate` on a LLaMA-2-7B-shaped checkpoint.

The 7B shape is the real LLaMA-2-7B config (32 blocks, hidden 4096, MLP 11008, 32 heads,
vocab 32000) with **random weights** (seeded N(0, 0.02) linears and embeddings, ones for the
norms) in bfloat16, written once as sharded safetensors under ``resources/scale/`` (not
committed). Random weights measure memory and time only: the masks they give mean nothing.

Each client and each aggregation runs as its own process; its peak RSS is that process's own
``ru_maxrss`` (``fedlib.jobsize.measured_run``: not this driver's memory), its time the wall
time of the process and, for a client, the seconds per block it prints. The embedded model
(``resources/models/smollm2-135m``, materialized when missing) is measured the same way, so
``benchmarks/results/scale.json`` holds one record per model.

Server input: 8 client mask files. Real clients (different random calibration tokens each)
when one client is fast enough (``--real-clients auto``: all 8 when the first took at most
``--real-budget`` seconds, else only that one, plus the ``--float32`` client, which is real
too, on its own samples); the others are valid synthetic client masks
(exactly the claimed row sparsity, random bits, the real client's fingerprint and layers),
streamed layer by layer with MaskWriter. The server's cost does not depend on which bits are
set; the JSON says how many clients were real.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_scale.py --shape 7b --threads 2
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_scale.py --shape tiny --threads 1 --no-write
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import torch

from common import write
from fedlib.io import safetensors_layout

ROOT = Path(__file__).resolve().parents[1]
#: the `fedlib` command of this environment (the module when the script is not installed)
FEDLIB = ([str(Path(sys.executable).with_name("fedlib"))] if Path(sys.executable).with_name("fedlib").is_file()
          else [sys.executable, "-m", "fedlib.cli"])
EMBEDDED_DIR = ROOT / "resources" / "models" / "smollm2-135m"
SCALE_DIR = ROOT / "resources" / "scale"
RANDOM_NOTE = ("random weights (seeded N(0, 0.02), norms 1) measure memory and time only; "
               "the masks they give mean nothing")

#: LLaMA-2-7B's config (meta-llama/Llama-2-7b-hf), stored in bfloat16; smaller shapes for testing
SHAPES = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_hidden_layers=32,
               vocab_size=32000),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_hidden_layers=22,
               vocab_size=32000),
    "tiny": dict(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_hidden_layers=4,
                 vocab_size=32000),
}
FOLDERS = {"7b": "llama2-7b-shape", "1b": "llama-1b-shape", "tiny": "llama-tiny-shape"}
BUILD_RECORD = "fedlib_scale_build.json"
SHARD_BYTES = 5 * 10**9
CHUNK_ELEMENTS = 16 << 20  # generated and written this many weights at a time


# --------------------------------------------------------------------------- the checkpoint


def llama_config(shape: dict) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 4096,
        "mlp_bias": False, "num_key_value_heads": shape["num_attention_heads"], "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, **shape,
    }


def llama_tensors(shape: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every stored tensor, in Hugging Face's order."""
    h, m, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    tensors = [("model.embed_tokens.weight", (v, h))]
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}"
        tensors += [(f"{p}.self_attn.{n}_proj.weight", (h, h)) for n in "qkvo"]
        tensors += [(f"{p}.mlp.gate_proj.weight", (m, h)), (f"{p}.mlp.up_proj.weight", (m, h)),
                    (f"{p}.mlp.down_proj.weight", (h, m)),
                    (f"{p}.input_layernorm.weight", (h,)), (f"{p}.post_attention_layernorm.weight", (h,))]
    return tensors + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


def _write_tensor(out, name: str, shape: tuple[int, ...], seed: int, device: str = "cpu") -> None:
    """One tensor's bfloat16 bytes, generated (on ``device``: a GPU draws a 7B model in well
    under a minute, a CPU takes minutes) and written in chunks of rows (bounded memory)."""
    if len(shape) == 1:  # RMSNorm weights
        out.write(torch.ones(shape, dtype=torch.bfloat16).view(torch.uint8).numpy().data)
        return
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    rows, cols = shape
    step = max(1, CHUNK_ELEMENTS // cols)
    for start in range(0, rows, step):
        chunk = torch.randn(min(step, rows - start), cols, generator=gen, device=device).mul_(0.02)
        out.write(chunk.to(torch.bfloat16).cpu().view(torch.uint8).numpy().data)


def _shard_plan(tensors, max_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    shards, current, size = [], [], 0
    for name, shape in tensors:
        nbytes = 2 * math.prod(shape)
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes
    return shards + [current]


def _complete(folder: Path, shape: dict, seed: int, device: str) -> bool:
    try:
        record = json.loads((folder / BUILD_RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    # a device's random stream is not the CPU's: the same seed gives other weights
    if record.get("shape") != shape or record.get("seed") != seed or record.get("device", "cpu") != device:
        return False
    return all((folder / name).is_file() and (folder / name).stat().st_size == size
               for name, size in record["files"].items())


def build_checkpoint(folder: Path, shape: dict, seed: int = 0, device: str = "cpu") -> dict:
    """Write the random-weight checkpoint once (skipped when ``folder`` holds a complete one
    drawn on the same kind of device); returns the build record. Memory holds one chunk of one
    tensor at a time."""
    if _complete(folder, shape, seed, device):
        record = json.loads((folder / BUILD_RECORD).read_text())
        print(f"checkpoint {folder}: complete, {record['bytes'] / 1e9:.2f} GB (built in {record['build_seconds']:.0f}s)")
        return record
    folder.mkdir(parents=True, exist_ok=True)
    (folder / BUILD_RECORD).unlink(missing_ok=True)
    start = time.perf_counter()
    tensors = llama_tensors(shape)
    plan = _shard_plan(tensors, SHARD_BYTES)
    names = [f"model-{k + 1:05d}-of-{len(plan):05d}.safetensors" for k in range(len(plan))]
    weight_map, files = {}, {}
    for shard_name, entries in zip(names, plan):
        tmp = folder / f".{shard_name}.tmp"
        shapes = dict(entries)
        head, _ = safetensors_layout({name: (torch.bfloat16, shape) for name, shape in shapes.items()},
                                     {"format": "pt"}, tmp)
        with open(tmp, "wb") as out:
            out.write(head)
            for name in sorted(shapes):  # the layout's order
                _write_tensor(out, name, shapes[name], seed, device)
                weight_map[name] = shard_name
        tmp.replace(folder / shard_name)
        files[shard_name] = (folder / shard_name).stat().st_size
        print(f"  wrote {shard_name} ({files[shard_name] / 1e9:.2f} GB, {time.perf_counter() - start:.0f}s)")
    total = sum(2 * math.prod(s) for _, s in tensors)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(llama_config(shape), indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
    write_seconds = time.perf_counter() - start
    # the fingerprint (sha256 of every stored byte) is cached in fedlib_model.json once, here,
    # so no measured client pays for it
    from fedlib.models import open_model

    open_model(str(folder), torch.bfloat16).fingerprint()
    record = {"shape": shape, "seed": seed, "device": device, "note": RANDOM_NOTE,
              "params": sum(math.prod(s) for _, s in tensors),
              "bytes": sum(files.values()), "files": files, "write_seconds": write_seconds,
              "build_seconds": time.perf_counter() - start}
    (folder / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(f"checkpoint {folder}: built, {record['bytes'] / 1e9:.2f} GB in {record['build_seconds']:.0f}s "
          f"(write {write_seconds:.0f}s)")
    return record


# --------------------------------------------------------------------------- measured processes


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_measured(argv: list[str], label: str) -> dict:
    """Run ``argv`` as its own process: wall seconds, CPU seconds, its own peak RSS
    (:func:`fedlib.jobsize.measured_run`), the 1-minute load average around it, and its stdout."""
    from fedlib.jobsize import measured_run

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    load_samples = [os.getloadavg()[0]]
    stop = threading.Event()

    def sample_load():
        while not stop.wait(15):
            load_samples.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        run = measured_run(argv, stdout=out, stderr=err, env=env, cwd=ROOT)
        stop.set()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if run.returncode != 0:
        raise RuntimeError(f"{label} failed ({run.returncode}):\n{stdout}\n{stderr}")
    row = {"seconds": round(run.seconds, 2), "cpu_seconds": round(run.cpu_seconds, 2),
           "peak_rss_mib": round(run.peak_rss_mib, 1),
           "load_1min": {"min": round(min(load_samples), 2), "max": round(max(load_samples), 2)}}
    return row | {"stdout": stdout.strip().splitlines()[-1] if stdout.strip() else ""}


def run_client(model: Path, calib: Path, out: Path, client: int, dtype: str, threads: int) -> dict:
    row = run_measured(FEDLIB + [
        "client-mask", "--model", str(model), "--calib", str(calib), "--method", "wanda", "--sparsity", "0.5",
        "--local-group", "row", "--device", "cpu", "--dtype", dtype, "--threads", str(threads),
        "--client-id", f"client-{client}", "--out", str(out)], f"client {client}")
    found = re.search(r"\(([\d.]+)s per block", row["stdout"])
    row["seconds_per_block"] = float(found.group(1)) if found else None
    row.update(client=client, dtype=dtype, threads=threads)
    print(f"  client {client} ({dtype}, {threads} thread(s)): {row['seconds']:.1f}s, "
          f"{row['seconds_per_block']}s per block, peak RSS {row['peak_rss_mib']:.0f} MiB, "
          f"load {row['load_1min']}")
    return row


def run_aggregate(model: Path, masks: list[Path], out: Path) -> dict:
    row = run_measured(FEDLIB + ["aggregate", "--model", str(model), "--server-group", "layer", "--sparsity", "0.5",
                                 "--out", str(out), *map(str, masks)], "aggregate")
    print(f"  aggregate of {len(masks)} clients: {row['seconds']:.1f}s, peak RSS {row['peak_rss_mib']:.0f} MiB, "
          f"load {row['load_1min']}")
    return row


def synthetic_client(real: Path, out: Path, client: int) -> None:
    """A valid client mask file beside a real one (same fingerprint, layers and claims): each
    row prunes exactly half its weights, one of each randomly paired pair of columns, chosen
    at random. Written layer by layer; memory holds one layer."""
    from fedlib.maskfile import MaskWriter, read_header
    from fedlib.models import LayerInfo

    header = read_header(real)
    layers = [LayerInfo(layer["name"], tuple(layer["shape"]), -1) for layer in header.layers]
    gen = torch.Generator().manual_seed(1000 + client)
    with MaskWriter(out, layers, fingerprint=header.fingerprint, role="client", client_id=f"synthetic-{client}",
                    method=header.method, group=header.group, sparsity=header.sparsity,
                    allocation=header.allocation, n_samples=header.n_samples, seed=header.seed) as writer:
        for info in layers:
            rows, cols = info.shape
            if header.group != "row" or header.sparsity != 0.5 or cols % 2:
                raise ValueError("synthetic clients are row-50% masks of layers with an even width")
            first = torch.randint(0, 2, (rows, cols // 2), generator=gen, dtype=torch.uint8).bool()
            pairs = torch.stack([first, ~first], dim=2).reshape(rows, cols)
            writer.add(info.name, pairs[:, torch.randperm(cols, generator=gen)])


# --------------------------------------------------------------------------- one model


def calib_file(folder: Path, client: int, samples: int, seqlen: int, vocab: int) -> Path:
    """Random token ids in [0, vocab) (seeded per client): different samples per client."""
    from fedlib.data import save_tokens

    path = folder / f"calib_{client}.safetensors"
    gen = torch.Generator().manual_seed(client)
    save_tokens(path, torch.randint(0, vocab, (samples, seqlen), generator=gen), source="random ids", seed=client)
    return path


def model_facts(folder: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    from fedlib.checkpoint import Checkpoint

    stored = Checkpoint(folder).tensors.values()
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in stored})
    return {"hidden_size": config["hidden_size"], "intermediate_size": config["intermediate_size"],
            "n_blocks": config["num_hidden_layers"], "vocab_size": config["vocab_size"],
            "params": sum(math.prod(t.shape) for t in stored),
            "checkpoint_bytes": sum(t.nbytes for t in stored), "dtype": dtypes[0] if len(dtypes) == 1 else dtypes}


def add_estimates(record: dict) -> None:
    """What the workflow would ask a cluster for (fedlib.jobsize, which includes a job-side
    Snakemake's memory): for each client (its dtype, one calibration file of the record's
    size) and for the aggregation. A function of the checkpoint's headers and the code only."""
    from fedlib.jobsize import host_mem_mb

    folder, tokens = ROOT / record["folder"], (record["samples"] * record["seqlen"], record["seqlen"])
    record["estimate_mib"] = host_mem_mb(folder, "blocks", record["compute_dtype"], tokens)
    for other in record["other_compute_dtypes"]:
        other["estimate_mib"] = host_mem_mb(folder, "blocks", other["dtype"], tokens)
    record["aggregate"]["estimate_mib"] = host_mem_mb(folder, "layers")


def measure_model(name: str, folder: Path, work: Path, args, dtypes: list[str]) -> dict:
    facts = model_facts(folder)
    print(f"{name}: {facts['params'] / 1e9:.3f}B params, hidden {facts['hidden_size']}, {facts['n_blocks']} blocks, "
          f"{facts['dtype']} ({facts['checkpoint_bytes'] / 1e9:.2f} GB)")
    work.mkdir(parents=True, exist_ok=True)
    calib = [calib_file(work, c, args.samples, args.seqlen, facts["vocab_size"]) for c in range(args.clients)]
    masks = [work / f"client_{c}.mask.safetensors" for c in range(args.clients)]
    first = run_client(folder, calib[0], masks[0], 0, dtypes[0], args.threads)
    clients = [first]
    # a client computing in another dtype is one more real client (its own calibration samples)
    extra = [run_client(folder, calib[c], masks[c], c, d, args.threads) for c, d in enumerate(dtypes[1:], 1)]
    n_real = args.real_clients
    if n_real == "auto":
        n_real = args.clients if first["seconds"] <= args.real_budget else 1
    n_real = max(1 + len(extra), min(int(n_real), args.clients))
    for c in range(1 + len(extra), n_real):
        clients.append(run_client(folder, calib[c], masks[c], c, dtypes[0], args.threads))
    start = time.perf_counter()
    for c in range(n_real, args.clients):
        synthetic_client(masks[0], masks[c], c)
    synthetic_seconds = time.perf_counter() - start
    if n_real < args.clients:
        print(f"  {args.clients - n_real} synthetic client masks written in {synthetic_seconds:.1f}s")
    server = run_aggregate(folder, masks, work / "global.mask.safetensors")
    mask_bytes, global_bytes = masks[0].stat().st_size, (work / "global.mask.safetensors").stat().st_size
    for path in masks + [work / "global.mask.safetensors"]:
        path.unlink(missing_ok=True)
    peak = max(row["peak_rss_mib"] for row in clients)
    record = {
        "model": name, "folder": str(folder.relative_to(ROOT)), **facts,
        "compute_dtype": dtypes[0], "device": "cpu", "threads": args.threads,
        "samples": args.samples, "seqlen": args.seqlen, "method": "wanda", "group": "row", "sparsity": 0.5,
        "peak_rss_mib": peak,
        "seconds_per_block": first["seconds_per_block"],
        "client_seconds": first["seconds"],
        "clients": clients,
        "other_compute_dtypes": extra,  # real clients too (their masks go to the server)
        "client_mask_file_bytes": mask_bytes,
        "aggregate": {**server, "n_clients": args.clients, "real_clients": n_real,
                      "synthetic_clients": args.clients - n_real, "global_mask_file_bytes": global_bytes,
                      "synthetic_write_seconds": round(synthetic_seconds, 1),
                      "synthetic_note": ("" if n_real == args.clients else
                                         "the other clients are valid synthetic row-50% masks (random bits); "
                                         "the server's cost does not depend on which bits are set")},
    }
    add_estimates(record)
    return record


# --------------------------------------------------------------------------- main


def reestimate() -> None:
    from common import OUT_DIR
    from fedlib.provenance import source_commit

    path = OUT_DIR / "scale.json"
    data = json.loads(path.read_text())
    for record in data["records"]:
        add_estimates(record)
    data["estimates_commit"] = source_commit()
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"recomputed the estimates in {path} (jobsize at {data['estimates_commit']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    parser.add_argument("--blocks", type=int, help="override the shape's number of blocks (a separate folder)")
    parser.add_argument("--samples", type=int, default=1, help="calibration samples per client")
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--real-clients", default="auto",
                        help="how many clients run `fedlib client-mask` (the rest are synthetic); auto: all "
                             "when the first took at most --real-budget seconds, else 1")
    parser.add_argument("--real-budget", type=float, default=600)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--float32", action="store_true", help="also time a float32-compute client on the big model")
    parser.add_argument("--skip-embedded", action="store_true")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--load-note", default="", help="what else ran on the machine (written to the JSON)")
    parser.add_argument("--no-write", action="store_true", help="print only (testing at a small shape)")
    parser.add_argument("--reestimate", action="store_true",
                        help="only recompute the jobsize estimates of benchmarks/results/scale.json with this "
                             "code (after a change to fedlib.jobsize; the measurements stay as they are)")
    args = parser.parse_args()
    if args.reestimate:
        reestimate()
        return
    torch.set_num_threads(args.threads)  # this process only builds files; the measured ones get --threads

    shape = dict(SHAPES[args.shape])
    folder_name = FOLDERS[args.shape]
    if args.blocks:
        shape["num_hidden_layers"] = args.blocks
        folder_name += f"-{args.blocks}blocks"
    folder = SCALE_DIR / folder_name
    build = build_checkpoint(folder, shape)
    if args.build_only:
        return
    load_before = _loadavg()
    records = []
    with tempfile.TemporaryDirectory(dir=SCALE_DIR) as tmp:
        if not args.skip_embedded:
            if not (EMBEDDED_DIR / "config.json").is_file():
                subprocess.run(FEDLIB + ["materialize-model", "--model", "smollm2-135m", "--out", str(EMBEDDED_DIR)],
                               check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            records.append(measure_model("smollm2-135m (embedded)", EMBEDDED_DIR, Path(tmp) / "embedded", args,
                                         ["float32"]))
        dtypes = ["bfloat16", "float32"] if args.float32 else ["bfloat16"]
        record = measure_model(f"llama2-{args.shape}-shape (random weights)", folder, Path(tmp) / "scale", args, dtypes)
        record["random_weights"] = True
        record["build"] = {k: build[k] for k in ("bytes", "write_seconds", "build_seconds", "files")}
        records.append(record)
    print()
    for r in records:
        agg = r["aggregate"]
        print(f"{r['model']}: {r['params'] / 1e9:.3f}B params ({r['dtype']}), client ({r['compute_dtype']}) "
              f"peak RSS {r['peak_rss_mib']:.0f} MiB, {r['seconds_per_block']}s per block, {r['client_seconds']:.0f}s; "
              f"aggregate of {agg['n_clients']} ({agg['real_clients']} real) {agg['seconds']:.1f}s, "
              f"peak RSS {agg['peak_rss_mib']:.0f} MiB")
        for e in r["other_compute_dtypes"]:
            print(f"    {e['dtype']} client: peak RSS {e['peak_rss_mib']:.0f} MiB, {e['seconds_per_block']}s per block")
    if args.no_write:
        return
    write("scale", {
        "note": RANDOM_NOTE,
        "goal": "client peak RSS <= 4096 MiB at the LLaMA-2-7B shape",
        "definitions": {
            "peak_rss_mib": "the process's own peak resident set (ru_maxrss, fedlib.jobsize.measured_run), MiB",
            "seconds_per_block": "as printed by `fedlib client-mask`: seconds from the model being open "
                                 "(fingerprint cached) to the mask file written, over the number of blocks",
            "params": "every stored tensor's elements (embeddings and LM head included)",
            "dtype": "the checkpoint's stored dtype; compute_dtype is the client's --dtype",
        },
        "load": {"loadavg_before": load_before, "loadavg_after": _loadavg(), "note": args.load_note},
        "records": records,
    })


if __name__ == "__main__":
    main()
