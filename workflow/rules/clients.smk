rule client_mask:
    """What a client computes on its own machine and sends: its mask file."""
    input:
        model=MODEL_READY,
        calib=f"{RESULTS}/shards/{{calib}}/{{split}}/client_{{client}}.safetensors",
    output:
        f"{RESULTS}/masks/{{calib}}/{{split}}/{{prune}}/client_{{client}}.mask.safetensors",
    log:
        f"{LOGS}/client_mask/{{calib}}/{{split}}/{{prune}}/{{client}}.log",
    benchmark:
        f"{BENCH}/client_mask/{{calib}}/{{split}}/{{prune}}/{{client}}.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["calib"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=mask_args,
        upload=CATALOG.upload_args(),
        seed=config["seed"],
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} client-mask --model {{params.model}} --calib {{input.calib}} {{params.pruning}} {{params.upload}} "
        "--seed {params.seed} --client-id {wildcards.client} --batch-size {params.batch_size} "
        "{params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule centralized_mask:
    """Centralized baseline: the same computation on the whole calibration pool."""
    input:
        model=MODEL_READY,
        calib=f"{RESULTS}/pools/{{calib}}.safetensors",
    output:
        f"{RESULTS}/masks/{{calib}}/central/{{prune}}/centralized.mask.safetensors",
    log:
        f"{LOGS}/centralized_mask/{{calib}}/{{prune}}.log",
    benchmark:
        f"{BENCH}/centralized_mask/{{calib}}/{{prune}}.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["calib"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=mask_args,
        seed=config["seed"],
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} client-mask --model {{params.model}} --calib {{input.calib}} {{params.pruning}} "
        "--seed {params.seed} --client-id centralized --batch-size {params.batch_size} "
        "{params.placement} --threads {threads} --out {output} > {log} 2>&1"
