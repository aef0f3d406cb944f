EVAL = config["evaluation"]


def evaluation_inputs(wildcards):
    mask, _ = variant_mask(wildcards.label)
    inputs = {
        "model": MODEL_READY,
        "windows": expand(f"{RESULTS}/eval_windows/{{dataset}}.safetensors", dataset=EVAL["datasets"]),
    }
    if mask:
        inputs["mask"] = mask
    return inputs


rule evaluate_perplexity:
    """Perplexity of one variant: the base model with its mask applied in memory."""
    input:
        unpack(evaluation_inputs),
    output:
        f"{RESULTS}/eval/{{label}}.json",
    params:
        model=model_dir(),
        mask=lambda wc: f"--mask {variant_mask(wc.label)[0]}" if variant_mask(wc.label)[0] else "",
        scale=lambda wc: "--scale" if variant_mask(wc.label)[1] else "",
        batch_size=EVAL.get("batch_size", 1),
    threads: config.get("threads", 2)
    resources:
        mem_mb=4000,
    log:
        f"{LOGS}/evaluate/{{label}}.log",
    benchmark:
        f"{BENCH}/evaluate/{{label}}.tsv"
    shell:
        "{FEDLIB} evaluate --model {params.model} {params.mask} {params.scale} "
        "--windows {input.windows} --label {wildcards.label} --batch-size {params.batch_size} "
        "--threads {threads} --out {output} > {log} 2>&1"
