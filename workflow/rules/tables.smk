# Table specs: which result files make each report table (rows, cells, context).
# Rules: report.smk (table1), zeroshot.smk, studies.smk (named targets); writer: `fedlib report`.

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


# Zero-shot accuracy (lm-eval, 7 tasks) of the same variants the perplexity rules score:
# results/zeroshot/ mirrors results/eval/ (dense.json, {calib}/{split}/{prune}/{label}.json).
# Tables: table12_run (part of `make run`: the rows in zeroshot.run_rows), table12 (every
# Table 1 row), table13 (the local comparison group changed, like table2); their specs are
# the perplexity specs with the zero-shot result files, so one writer serves both.

def zeroshot_path(eval_path):
    """results/eval/<variant>.json -> results/zeroshot/<variant>.json"""
    prefix = f"{RESULTS}/eval/"
    if not eval_path.startswith(prefix):
        raise ValueError(f"not an evaluation result path: {eval_path}")
    return f"{RESULTS}/zeroshot/{eval_path[len(prefix):]}"


def as_zeroshot(spec, title):
    """The same table with zero-shot accuracies: every result file swapped for its zero-shot twin."""
    return {**spec, "measure": "zeroshot", "title": title,
            "rows": [{**row, "results": [zeroshot_path(p) for p in row["results"]]} for row in spec["rows"]]}


def row_kind(row):
    """dense, centralized, local_only, fedprllm_noscale or fedprllm_scale (zeroshot.run_rows)."""
    label = Path(row["results"][0]).stem
    if label.startswith("local_"):
        return "local_only"
    if label.startswith("fedprllm_"):
        return f"fedprllm_{label.rsplit('_', 1)[1]}"
    return label


def _limit_title():
    return "full splits" if ZEROSHOT_LIMIT is None else f"first {ZEROSHOT_LIMIT} documents per task"


def table12_spec():
    method, sparsity, _ = parse_prune(setting()[2])
    return as_zeroshot(table1_spec(), f"Table 12 analogue: zero-shot accuracy (%) of pruned {config['model']['name']} "
                                      f"({method}, {sparsity:.0%} sparsity; {_limit_title()})")


def table12_run_spec():
    """The rows of Table 12 that `make run` evaluates (zeroshot.run_rows); target table12 has all."""
    spec = table12_spec()
    kinds = ZEROSHOT.get("run_rows", ["dense", "centralized", "fedprllm_noscale"])
    spec["rows"] = [row for row in spec["rows"] if row_kind(row) in kinds]
    spec["title"] = spec["title"].replace("Table 12 analogue", "Table 12 analogue (rows of `make run`)")
    return spec


def table13_spec():
    return as_zeroshot(table2_spec(), "Table 13 analogue: zero-shot accuracy (%) when changing the local comparison "
                                      f"group (one-shot, no scaling; {_limit_title()})")


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
        "context": report_context(*_noniid_setting(), title_extra=f"{NONIID_NOTE}; local group varied per row"),
        "columns": ["Local comparison group", "Method", "Server comparison group"],
        "rows": rows,
    }


def fedspallm_calib(clients):
    """The calibration pool of a FedSpaLLM table: calibration.nsamples split over the clients, or
    studies.fedspallm.samples_per_client each (the paper gives every client 32)."""
    per_client = STUDIES.get("fedspallm", {}).get("samples_per_client")
    c = config["calibration"]
    return f"{c['dataset']}-{clients * per_client}x{c['seqlen']}" if per_client else None


def fedspallm_spec(clients):
    """FedSpaLLM Tables 1-3: Random, Standalone (mean over clients' own models), FedSpaLLM."""
    f = STUDIES.get("fedspallm", {})
    standalone = [f"standalone_{i}" for i in range(min(clients, f.get("standalone_clients", 4)))]

    def setting_of(**changes):
        return _with(calib=fedspallm_calib(clients), split=f"iid-{clients}", method="sparsegpt_update",
                     group="layer", **changes)

    rows = []
    for sparsity in f.get("sparsities", [0.5, 0.6, 0.7, 0.8]):
        calib, split, prune = setting_of(sparsity=sparsity)
        rows.append({"cells": [f"{sparsity:.0%}", "Random"], "results": [eval_json(calib, split, prune, "random")]})
        rows.append({"cells": [f"{sparsity:.0%}", f"Standalone (mean ± std, {len(standalone)} clients)"],
                     "results": [eval_json(calib, split, prune, label) for label in standalone]})
        rows.append({"cells": [f"{sparsity:.0%}", "FedSpaLLM"], "results": [eval_json(calib, split, prune, "fedspallm")]})
    return {
        "title": f"FedSpaLLM Table analogue: {clients} clients, Random / Standalone / FedSpaLLM",
        "context": report_context(*setting_of(), title_extra=(
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
