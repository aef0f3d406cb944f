def client_masks(wc):
    _, n = parse_split(wc.split)
    return [f"{RESULTS}/masks/{wc.calib}/{wc.split}/{wc.prune}/client_{i}.mask.safetensors" for i in range(n)]


rule aggregate:
    """FedPrLLM server, one-shot: vote over all client masks, top-k per comparison group.
    The output keeps the vote counts, so scaled and unscaled variants share it."""
    input:
        model=MODEL_READY,
        masks=client_masks,
    output:
        f"{RESULTS}/global/{{calib}}/{{split}}/{{prune}}/oneshot_{{group}}.mask.safetensors",
    params:
        model=model_dir(),
        sparsity=lambda wc: parse_prune(wc.prune)[1],
        group=lambda wc: group_arg(wc.group),
        seed=config["seed"],
    resources:
        mem_mb=4000,
    conda:
        "../../envs/fedlib.yaml"
    log:
        f"{LOGS}/aggregate/{{calib}}/{{split}}/{{prune}}/oneshot_{{group}}.log",
    benchmark:
        f"{BENCH}/aggregate/{{calib}}/{{split}}/{{prune}}/oneshot_{{group}}.tsv"
    shell:
        "{FEDLIB} aggregate --model {params.model} --strategy fedprllm --group {params.group} "
        "--sparsity {params.sparsity} --seed {params.seed} --out {output} {input.masks} > {log} 2>&1"
