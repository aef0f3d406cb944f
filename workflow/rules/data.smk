MODEL_READY = f"{model_dir()}/config.json"


rule calibration_pool:
    """All calibration samples (seeded random windows); the Centralized baseline uses them all."""
    input:
        MODEL_READY,
    output:
        f"{RESULTS}/data/pool.safetensors",
    params:
        model=model_dir(),
        data_dir=data_dir_arg(),
        dataset=config["calibration"]["dataset"],
        nsamples=config["calibration"]["nsamples"],
        seqlen=config["calibration"]["seqlen"],
        seed=config["seed"],
        docs=span_arg("--docs", config["calibration"].get("c4_docs")),
    log:
        f"{LOGS}/calibration_pool.log",
    benchmark:
        f"{BENCH}/calibration_pool.tsv"
    shell:
        "{FEDLIB} calibration-pool --model {params.model} --data-dir {params.data_dir} "
        "--dataset {params.dataset} --nsamples {params.nsamples} --seqlen {params.seqlen} "
        "--seed {params.seed} {params.docs} --out {output} > {log} 2>&1"


rule client_data:
    """One client's private calibration shard."""
    input:
        f"{RESULTS}/data/pool.safetensors",
    output:
        f"{RESULTS}/data/client_{{client}}.safetensors",
    params:
        n=config["clients"]["n"],
        partition=config["clients"].get("partition", "iid"),
        seed=config["seed"],
    log:
        f"{LOGS}/client_data/{{client}}.log",
    benchmark:
        f"{BENCH}/client_data/{{client}}.tsv"
    shell:
        "{FEDLIB} client-data --pool {input} --n-clients {params.n} --client {wildcards.client} "
        "--partition {params.partition} --seed {params.seed} --out {output} > {log} 2>&1"


rule eval_windows:
    input:
        MODEL_READY,
    output:
        f"{RESULTS}/eval_windows/{{dataset}}.safetensors",
    params:
        model=model_dir(),
        data_dir=data_dir_arg(),
        seqlen=config["evaluation"]["seqlen"],
        windows=lambda wc: f"--windows {config['evaluation']['windows']}" if config["evaluation"].get("windows") else "",
        c4_docs=span_arg("--c4-docs", config["evaluation"].get("c4_docs")),
    log:
        f"{LOGS}/eval_windows/{{dataset}}.log",
    benchmark:
        f"{BENCH}/eval_windows/{{dataset}}.tsv"
    shell:
        "{FEDLIB} eval-windows --model {params.model} --data-dir {params.data_dir} "
        "--dataset {wildcards.dataset} --seqlen {params.seqlen} {params.windows} {params.c4_docs} "
        "--out {output} > {log} 2>&1"
