rule evaluate_dense:
    input:
        model=MODEL_READY,
        windows=EVAL_WINDOWS,
    output:
        f"{RESULTS}/eval/dense.json",
    log:
        f"{LOGS}/evaluate/dense.log",
    benchmark:
        f"{BENCH}/evaluate/dense.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["windows"], batch_size=EVAL.get("batch_size", 1), logits=True),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        batch_size=EVAL.get("batch_size", 1),
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} evaluate --model {{params.model}} --windows {{input.windows}} --label dense "
        "--batch-size {params.batch_size} {params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule evaluate_perplexity:
    """Perplexity of one variant: the base model with its mask applied in memory."""
    input:
        unpack(evaluation_inputs),
    output:
        f"{RESULTS}/eval/{{calib}}/{{split}}/{{prune}}/{{label}}.json",
    log:
        f"{LOGS}/evaluate/{{calib}}/{{split}}/{{prune}}/{{label}}.log",
    benchmark:
        f"{BENCH}/evaluate/{{calib}}/{{split}}/{{prune}}/{{label}}.tsv"
    wildcard_constraints:
        label=SETTING_LABEL_PATTERN,
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["windows"], batch_size=EVAL.get("batch_size", 1), logits=True),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        variant=lambda wc: variant_of(wc)[1],
        batch_size=EVAL.get("batch_size", 1),
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} evaluate --model {{params.model}} {{params.variant}} "
        "--windows {input.windows} --label {wildcards.label} --batch-size {params.batch_size} "
        "{params.placement} --threads {threads} --out {output} > {log} 2>&1"
