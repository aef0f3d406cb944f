rule table1:
    """FedPrLLM Table 1 analogue (Markdown + CSV) for the default setting."""
    input:
        table_inputs(CATALOG.table1()),
    output:
        md=f"{REPORTS}/table1.md",
        csv=f"{REPORTS}/table1.csv",
        html=report(f"{REPORTS}/table1.html", caption="../report/table1.rst", category="Perplexity"),
    log:
        f"{LOGS}/report/table1.log",
    benchmark:
        f"{BENCH}/report/table1.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        spec=json.dumps(CATALOG.table1()),
    shell:
        f"{FEDLIB} report --spec {{params.spec:q}} --out-md {{output.md}} --out-csv {{output.csv}} "
        "--out-html {output.html} > {log} 2>&1"
