rule aggregate:
    """The server of a strategy that aggregates client mask files (fedlib.strategy_options.STRATEGY_SENDS), one
    round over every block: FedPrLLM votes over all client masks, top-k per comparison group.
    The output keeps the vote counts, so scaled and unscaled variants share it; the outlier
    report beside it gives each client's distance to the consensus (fedlib.server.robust)."""
    input:
        model=MODEL_READY,
        masks=client_masks,
    output:
        mask=f"{RESULTS}/global/{{calib}}/{{split}}/{{prune}}/{{strategy}}_oneshot_{{group}}.mask.safetensors",
        report=f"{RESULTS}/global/{{calib}}/{{split}}/{{prune}}/{{strategy}}_oneshot_{{group}}.mask.clients.json",
    log:
        f"{LOGS}/aggregate/{{calib}}/{{split}}/{{prune}}/{{strategy}}_oneshot_{{group}}.log",
    benchmark:
        f"{BENCH}/aggregate/{{calib}}/{{split}}/{{prune}}/{{strategy}}_oneshot_{{group}}.tsv"
    wildcard_constraints:
        strategy=MASK_STRATEGY_PATTERN,
    conda:
        "../../envs/fedlib.yaml"
    resources:
        mem_mb=job_mem_mb("layers"),
    params:
        model=model_folder,
        sparsity=lambda wc: Prune.parse(wc.prune).sparsity,
        group=lambda wc: group_arg(wc.group),
        seed=config["seed"],
        cohort=lambda wc: CATALOG.cohort_args(wc.prune),
        options=CATALOG.server_args(),
    shell:
        f"{FEDLIB} aggregate --model {{params.model}} --strategy {{wildcards.strategy}} --server-group {{params.group}} "
        "--sparsity {params.sparsity} --seed {params.seed} {params.cohort} {params.options} --out {output.mask} "
        "--report {output.report} {input.masks} > {log} 2>&1"


rule iterative:
    """FedPrLLM iterative pruning, simulated: one round per decoder block; every client
    continues from the global mask (scaled blocks for `iterative-scaled`)."""
    input:
        model=MODEL_READY,
        calib=client_shards,
    output:
        mask=f"{RESULTS}/global/{{calib}}/{{split}}/{{prune}}/fedprllm_{{run}}_{{group}}.mask.safetensors",
        record=f"{RESULTS}/global/{{calib}}/{{split}}/{{prune}}/fedprllm_{{run}}_{{group}}.rounds.json",
    log:
        f"{LOGS}/iterative/{{calib}}/{{split}}/{{prune}}/fedprllm_{{run}}_{{group}}.log",
    benchmark:
        f"{BENCH}/iterative/{{calib}}/{{split}}/{{prune}}/fedprllm_{{run}}_{{group}}.tsv"
    wildcard_constraints:
        run=r"iterative|iterative-scaled",
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["calib"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=mask_args,
        group=lambda wc: group_arg(wc.group),
        scale=lambda wc: "--scale" if wc.run == "iterative-scaled" else "",
        seed=config["seed"],
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} iterative --model {{params.model}} --calib {{input.calib}} {{params.pruning}} "
        "--server-group {params.group} {params.scale} --seed {params.seed} --batch-size {params.batch_size} "
        "{params.placement} --threads {threads} --out {output.mask} --record {output.record} > {log} 2>&1"


rule fedspallm:
    """FedSpaLLM, simulated: SparseGPT-with-update clients send weights + masks; l0 aggregation,
    adaptive mask expansion; studies.fedspallm.rounds rounds. With studies.fedspallm.resources,
    each client prunes a sampled fraction of the blocks per round (layer sampling, Algorithm 1);
    without, every client prunes every block and the job also keeps the first clients' own
    models (the Standalone baseline) until they are evaluated (they exist only then)."""
    input:
        model=MODEL_READY,
        calib=client_shards,
    output:
        weights=f"{RESULTS}/fedspallm/{{calib}}/{{split}}/{{prune}}/global.weights.safetensors",
        record=f"{RESULTS}/fedspallm/{{calib}}/{{split}}/{{prune}}/rounds.json",
        standalone=[
            temp(f"{RESULTS}/fedspallm/{{calib}}/{{split}}/{{prune}}/{label}.weights.safetensors")
            for label in CATALOG.fedspallm_standalone()
        ],
    log:
        f"{LOGS}/fedspallm/{{calib}}/{{split}}/{{prune}}.log",
    benchmark:
        f"{BENCH}/fedspallm/{{calib}}/{{split}}/{{prune}}.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("blocks+weights", tokens=["calib"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        args=lambda wc: CATALOG.fedspallm_args(wc.split, wc.prune),
        standalone=lambda wc, output: f"--standalone-out {' '.join(output.standalone)}" if output.standalone else "",
        seed=config["seed"],
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} fedspallm --model {{params.model}} --calib {{input.calib}} {{params.args}} "
        "--seed {params.seed} --batch-size {params.batch_size} "
        "{params.placement} --threads {threads} {params.standalone} --out {output.weights} "
        "--record {output.record} > {log} 2>&1"


rule random_mask:
    """Random pruning baseline (FedSpaLLM tables): a seeded random mask per layer."""
    input:
        model=MODEL_READY,
    output:
        f"{RESULTS}/random/{{sparsity}}.mask.safetensors",
    log:
        f"{LOGS}/random_mask/{{sparsity}}.log",
    benchmark:
        f"{BENCH}/random_mask/{{sparsity}}.tsv"
    wildcard_constraints:
        sparsity=r"[0-9.]+",
    conda:
        "../../envs/fedlib.yaml"
    resources:
        mem_mb=job_mem_mb("layers"),
    params:
        model=model_folder,
        seed=config["seed"],
    shell:
        f"{FEDLIB} random-mask --model {{params.model}} --sparsity {{wildcards.sparsity}} --seed {{params.seed}} "
        "--out {output} > {log} 2>&1"
