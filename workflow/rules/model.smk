rule materialize_model:
    output:
        config=f"resources/models/{{model}}/config.json",
        weights=f"resources/models/{{model}}/model.safetensors",
    params:
        name=lambda wc: wc.model.replace("--", "/"),
    conda:
        "../../envs/fedlib.yaml"
    log:
        f"{LOGS}/materialize_model/{{model}}.log",
    benchmark:
        f"{BENCH}/materialize_model/{{model}}.tsv"
    resources:
        mem_mb=4000,
    shell:
        "fedlib materialize-model --model {params.name} --out resources/models/{wildcards.model} > {log} 2>&1"
