rule materialize_model:
    """The model as a safetensors folder, once. Runs on the submit host: it may download from
    the hub, which cluster nodes often cannot reach."""
    output:
        config=f"resources/models/{{model}}/config.json",
        weights=f"resources/models/{{model}}/model.safetensors",
    log:
        f"{LOGS}/materialize_model/{{model}}.log",
    benchmark:
        f"{BENCH}/materialize_model/{{model}}.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    resources:
        mem_mb=4000,
    params:
        name=lambda wc: wc.model.replace("--", "/"),
    shell:
        f"{FEDLIB} materialize-model --model {{params.name}} --out resources/models/{{wildcards.model}} > {{log}} 2>&1"
