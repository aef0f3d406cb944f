def table_rule_inputs(spec):
    return sorted({path for row in spec["rows"] for path in row["results"]})


def fedprllm_row(calib, split, prune, label):
    _, strategy, group, scale = label.split("_")
    return {
        "cells": ["FedPrLLM", group_arg(group).capitalize(), "One-shot" if strategy == "oneshot" else "Iterative",
                  "✓" if scale == "scale" else "✗"],
        "results": [eval_json(calib, split, prune, label)],
    }


def baseline_rows(calib, split, prune, blanks=3, dense=True):
    rows = [{"cells": ["Dense"] + ["-"] * blanks, "results": [eval_json(calib, split, prune, "dense")]}] if dense else []
    rows.append({"cells": ["Centralized"] + ["-"] * blanks, "results": [eval_json(calib, split, prune, "centralized")]})
    local = local_only_labels(split)
    rows.append({
        "cells": [f"Local-only (mean ± std, {len(local)} clients)"] + ["-"] * blanks,
        "results": [eval_json(calib, split, prune, label) for label in local],
    })
    return rows


def table1_spec(strategies=None):
    calib, split, prune = setting()
    method, sparsity, _ = parse_prune(prune)
    rows = baseline_rows(calib, split, prune)
    rows += [fedprllm_row(calib, split, prune, label) for label in fedprllm_labels(strategies)]
    return {
        "title": f"Table 1 analogue: perplexity of pruned {config['model']['name']} ({method}, {sparsity:.0%} sparsity)",
        "context": report_context(calib, split, prune),
        "columns": ["Method", "Comparison group", "Pruning strategy", "Weight scaling"],
        "rows": rows,
    }


rule table1:
    """FedPrLLM Table 1 analogue (Markdown + CSV) for the default setting."""
    input:
        table_rule_inputs(table1_spec()),
    output:
        md=f"{REPORTS}/table1.md",
        csv=f"{REPORTS}/table1.csv",
        html=report(f"{REPORTS}/table1.html", caption="../report/table1.rst", category="Perplexity"),
    params:
        spec=json.dumps(table1_spec()),
    conda:
        "../../envs/fedlib.yaml"
    log:
        f"{LOGS}/report/table1.log",
    benchmark:
        f"{BENCH}/report/table1.tsv"
    shell:
        "fedlib report --spec {params.spec:q} --out-md {output.md} --out-csv {output.csv} "
        "--out-html {output.html} > {log} 2>&1"
