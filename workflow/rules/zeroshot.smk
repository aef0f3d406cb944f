# Zero-shot accuracy (lm-eval, 7 tasks) of the same variants the perplexity rules score:
# results/zeroshot/ mirrors results/eval/ (dense.json, {calib}/{split}/{prune}/{label}.json).
# Tables: table12_run (part of `make run`: the rows in zeroshot.run_rows), table12 (every
# Table 1 row), table13 (the local comparison group changed, like table2); their specs are
# the perplexity specs with the zero-shot result files, so one writer serves both.

ZEROSHOT = config.get("zeroshot", {})
ZEROSHOT_TASKS = ZEROSHOT.get("tasks", ["boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"])
ZEROSHOT_LIMIT = ZEROSHOT.get("limit", 20)  # the schema default; null = full splits
# the local task files, so a changed file reruns the evaluation (none when loading from the hub)
ZEROSHOT_DATA = [f"{config['data_dir']}/zeroshot/{task}.jsonl" for task in ZEROSHOT_TASKS] if config["data_dir"] else []


def zeroshot_path(eval_path):
    """results/eval/<variant>.json -> results/zeroshot/<variant>.json"""
    prefix = f"{RESULTS}/eval/"
    if not eval_path.startswith(prefix):
        raise ValueError(f"not an evaluation result path: {eval_path}")
    return f"{RESULTS}/zeroshot/{eval_path[len(prefix):]}"


def as_zeroshot(spec, title):
    """The same table with zero-shot accuracies: every result file swapped for its zero-shot twin."""
    return {**spec, "measure": "zeroshot", "title": title,
            "rows": [{**row, "results": [zeroshot_path(p) for p in row["results"]]} for row in spec["rows"]]}


def row_kind(row):
    """dense, centralized, local_only, fedprllm_noscale or fedprllm_scale (zeroshot.run_rows)."""
    label = Path(row["results"][0]).stem
    if label.startswith("local_"):
        return "local_only"
    if label.startswith("fedprllm_"):
        return "fedprllm_" + label.rsplit("_", 1)[1]
    return label


def _limit_title():
    return "full splits" if ZEROSHOT_LIMIT is None else f"first {ZEROSHOT_LIMIT} documents per task"


def table12_spec():
    method, sparsity, _ = parse_prune(setting()[2])
    return as_zeroshot(table1_spec(), f"Table 12 analogue: zero-shot accuracy (%) of pruned {config['model']['name']} "
                                      f"({method}, {sparsity:.0%} sparsity; {_limit_title()})")


def table12_run_spec():
    """The rows of Table 12 that `make run` evaluates (zeroshot.run_rows); target table12 has all."""
    spec = table12_spec()
    kinds = ZEROSHOT.get("run_rows", ["dense", "centralized", "fedprllm_noscale"])
    spec["rows"] = [row for row in spec["rows"] if row_kind(row) in kinds]
    spec["title"] = spec["title"].replace("Table 12 analogue", "Table 12 analogue (rows of `make run`)")
    return spec


def table13_spec():
    return as_zeroshot(table2_spec(), "Table 13 analogue: zero-shot accuracy (%) when changing the local comparison "
                                      f"group (one-shot, no scaling; {_limit_title()})")


def _zeroshot_variant(wc):
    return variant_input(wc.calib, wc.split, wc.prune, wc.label)


def _zeroshot_inputs(wc):
    return {"model": MODEL_READY, "data": ZEROSHOT_DATA, "variant": _zeroshot_variant(wc)[0]}


ZEROSHOT_ARGS = (
    f"--tasks {' '.join(ZEROSHOT_TASKS)} --limit {ZEROSHOT_LIMIT if ZEROSHOT_LIMIT is not None else 'none'} "
    f"--batch-size {ZEROSHOT.get('batch_size', 8)} --seed {config['seed']} --data-dir {data_dir_arg()}"
)


rule zeroshot_dense:
    """Zero-shot accuracy of the dense base model."""
    input:
        model=MODEL_READY,
        data=ZEROSHOT_DATA,
    output:
        f"{RESULTS}/zeroshot/dense.json",
    params:
        model=model_folder,
        args=ZEROSHOT_ARGS,
    threads: config.get("threads", 2)
    resources:
        mem_mb=4000,
    conda:
        "../../envs/fedlib.yaml"
    log:
        f"{LOGS}/zeroshot/dense.log",
    benchmark:
        f"{BENCH}/zeroshot/dense.tsv"
    shell:
        "fedlib zeroshot --model {params.model} {params.args} --label dense "
        "--threads {threads} --out {output} > {log} 2>&1"


rule zeroshot:
    """Zero-shot accuracy of one variant: the base model with its mask (or weights) applied in memory."""
    input:
        unpack(_zeroshot_inputs),
    output:
        f"{RESULTS}/zeroshot/{{calib}}/{{split}}/{{prune}}/{{label}}.json",
    wildcard_constraints:
        # the labels of evaluate_perplexity
        label=r"centralized|local_\d+|random|fedspallm|standalone_\d+|fedprllm_(oneshot|iterative)_(row|layer|column|\d+of\d+)_(scale|noscale)",
    params:
        model=model_folder,
        variant=lambda wc: _zeroshot_variant(wc)[1],
        args=ZEROSHOT_ARGS,
    threads: config.get("threads", 2)
    resources:
        mem_mb=4000,
    conda:
        "../../envs/fedlib.yaml"
    log:
        f"{LOGS}/zeroshot/{{calib}}/{{split}}/{{prune}}/{{label}}.log",
    benchmark:
        f"{BENCH}/zeroshot/{{calib}}/{{split}}/{{prune}}/{{label}}.tsv"
    shell:
        "fedlib zeroshot --model {params.model} {params.variant} {params.args} "
        "--label {wildcards.label} --threads {threads} --out {output} > {log} 2>&1"
