rule table1:
    """FedPrLLM Table 1 analogue (Markdown + CSV)."""
    input:
        expand(f"{RESULTS}/eval/{{label}}.json", label=table1_labels()),
    output:
        md=f"{REPORTS}/table1.md",
        csv=f"{REPORTS}/table1.csv",
    params:
        context=lambda wc: json.dumps(report_context()),
    log:
        f"{LOGS}/report/table1.log",
    benchmark:
        f"{BENCH}/report/table1.tsv"
    shell:
        "{FEDLIB} report --context '{params.context}' --out-md {output.md} --out-csv {output.csv} "
        "{input} > {log} 2>&1"
