rule aggregate:
    """FedPrLLM server, one-shot: vote over all client masks, top-k per comparison group.
    The output keeps the vote counts, so scaled and unscaled variants share it."""
    input:
        model=MODEL_READY,
        masks=expand(f"{RESULTS}/masks/client_{{client}}.mask.safetensors", client=client_ids()),
    output:
        f"{RESULTS}/global/oneshot_{{group}}.mask.safetensors",
    params:
        model=model_dir(),
        sparsity=PRUNING["sparsity"],
        seed=config["seed"],
    resources:
        mem_mb=4000,
    log:
        f"{LOGS}/aggregate/oneshot_{{group}}.log",
    benchmark:
        f"{BENCH}/aggregate/oneshot_{{group}}.tsv"
    shell:
        "{FEDLIB} aggregate --model {params.model} --strategy fedprllm --group {wildcards.group} "
        "--sparsity {params.sparsity} --seed {params.seed} --out {output} {input.masks} > {log} 2>&1"
