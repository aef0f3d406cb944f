import errno
import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.utils import validate
from snakemake_interface_executor_plugins.settings import DeploymentMethod

validate(config, "../schemas/config.schema.yaml")

# Jobs run this checkout's fedlib (`python -m fedlib`, PYTHONPATH) with the `python` of their
# environment: a conda environment of envs/fedlib.yaml, or else the interpreter that runs
# Snakemake (the .venv of `make install`, whether or not it is activated).
# (braces doubled twice: once for these f-strings, once for Snakemake's own formatting)
_JOB_ENV = f"export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; "
if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
    _JOB_ENV += f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH; "
shell.prefix(_JOB_ENV)

RESULTS = config["results_dir"]
REPORTS = config["reports_dir"]
LOGS = f"{RESULTS}/logs"
BENCH = f"{RESULTS}/benchmarks"
from fedlib.embedded import EMBEDDED  # the library's list (= fedlib.models.EMBEDDED; no torch import)
EMBEDDED_MODELS = set(EMBEDDED)
EVAL = config["evaluation"]

# An experiment setting is three path components, so every table can mix settings and
# Snakemake reruns exactly what a changed setting touches:
#   calib  {dataset}-{nsamples}x{seqlen}  e.g. c4-32x512   (mix-8x512: 8 samples from each of
#          WikiText-2, C4 and PTB, the non-IID pool)
#   split  iid-{clients} or dir{alpha}-{clients}         e.g. iid-16, dir5-12
#   prune  {method}-{sparsity}-{local group}              e.g. wanda-0.5-row, wanda-0.5-2of4
wildcard_constraints:
    calib=r"(c4|wikitext2|ptb|mix)-\d+x\d+",
    split=r"(iid|dir[0-9.]+)-\d+",
    prune=r"[a-z_]+-[0-9.]+-(row|layer|column|\d+of\d+)",
    client=r"\d+",
    group=r"row|layer|column|\d+of\d+",
    dataset=r"wikitext2|c4|ptb",


def model_dir():
    """Embedded aliases and hub ids are materialized once under resources/; local folders are used as is."""
    name = config["model"]["name"]
    if name not in EMBEDDED_MODELS and Path(name).is_dir():
        return name
    return f"resources/models/{'--'.join(name.split('/'))}"


MODEL_READY = f"{model_dir()}/config.json"


def model_folder(wildcards, input):
    """The model folder a job loads: derived from its `model` input, so the path is written once."""
    return os.path.dirname(input.model)


# Where jobs that run the model compute (fedlib.runner.Placement), and what they ask a cluster
# for: one GPU unless the config says cpu (`auto` takes CUDA where the node has it), host
# memory from what the job loads (fedlib.jobsize; Snakemake calls it once the inputs exist).
DEVICE = config.get("device", "auto")
DTYPE = config.get("dtype", "float32")
PLACEMENT_ARGS = f"--device {DEVICE} --dtype {DTYPE}"
MODEL_JOB_GPUS = 0 if DEVICE == "cpu" else 1
PRUNE_BATCH = config["pruning"].get("batch_size", 8)


def _files(value):
    return [value] if isinstance(value, str) else list(value)


def job_mem_mb(kind, tokens=(), count=None, batch_size=PRUNE_BATCH, logits=False):
    """A rule's mem_mb: ``kind`` of job (fedlib.jobsize.KINDS) on the rule's model input, with
    the token files of its inputs named in ``tokens``, or ``count(wildcards)`` = (tokens,
    tokens per sample) for jobs that draw their samples themselves; times the attempt."""
    from fedlib.jobsize import host_mem_mb, tokens_in

    def mem_mb(wildcards, input, attempt):
        for path in input:  # Snakemake shows <TBD> until the inputs exist (dry runs)
            if not os.path.exists(path):
                raise FileNotFoundError(errno.ENOENT, "not created yet", path)
        if count is not None:
            size = count(wildcards)
        else:
            size = tokens_in(f for name in tokens for f in _files(getattr(input, name)))
        # a retry (profile `retries`) after running out of memory asks for more
        return attempt * host_mem_mb(model_folder(wildcards, input), kind, DTYPE, size, batch_size, logits)

    return mem_mb


def data_dir_arg():
    return config["data_dir"] if config["data_dir"] else "hub"


def span_arg(flag, value):
    return f"{flag} {value[0]} {value[1]}" if value else ""


def group_arg(group):
    """Path spelling -> CLI spelling of a comparison group (2of4 -> 2:4)."""
    return group.replace("of", ":")


def parse_calib(calib):
    dataset, size = calib.split("-")
    nsamples, seqlen = size.split("x")
    return dataset, int(nsamples), int(seqlen)


def parse_split(split):
    kind, clients = split.split("-")
    return kind, int(clients)


def parse_prune(prune):
    method, sparsity, group = prune.split("-")
    return method, float(sparsity), group


def setting(calib=None, split=None, prune=None):
    """Path components of a setting; unspecified parts come from the default experiment."""
    c, p = config["calibration"], config["pruning"]
    calib = calib or f"{c['dataset']}-{c['nsamples']}x{c['seqlen']}"
    split = split or f"{config['clients'].get('partition', 'iid')}-{config['clients']['n']}"
    prune = prune or f"{p['method']}-{p['sparsity']}-{p['local_group'].replace(':', 'of')}"
    return calib, split, prune


def eval_json(calib, split, prune, label):
    if label == "dense":
        return f"{RESULTS}/eval/dense.json"
    return f"{RESULTS}/eval/{calib}/{split}/{prune}/{label}.json"


def variant_input(calib, split, prune, label):
    """Evaluation label -> (file the variant needs, its `fedlib evaluate` arguments).

    FedPrLLM variants are the base model plus a mask file; FedSpaLLM variants load a weight
    file (the aggregated global model, or a client's own Standalone model)."""
    base = f"{calib}/{split}/{prune}"
    if label == "dense":
        return None, ""
    if label == "centralized":
        path = f"{RESULTS}/masks/{calib}/central/{prune}/centralized.mask.safetensors"
        return path, f"--mask {path}"
    if label.startswith("local_"):
        path = f"{RESULTS}/masks/{base}/client_{label[len('local_'):]}.mask.safetensors"
        return path, f"--mask {path}"
    if label == "random":
        method, sparsity, group = parse_prune(prune)
        path = f"{RESULTS}/random/{sparsity}.mask.safetensors"
        return path, f"--mask {path}"
    if label == "fedspallm" or label.startswith("standalone_"):
        name = "global" if label == "fedspallm" else label
        path = f"{RESULTS}/fedspallm/{base}/{name}.weights.safetensors"
        return path, f"--weights {path}"
    _, strategy, group, scale = label.split("_")
    # iterative pruning with scaling propagates through scaled blocks: a run of its own
    run = f"{strategy}-scaled" if strategy == "iterative" and scale == "scale" else strategy
    path = f"{RESULTS}/global/{base}/{run}_{group}.mask.safetensors"
    return path, f"--mask {path}" + (" --scale" if scale == "scale" else "")


def local_only_labels(split):
    _, n = parse_split(split)
    return [f"local_{i}" for i in range(min(n, config["baselines"].get("local_only_clients", 4)))]


def fedprllm_labels(strategies=None, groups=None, scalings=None):
    strategies = strategies or config["server"].get("strategies", ["oneshot"])
    groups = groups or config["server"]["groups"]
    scalings = scalings if scalings is not None else config["server"]["scaling"]
    return [
        f"fedprllm_{strategy}_{group.replace(':', 'of')}_{'scale' if scaled else 'noscale'}"
        for strategy in strategies for scaled in scalings for group in groups
    ]


def config_hash():
    """sha256 (first 12 hex digits) of the validated config, defaults filled in, without
    `threads` (how fast, not what is computed)."""
    import hashlib

    hashed = {key: value for key, value in config.items() if key != "threads"}
    return hashlib.sha256(json.dumps(hashed, sort_keys=True, default=str).encode()).hexdigest()[:12]


def config_files():
    """The config files in the order they were merged: the Snakefile's, then --configfile ones."""
    def shown(f):
        rel = os.path.relpath(os.path.abspath(f))
        return str(f) if rel.startswith("..") else rel

    cli = [os.path.abspath(f) for f in workflow.overwrite_configfiles]
    files = [f for f in workflow.configfiles if os.path.abspath(f) not in cli] + cli
    return " + ".join(dict.fromkeys(shown(f) for f in files)) or "config.yaml"


def pool_description(dataset, nsamples):
    """What a calib component means: mix-8 is 8 samples from each of the three sources."""
    if dataset == "mix":
        return f"{3 * nsamples} calibration samples ({nsamples} each from wikitext2, c4, ptb)"
    return f"{nsamples} calibration samples from {dataset}"


def report_context(calib, split, prune, title_extra=""):
    dataset, nsamples, seqlen = parse_calib(calib)
    kind, n = parse_split(split)
    method, sparsity, group = parse_prune(prune)
    partition = "IID" if kind == "iid" else f"Dirichlet(alpha={kind[3:]})"
    return {
        "model": config["model"]["name"],
        "config": config_files(),
        "seed": config["seed"],
        "config_hash": config_hash(),
        "lines": [
            f"{n} clients, {pool_description(dataset, nsamples)} x {seqlen} tokens "
            f"({partition} split); local method {method} with {group_arg(group)} comparison "
            f"at {sparsity:.0%}{title_extra}"
        ],
    }


# Inputs and parameters of the rules in clients, server, evaluate and zeroshot.smk.

def mask_args(wc, group_flag="--group"):
    """CLI arguments of a client's pruning, from the prune wildcard."""
    method, sparsity, group = parse_prune(wc.prune)
    return f"--method {method} --sparsity {sparsity} {group_flag} {group_arg(group)}"


def client_masks(wc):
    _, n = parse_split(wc.split)
    return [f"{RESULTS}/masks/{wc.calib}/{wc.split}/{wc.prune}/client_{i}.mask.safetensors" for i in range(n)]


def client_shards(wc):
    _, n = parse_split(wc.split)
    return [f"{RESULTS}/shards/{wc.calib}/{wc.split}/client_{i}.safetensors" for i in range(n)]


FEDSPALLM = config.get("studies", {}).get("fedspallm", {})
EVAL_WINDOWS = expand(f"{RESULTS}/eval_windows/{{dataset}}.safetensors", dataset=EVAL["datasets"])


def variant_of(wc):
    """(input file, CLI arguments) of the variant a perplexity or zero-shot job scores."""
    return variant_input(wc.calib, wc.split, wc.prune, wc.label)


def evaluation_inputs(wc):
    return {"model": MODEL_READY, "windows": EVAL_WINDOWS, "variant": variant_of(wc)[0]}


# zero-shot: results/zeroshot/ mirrors results/eval/ (same variants, lm-eval accuracy)
ZEROSHOT = config.get("zeroshot", {})
ZEROSHOT_TASKS = ZEROSHOT.get("tasks", ["boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"])
ZEROSHOT_LIMIT = ZEROSHOT.get("limit", 20)  # the schema default; null = full splits
# the local task files, so a changed file reruns the evaluation (none when loading from the hub)
ZEROSHOT_DATA = [f"{config['data_dir']}/zeroshot/{task}.jsonl" for task in ZEROSHOT_TASKS] if config["data_dir"] else []


def zeroshot_inputs(wc):
    return {"model": MODEL_READY, "data": ZEROSHOT_DATA, "variant": variant_of(wc)[0]}


ZEROSHOT_ARGS = (
    f"--tasks {' '.join(ZEROSHOT_TASKS)} --limit {ZEROSHOT_LIMIT if ZEROSHOT_LIMIT is not None else 'none'} "
    f"--batch-size {ZEROSHOT.get('batch_size', 8)} --seed {config['seed']} --data-dir {data_dir_arg()}"
)
