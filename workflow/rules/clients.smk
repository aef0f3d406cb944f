PRUNING = config["pruning"]


def calibration_file(wildcards):
    if wildcards.source == "centralized":
        return f"{RESULTS}/data/pool.safetensors"
    return f"{RESULTS}/data/{wildcards.source}.safetensors"


rule client_mask:
    """What a client computes on its own machine and sends: its mask file. The Centralized
    baseline is the same computation on the whole pool."""
    input:
        model=MODEL_READY,
        calib=calibration_file,
    output:
        f"{RESULTS}/masks/{{source}}.mask.safetensors",
    wildcard_constraints:
        source=r"client_\d+|centralized",
    params:
        model=model_dir(),
        method=PRUNING["method"],
        sparsity=PRUNING["sparsity"],
        group=PRUNING["local_group"],
        seed=config["seed"],
        batch_size=PRUNING.get("batch_size", 8),
        client_id=lambda wc: wc.source.replace("client_", ""),
    threads: config.get("threads", 2)
    resources:
        mem_mb=4000,
    log:
        f"{LOGS}/client_mask/{{source}}.log",
    benchmark:
        f"{BENCH}/client_mask/{{source}}.tsv"
    shell:
        "{FEDLIB} client-mask --model {params.model} --calib {input.calib} --method {params.method} "
        "--sparsity {params.sparsity} --group {params.group} --seed {params.seed} "
        "--client-id {params.client_id} --batch-size {params.batch_size} --threads {threads} "
        "--out {output} > {log} 2>&1"
