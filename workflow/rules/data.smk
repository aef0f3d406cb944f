rule calibration_pool:
    """All calibration samples of a setting (seeded random windows); Centralized uses them all."""
    input:
        model=MODEL_READY,
    output:
        f"{RESULTS}/pools/{{calib}}.safetensors",
    log:
        f"{LOGS}/calibration_pool/{{calib}}.log",
    benchmark:
        f"{BENCH}/calibration_pool/{{calib}}.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        data_dir=data_dir_arg(),
        dataset=lambda wc: Calib.parse(wc.calib).dataset,
        nsamples=lambda wc: Calib.parse(wc.calib).nsamples,
        seqlen=lambda wc: Calib.parse(wc.calib).seqlen,
        seed=lambda wc: Calib.parse(wc.calib).draw_seed(config["seed"]),
        docs=span_arg("--c4-docs", config["calibration"].get("c4_docs")),
    shell:
        f"{FEDLIB} calibration-pool --model {{params.model}} --data-dir {{params.data_dir}} "
        "--dataset {params.dataset} --nsamples {params.nsamples} --seqlen {params.seqlen} "
        "--seed {params.seed} {params.docs} --out {output} > {log} 2>&1"


rule client_data:
    """One client's private calibration shard."""
    input:
        f"{RESULTS}/pools/{{calib}}.safetensors",
    output:
        f"{RESULTS}/shards/{{calib}}/{{split}}/client_{{client}}.safetensors",
    log:
        f"{LOGS}/client_data/{{calib}}/{{split}}/{{client}}.log",
    benchmark:
        f"{BENCH}/client_data/{{calib}}/{{split}}/{{client}}.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        n=lambda wc: Split.parse(wc.split).clients,
        partition=lambda wc: Split.parse(wc.split).partition,
        seed=lambda wc: Calib.parse(wc.calib).draw_seed(config["seed"]),
    shell:
        f"{FEDLIB} client-data --pool {{input}} --n-clients {{params.n}} --client {{wildcards.client}} "
        "--partition {params.partition} --seed {params.seed} --out {output} > {log} 2>&1"


rule eval_windows:
    input:
        model=MODEL_READY,
    output:
        f"{RESULTS}/eval_windows/{{dataset}}.safetensors",
    log:
        f"{LOGS}/eval_windows/{{dataset}}.log",
    benchmark:
        f"{BENCH}/eval_windows/{{dataset}}.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        data_dir=data_dir_arg(),
        seqlen=EVAL["seqlen"],
        windows=f"--windows {EVAL['windows']}" if EVAL.get("windows") else "",
        c4_docs=span_arg("--c4-docs", EVAL.get("c4_docs")),
    shell:
        f"{FEDLIB} eval-windows --model {{params.model}} --data-dir {{params.data_dir}} "
        "--dataset {wildcards.dataset} --seqlen {params.seqlen} {params.windows} {params.c4_docs} "
        "--out {output} > {log} 2>&1"
