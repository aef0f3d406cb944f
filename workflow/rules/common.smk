import json
import subprocess
from pathlib import Path

from snakemake.utils import validate

validate(config, "../schemas/config.schema.yaml")

RESULTS = config["results_dir"]
REPORTS = config["reports_dir"]
LOGS = f"{RESULTS}/logs"
BENCH = f"{RESULTS}/benchmarks"
FEDLIB = "fedlib"
EMBEDDED_MODELS = {"smollm2-135m"}


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=workflow.basedir).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def model_dir():
    """Embedded aliases and hub ids are materialized once under resources/; local folders are used as is."""
    name = config["model"]["name"]
    if name not in EMBEDDED_MODELS and Path(name).is_dir():
        return name
    return f"resources/models/{name.replace('/', '--')}"


def data_dir_arg():
    return config["data_dir"] if config["data_dir"] else "hub"


def client_ids():
    return list(range(config["clients"]["n"]))


def local_only_ids():
    return client_ids()[: config["baselines"].get("local_only_clients", 4)]


def span_arg(flag, value):
    return f"{flag} {value[0]} {value[1]}" if value else ""


def variant_mask(label):
    """Evaluation label -> (mask file or None, scale flag)."""
    if label == "dense":
        return None, False
    if label == "centralized":
        return f"{RESULTS}/masks/centralized.mask.safetensors", False
    if label.startswith("local_"):
        return f"{RESULTS}/masks/client_{label[len('local_'):]}.mask.safetensors", False
    _, strategy, group, scale = label.split("_")
    return f"{RESULTS}/global/{strategy}_{group}.mask.safetensors", scale == "scale"


def table1_labels():
    labels = ["dense", "centralized"] + [f"local_{i}" for i in local_only_ids()]
    for group in config["server"]["groups"]:
        for scaled in config["server"]["scaling"]:
            labels.append(f"fedprllm_oneshot_{group}_{'scale' if scaled else 'noscale'}")
    return labels


def report_context():
    p = config["pruning"]
    c = config["calibration"]
    return {
        "model": config["model"]["name"],
        "config": workflow.configfiles[-1] if workflow.configfiles else "config.yaml",
        "seed": config["seed"],
        "commit": _commit(),
        "method": p["method"],
        "sparsity": p["sparsity"],
        "setting": (
            f"{config['clients']['n']} clients, {c['nsamples']} calibration samples x {c['seqlen']} "
            f"tokens from {c['dataset']} ({config['clients'].get('partition', 'iid')} split); "
            f"local method {p['method']} with {p['local_group']} comparison at {p['sparsity']:.0%}"
        ),
    }


def table1_outputs():
    return [f"{REPORTS}/table1.md", f"{REPORTS}/table1.csv"]
