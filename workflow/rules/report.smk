def table1_inputs(wildcards=None):
    calib, split, prune = setting()
    labels = ["dense", "centralized", *local_only_labels(split), *fedprllm_labels()]
    return [eval_json(calib, split, prune, label) for label in labels]


rule table1:
    """FedPrLLM Table 1 analogue (Markdown + CSV) for the default setting."""
    input:
        table1_inputs,
    output:
        md=f"{REPORTS}/table1.md",
        csv=f"{REPORTS}/table1.csv",
    params:
        context=lambda wc: json.dumps(report_context(*setting())),
    conda:
        "../../envs/fedlib.yaml"
    log:
        f"{LOGS}/report/table1.log",
    benchmark:
        f"{BENCH}/report/table1.tsv"
    shell:
        "{FEDLIB} report --context {params.context:q} --out-md {output.md} --out-csv {output.csv} "
        "{input} > {log} 2>&1"
