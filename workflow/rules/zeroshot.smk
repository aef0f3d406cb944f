# Zero-shot accuracy rules (lm-eval); table specs: common.smk (fedlib.catalog).


rule zeroshot_dense:
    """Zero-shot accuracy of the dense base model."""
    input:
        model=MODEL_READY,
        data=ZEROSHOT_DATA,
    output:
        f"{RESULTS}/zeroshot/dense.json",
    log:
        f"{LOGS}/zeroshot/dense.log",
    benchmark:
        f"{BENCH}/zeroshot/dense.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("zeroshot", batch_size=ZEROSHOT.get("batch_size", 8)),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        args=ZEROSHOT_ARGS,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} zeroshot --model {{params.model}} {{params.args}} --label dense "
        "{params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule zeroshot:
    """Zero-shot accuracy of one variant: the base model with its mask (or weights) applied in memory."""
    input:
        unpack(zeroshot_inputs),
    output:
        f"{RESULTS}/zeroshot/{{calib}}/{{split}}/{{prune}}/{{label}}.json",
    log:
        f"{LOGS}/zeroshot/{{calib}}/{{split}}/{{prune}}/{{label}}.log",
    benchmark:
        f"{BENCH}/zeroshot/{{calib}}/{{split}}/{{prune}}/{{label}}.tsv"
    wildcard_constraints:
        label=SETTING_LABEL_PATTERN,
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("zeroshot", batch_size=ZEROSHOT.get("batch_size", 8)),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        variant=lambda wc: variant_of(wc)[1],
        args=ZEROSHOT_ARGS,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} zeroshot --model {{params.model}} {{params.variant}} {{params.args}} "
        "--label {wildcards.label} {params.placement} --threads {threads} --out {output} > {log} 2>&1"
