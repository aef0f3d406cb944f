# Functions and values the rules share, and the config's validation: nothing else happens here at
# parse time (the jobs' command, FEDLIB: the Snakefile).

import errno
import json
import os
from pathlib import Path

from snakemake.utils import validate

from fedlib.catalog import (
    CALIB_PATTERN,
    GROUP_PATTERN,
    PRUNE_PATTERN,
    SETTING_LABEL_PATTERN,
    SPLIT_PATTERN,
    Calib,
    Catalog,
    PrivacyCatalog,
    Prune,
    Split,
    eps_name,
    group_arg,
    plot_inputs,
    table_inputs,
)
from fedlib.config_check import SCHEMA, materialized_dir, validate_config
from fedlib.mirror import resolve_data_dir
from fedlib.privacy_analyses import TARGETS as PRIVACY_TARGETS
from fedlib.strategy_options import STRATEGY_SENDS

validate(config, str(SCHEMA))  # the schema ships in the package (fedlib/schemas)
validate_config(config, Path.cwd())  # what the schema cannot express: values against each other, files, the model
# data_dir: auto -> ../shared/data when present, else resources/data (`make data`), before anything reads it
config["data_dir"] = resolve_data_dir(config["data_dir"], Path.cwd())

RESULTS = config["results_dir"]
REPORTS = config["reports_dir"]
LOGS = f"{RESULTS}/logs"
BENCH = f"{RESULTS}/benchmarks"
from fedlib.embedded import EMBEDDED  # the library's list (= fedlib.models.EMBEDDED; no torch import)

EMBEDDED_MODELS = set(EMBEDDED)
EVAL = config["evaluation"]


# An experiment setting is three path components, so every table can mix settings and
# Snakemake reruns exactly what a changed setting touches (grammar: fedlib.catalog.variants):
#   calib  {dataset}-{nsamples}x{seqlen}  e.g. c4-32x512   (mix-8x512: 8 samples from each of
#          WikiText-2, C4 and PTB, the non-IID pool)
#   split  iid-{clients} or dir{alpha}-{clients}         e.g. iid-16, dir5-12
#   prune  {method}-{sparsity}-{local group}              e.g. wanda-0.5-row, wanda-0.5-2of4
# {strategy} of the server job (aggregate): the registered strategies that aggregate client mask files
MASK_STRATEGY_PATTERN = "|".join(name for name, send in STRATEGY_SENDS.items() if send == "mask")


wildcard_constraints:
    calib=CALIB_PATTERN,
    split=SPLIT_PATTERN,
    prune=PRUNE_PATTERN,
    client=r"\d+",
    group=GROUP_PATTERN,
    dataset=r"wikitext2|c4|ptb",


def model_dir():
    """Embedded aliases and hub ids are materialized once under resources/; local folders are used as is."""
    name = config["model"]["name"]
    if name not in EMBEDDED_MODELS and Path(name).is_dir():
        return os.path.normpath(name)  # "./model" -> "model": Snakemake warns on every rule for a leading "./"
    return materialized_dir(name)


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


def config_files():
    """The config files in the order they were merged: the Snakefile's, then --configfile ones."""

    def shown(f):
        rel = os.path.relpath(os.path.abspath(f))
        return str(f) if rel.startswith("..") else rel

    cli = [os.path.abspath(f) for f in workflow.overwrite_configfiles]
    files = [f for f in workflow.configfiles if os.path.abspath(f) not in cli] + cli
    return " + ".join(dict.fromkeys(shown(f) for f in files)) or "config.yaml"


# Settings, variants and table specs of this config (fedlib.catalog; table and privacy specs below)
CATALOG = Catalog(config, config_files())


# Inputs and parameters of the rules in clients, server, evaluate and zeroshot.smk.


def mask_args(wc):
    """CLI arguments of a client's pruning, from the prune wildcard."""
    return CATALOG.mask_args(wc.prune)


def client_masks(wc):
    return CATALOG.client_masks(wc.calib, wc.split, wc.prune)


def client_shards(wc):
    return CATALOG.client_shards(wc.calib, wc.split)


EVAL_WINDOWS = expand(f"{RESULTS}/eval_windows/{{dataset}}.safetensors", dataset=EVAL["datasets"])


def variant_of(wc):
    """(input file, CLI arguments) of the variant a perplexity or zero-shot job scores."""
    return CATALOG.variant_source(wc.calib, wc.split, wc.prune, wc.label)


def evaluation_inputs(wc):
    return {"model": MODEL_READY, "windows": EVAL_WINDOWS, "variant": variant_of(wc)[0]}


# zero-shot: results/zeroshot/ mirrors results/eval/ (same variants, lm-eval accuracy)
ZEROSHOT = config.get("zeroshot", {})
ZEROSHOT_TASKS = ZEROSHOT.get(
    "tasks", ["boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"]
)
ZEROSHOT_LIMIT = CATALOG.zeroshot_limit  # null = full splits
# the local task files, so a changed file reruns the evaluation (none when loading from the hub)
ZEROSHOT_DATA = [f"{config['data_dir']}/zeroshot/{task}.jsonl" for task in ZEROSHOT_TASKS] if config["data_dir"] else []


def zeroshot_inputs(wc):
    return {"model": MODEL_READY, "data": ZEROSHOT_DATA, "variant": variant_of(wc)[0]}


ZEROSHOT_ARGS = (
    f"--tasks {' '.join(ZEROSHOT_TASKS)} --limit {ZEROSHOT_LIMIT if ZEROSHOT_LIMIT is not None else 'none'} "
    f"--batch-size {ZEROSHOT.get('batch_size', 8)} --seed {config['seed']} --data-dir {data_dir_arg()}"
)


# Table specs: which result files make each report table (rows, cells, context), built by
# fedlib.catalog.Catalog (CATALOG, common.smk). Rules: report.smk (table1), zeroshot.smk,
# studies.smk (named targets); writer: `fedlib report`, plots: `fedlib plot`.

STUDY_SPECS = CATALOG.study_specs()
STUDY_PLOTS = CATALOG.study_plots()


def study_caption(name, kind="table"):
    """workflow/report/<name>.rst when there is one, else the generic caption of its kind."""
    own = Path(CHECKOUT) / "workflow" / "report" / f"{name}.rst"
    return f"../report/{name}.rst" if own.is_file() else f"../report/study_{kind}.rst"


# Privacy audit of the shared masks (FedPrLLM Sec. 4.5 / App. C, made into real measurements):
# entropy, similarity, sensitivity, membership inference, inversion, and the randomized-response
# defence with its perplexity cost. Two size sets: "run" (config `privacy:`, reduced, part of
# `make run`) and "full" (`privacy.full:` overrides per analysis; target privacy_full). The
# analyses with a named target of their own: PRIVACY_TARGETS (fedlib.privacy_analyses).
# Sizes, paths and the report specs: fedlib.catalog.privacy (PRIVACY); the rules in privacy.smk.

PRIVACY = PrivacyCatalog(CATALOG)
PRIV_BASE = PRIVACY.base
DP_FEDERATION = r"setting|[a-z0-9]+-\d+x\d+"  # privacy_dp: the setting's clients, or a pool split IID


def priv_outputs(size, for_report=False):
    """The bundled audit's tables and plots; ``for_report`` flags the HTML pages and plots for the HTML report."""
    outputs = PRIVACY.report_outputs("privacy", size)
    tables = [path for path in outputs if not path.endswith((".html", ".png"))]
    shown = [path for path in outputs if path.endswith((".html", ".png"))]
    if for_report:
        caption = "../report/privacy.rst" if size == "run" else "../report/privacy_full.rst"
        shown = [report(path, caption=caption, category="Privacy") for path in shown]
    return tables + shown


#: the reduced audit's tables and plots (rule all)
PRIVACY_RUN_REPORTS = priv_outputs("run")
