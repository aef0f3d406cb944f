# Named study targets beyond Table 1 (FedPrLLM Tables 2, 6, 10, 11, 14; Figures 2-3).
# Each is one perplexity table built from the same rules as Table 1, on other settings.

STUDIES = config.get("studies", {})


def _with(calib=None, split=None, prune=None, **prune_changes):
    c, s, p = setting(calib, split, prune)
    if prune_changes:
        method, sparsity, group = parse_prune(p)
        method = prune_changes.get("method", method)
        sparsity = prune_changes.get("sparsity", sparsity)
        group = prune_changes.get("group", group)
        p = f"{method}-{sparsity}-{group}"
    return c, s, p


def table2_spec():
    """Clients prune with another comparison group; the server tries all three."""
    rows = []
    for local in STUDIES.get("local_groups", ["layer", "column"]):
        calib, split, prune = _with(group=local)
        for row in baseline_rows(calib, split, prune, blanks=1, dense=False):
            rows.append({"cells": [local.capitalize()] + row["cells"], "results": row["results"]})
        for group in ("layer", "row", "column"):
            label = f"fedprllm_oneshot_{group}_noscale"
            rows.append({"cells": [local.capitalize(), "FedPrLLM", group.capitalize()],
                         "results": [eval_json(calib, split, prune, label)]})
    return {
        "title": "Table 2 analogue: changing the local comparison group (one-shot, no scaling)",
        "context": report_context(*setting(), title_extra="; local group varied per row"),
        "columns": ["Local comparison group", "Method", "Server comparison group"],
        "rows": rows,
    }


def table6_spec():
    rows = []
    for sparsity in STUDIES.get("sparsities", [0.6, 0.7]):
        calib, split, prune = _with(sparsity=sparsity)
        for row in baseline_rows(calib, split, prune, dense=False) + [
            fedprllm_row(calib, split, prune, label) for label in fedprllm_labels()
        ]:
            rows.append({"cells": [f"{sparsity:.0%}"] + row["cells"], "results": row["results"]})
    return {
        "title": "Table 6 analogue: higher sparsity ratios",
        "context": report_context(*setting(), title_extra="; sparsity varied per row"),
        "columns": ["Sparsity", "Method", "Comparison group", "Pruning strategy", "Weight scaling"],
        "rows": rows,
    }


def table10_spec():
    rows = []
    for method in STUDIES.get("methods", ["sparsegpt", "owl", "besa"]):
        calib, split, prune = _with(method=method)
        for row in baseline_rows(calib, split, prune, dense=False) + [
            fedprllm_row(calib, split, prune, label) for label in fedprllm_labels()
        ]:
            rows.append({"cells": [method] + row["cells"], "results": row["results"]})
    return {
        "title": "Table 10 analogue: other local pruning methods",
        "context": report_context(*setting(), title_extra="; local method varied per row"),
        "columns": ["Local method", "Method", "Comparison group", "Pruning strategy", "Weight scaling"],
        "rows": rows,
    }


def table11_spec():
    rows = []
    for method in STUDIES.get("methods", ["sparsegpt", "owl", "besa"]):
        for local in STUDIES.get("local_groups", ["layer", "column"]):
            calib, split, prune = _with(method=method, group=local)
            for row in baseline_rows(calib, split, prune, blanks=1, dense=False):
                rows.append({"cells": [method, local.capitalize()] + row["cells"], "results": row["results"]})
            for group in ("layer", "row", "column"):
                rows.append({"cells": [method, local.capitalize(), "FedPrLLM", group.capitalize()],
                             "results": [eval_json(calib, split, prune, f"fedprllm_oneshot_{group}_noscale")]})
    return {
        "title": "Table 11 analogue: other local methods with another local comparison group",
        "context": report_context(*setting(), title_extra="; local method and group varied per row"),
        "columns": ["Local method", "Local comparison group", "Method", "Server comparison group"],
        "rows": rows,
    }


def table14_spec():
    """Ultra-low data: every client holds a single calibration sample."""
    clients = config["clients"]["n"]
    c = config["calibration"]
    calib, split, prune = _with(calib=f"{c['dataset']}-{clients}x{c['seqlen']}", split=f"iid-{clients}")
    rows = baseline_rows(calib, split, prune)
    rows += [fedprllm_row(calib, split, prune, label) for label in fedprllm_labels()]
    return {
        "title": "Table 14 analogue: ultra-low data regime (1 calibration sample per client)",
        "context": report_context(calib, split, prune),
        "columns": ["Method", "Comparison group", "Pruning strategy", "Weight scaling"],
        "rows": rows,
    }


def fedprllm_name(label):
    """fedprllm_oneshot_layer_scale -> FedPrLLM (layer, one-shot, scaling)"""
    _, strategy, group, scale = label.split("_")
    return f"FedPrLLM ({group_arg(group)}, {'one-shot' if strategy == 'oneshot' else 'iterative'}" + (
        ", scaling)" if scale == "scale" else ")")


SWEEP_SERIES = [("fedprllm_oneshot_layer_noscale", "FedPrLLM (layer, one-shot)"), ("centralized", "Centralized")]


def _sweep_spec(title, xlabel, points, series=SWEEP_SERIES, xscale="log2", xformat="int"):
    """A sweep as a table and a plot spec: rows carry x and series (fedlib plot); Dense is the
    plot's reference line."""
    rows = []
    for x, (calib, split, prune) in points:
        cell = f"{x:.0%}" if xformat == "percent" else str(x)
        for label, name in series:
            rows.append({"cells": [cell, name], "x": x, "series": name,
                         "results": [eval_json(calib, split, prune, label)]})
        local = local_only_labels(split)
        rows.append({"cells": [cell, f"Local-only (mean ± std, {len(local)} clients)"], "x": x,
                     "series": "Local-only (mean ± std)",
                     "results": [eval_json(calib, split, prune, l) for l in local]})
    return {"title": title, "context": report_context(*setting(), title_extra=f"; {xlabel} varied per row"),
            "columns": [xlabel, "Method"], "rows": rows,
            "reference": [{"series": "Dense", "results": [eval_json(*setting(), "dense")]}],
            "plot": {"xlabel": xlabel, "xscale": xscale, "xformat": xformat}}


def figure2_spec():
    c = config["calibration"]
    calib = setting()[0]
    points = [(n, _with(split=f"iid-{n}")) for n in STUDIES.get("clients_sweep", [2, 4, 8, 16, 32])
              if n <= c["nsamples"]]
    return _sweep_spec(f"Figure 2 analogue: number of clients (total {c['nsamples']} samples)", "Clients", points)


def figure3_spec():
    c = config["calibration"]
    points = [(t, _with(calib=f"{c['dataset']}-{t}x{c['seqlen']}", split=f"iid-{t // 2}"))
              for t in STUDIES.get("samples_sweep", [4, 8, 16, 32])]
    return _sweep_spec("Figure 3 analogue: number of calibration samples (clients = half)", "Samples", points)


def sparsity_plot_spec():
    """Perplexity vs sparsity (paper Tables 6-8 as a figure): the default sparsity and studies.sparsities."""
    sparsities = sorted({config["pruning"]["sparsity"], *STUDIES.get("sparsities", [0.6, 0.7])})
    series = [("centralized", "Centralized")] + [(label, fedprllm_name(label)) for label in fedprllm_labels()]
    points = [(s, _with(sparsity=s)) for s in sparsities]
    return _sweep_spec("Perplexity vs sparsity (paper Tables 6-8)", "Sparsity", points, series,
                       xscale="linear", xformat="percent")


def plot_rule_inputs(spec):
    return sorted({p for row in spec["rows"] + spec.get("reference", []) for p in row["results"]})


def _noniid_setting(**prune_changes):
    n = STUDIES.get("noniid", {})
    c = config["calibration"]
    return _with(calib=f"mix-{n.get('per_dataset', 8)}x{c['seqlen']}",
                 split=f"dir{n.get('alpha', 5)}-{n.get('clients', 12)}", **prune_changes)


NONIID_NOTE = ("; non-IID pool: WikiText-2 (offline: its validation split), C4 train documents "
               "and PTB train, split over clients by Dirichlet(alpha) per source")


def table4_spec():
    calib, split, prune = _noniid_setting()
    rows = baseline_rows(calib, split, prune, dense=False)
    rows += [fedprllm_row(calib, split, prune, label) for label in fedprllm_labels()]
    return {
        "title": "Table 4 analogue: non-IID calibration data",
        "context": report_context(calib, split, prune, title_extra=NONIID_NOTE),
        "columns": ["Method", "Comparison group", "Pruning strategy", "Weight scaling"],
        "rows": rows,
    }


def table5_spec():
    rows = []
    for local in STUDIES.get("local_groups", ["layer", "column"]):
        calib, split, prune = _noniid_setting(group=local)
        for row in baseline_rows(calib, split, prune, blanks=1, dense=False):
            rows.append({"cells": [local.capitalize()] + row["cells"], "results": row["results"]})
        for group in ("layer", "row", "column"):
            rows.append({"cells": [local.capitalize(), "FedPrLLM", group.capitalize()],
                         "results": [eval_json(calib, split, prune, f"fedprllm_oneshot_{group}_noscale")]})
    return {
        "title": "Table 5 analogue: non-IID data, changing the local comparison group (one-shot, no scaling)",
        "context": report_context(*_noniid_setting(), title_extra=NONIID_NOTE + "; local group varied per row"),
        "columns": ["Local comparison group", "Method", "Server comparison group"],
        "rows": rows,
    }


def fedspallm_spec(clients):
    """FedSpaLLM Tables 1-3: Random, Standalone (mean over clients' own models), FedSpaLLM."""
    f = STUDIES.get("fedspallm", {})
    standalone = [f"standalone_{i}" for i in range(min(clients, f.get("standalone_clients", 4)))]
    rows = []
    for sparsity in f.get("sparsities", [0.5, 0.6, 0.7, 0.8]):
        calib, split, prune = _with(split=f"iid-{clients}", method="sparsegpt_update", sparsity=sparsity, group="layer")
        rows.append({"cells": [f"{sparsity:.0%}", "Random"], "results": [eval_json(calib, split, prune, "random")]})
        rows.append({"cells": [f"{sparsity:.0%}", f"Standalone (mean ± std, {len(standalone)} clients)"],
                     "results": [eval_json(calib, split, prune, label) for label in standalone]})
        rows.append({"cells": [f"{sparsity:.0%}", "FedSpaLLM"], "results": [eval_json(calib, split, prune, "fedspallm")]})
    calib, split, prune = _with(split=f"iid-{clients}", method="sparsegpt_update", group="layer")
    return {
        "title": f"FedSpaLLM Table analogue: {clients} clients, Random / Standalone / FedSpaLLM",
        "context": report_context(calib, split, prune, title_extra=(
            f"; SparseGPT with OBS update on every client, l0 aggregation + mask expansion, "
            f"{f.get('rounds', 1)} round(s); sparsity varied per row")),
        "columns": ["Sparsity", "Method"],
        "rows": rows,
    }


STUDY_SPECS = {
    "table1_full": lambda: table1_spec(("oneshot", "iterative")),
    "table12_run": table12_run_spec,  # zeroshot.smk; part of `make run`
    "table12": table12_spec,
    "table13": table13_spec,
    "table2": table2_spec,
    "table6": table6_spec,
    "table10": table10_spec,
    "table11": table11_spec,
    "table14": table14_spec,
    "figure2": figure2_spec,
    "figure3": figure3_spec,
    "table4": table4_spec,
    "table5": table5_spec,
    **{f"fedspallm{n}": (lambda n=n: fedspallm_spec(n)) for n in STUDIES.get("fedspallm", {}).get("clients", [4, 8, 16])},
}


# PNG plots of the named targets that are figures in the papers (`fedlib plot`, same specs)
STUDY_PLOTS = {"figure2": figure2_spec, "figure3": figure3_spec, "table6": sparsity_plot_spec}


def study_category(name):
    """Category of a study's table / plot in the Snakemake report (`snakemake --report`)."""
    if name.startswith("table12") or name == "table13":
        return "Zero-shot"
    if name in STUDY_PLOTS:
        return "Sweeps"
    if name.startswith("fedspallm"):
        return "FedSpaLLM"
    return "Perplexity"


def study_caption(name, kind="table"):
    """workflow/report/<name>.rst when there is one, else the generic caption of its kind."""
    own = Path(workflow.basedir) / "workflow" / "report" / f"{name}.rst"
    return f"../report/{name}.rst" if own.is_file() else f"../report/study_{kind}.rst"


for _name, _spec in STUDY_SPECS.items():

    rule:
        name:
            f"study_{_name}"
        input:
            table_rule_inputs(_spec()),
        output:
            md=f"{REPORTS}/{_name}.md",
            csv=f"{REPORTS}/{_name}.csv",
            html=report(f"{REPORTS}/{_name}.html", caption=study_caption(_name), category=study_category(_name)),
        params:
            spec=json.dumps(_spec()),
        conda:
            "../../envs/fedlib.yaml"
        log:
            f"{LOGS}/report/{_name}.log",
        benchmark:
            f"{BENCH}/report/{_name}.tsv"
        shell:
            "fedlib report --spec {params.spec:q} --out-md {output.md} --out-csv {output.csv} "
            "--out-html {output.html} > {log} 2>&1"


for _name, _spec in STUDY_PLOTS.items():

    rule:
        name:
            f"plot_{_name}"
        input:
            plot_rule_inputs(_spec()),
        output:
            report(f"{REPORTS}/{_name}.png", caption=study_caption(f"{_name}_plot", "plot"), category="Sweeps"),
        params:
            spec=json.dumps(_spec()),
        conda:
            "../../envs/fedlib.yaml"
        log:
            f"{LOGS}/report/{_name}_plot.log",
        benchmark:
            f"{BENCH}/report/{_name}_plot.tsv"
        shell:
            "fedlib plot --spec {params.spec:q} --out {output} > {log} 2>&1"


for _name in STUDY_SPECS:

    rule:
        name:
            _name
        input:
            f"{REPORTS}/{_name}.md",
            [f"{REPORTS}/{_name}.png"] if _name in STUDY_PLOTS else [],


rule tables_all:
    input:
        [f"{REPORTS}/{name}.md" for name in STUDY_SPECS],
