"""The workflow's catalogue built from its validated config: settings, the variants' files and CLI
arguments, and the specs of every report table (rows, cells, result files, context) that
`fedlib report` / `fedlib plot` write. No Snakemake here: the rules in workflow/rules/*.smk call it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fedlib.catalog.variants import SCHEDULES, Calib, Prune, Split, Variant, group_arg, group_path

#: the server comparison groups of Tables 2, 5 and 11, in row order
SERVER_GROUPS = ("layer", "row", "column")
SWEEP_SERIES = (("fedprllm_oneshot_layer_noscale", "FedPrLLM (layer, one-shot)"), ("centralized", "Centralized"))
NONIID_NOTE = ("; non-IID pool: WikiText-2 (offline: its validation split), C4 train documents "
               "and PTB train, split over clients by Dirichlet(alpha) per source")


def config_hash(config: Mapping) -> str:
    """sha256 (first 12 hex digits) of the validated config, defaults filled in, without
    `threads` (how fast, not what is computed)."""
    hashed = {key: value for key, value in config.items() if key != "threads"}
    return hashlib.sha256(json.dumps(hashed, sort_keys=True, default=str).encode()).hexdigest()[:12]


def pool_description(dataset: str, nsamples: int) -> str:
    """What a calib component means: mix-8 is 8 samples from each of the three sources."""
    if dataset == "mix":
        return f"{3 * nsamples} calibration samples ({nsamples} each from wikitext2, c4, ptb)"
    return f"{nsamples} calibration samples from {dataset}"


def zeroshot_path(results: str, eval_path: str) -> str:
    """{results}/eval/<variant>.json -> {results}/zeroshot/<variant>.json"""
    prefix = f"{results}/eval/"
    if not eval_path.startswith(prefix):
        raise ValueError(f"not an evaluation result path: {eval_path}")
    return f"{results}/zeroshot/{eval_path[len(prefix):]}"


def table_inputs(spec: Mapping) -> list[str]:
    """The result files a spec's table reads (`fedlib report`): its rows, its paired reference and
    contrasts; a table over draws, every draw's."""
    if "draws" in spec:
        return sorted({p for draw in spec["draws"] for p in table_inputs(draw)})
    files = {p for row in spec["rows"] for p in row["results"]}
    files.update([spec["paired_reference"]] if "paired_reference" in spec else [])
    files.update(p for c in spec.get("contrasts", []) for p in [*c["results"], *c["reference"]])
    return sorted(files)


def plot_inputs(spec: Mapping) -> list[str]:
    """The result files a spec's plot reads: its rows and its reference line (`fedlib plot`)."""
    return sorted({p for row in [*spec["rows"], *spec.get("reference", [])] for p in row["results"]})


class Catalog:
    """Settings, variants and table specs of one workflow config (validated, defaults filled in).

    ``config_files`` is how the tables' context names the config (Snakemake knows the files)."""

    def __init__(self, config: Mapping, config_files: str = "config.yaml"):
        self.config = config
        self.results = config["results_dir"]
        self.reports = config["reports_dir"]
        self.config_files = config_files
        self.config_hash = config_hash(config)
        self.studies = config.get("studies", {})
        self.fedspallm = self.studies.get("fedspallm", {})
        zeroshot = config.get("zeroshot", {})
        self.zeroshot_limit = zeroshot.get("limit", 20)  # the schema default; null = full splits
        self.zeroshot_run_rows = zeroshot.get("run_rows", ["dense", "centralized", "fedprllm_noscale"])
        self.method_options = config["pruning"].get("method_options") or {}
        self._check_fedspallm_resources()

    # -- settings -------------------------------------------------------------------------

    def setting(self, calib: str | None = None, split: str | None = None, prune: str | None = None):
        """Path components of a setting; unspecified parts come from the default experiment."""
        c, p, clients = self.config["calibration"], self.config["pruning"], self.config["clients"]
        calib = calib or str(Calib(c["dataset"], c["nsamples"], c["seqlen"]))
        split = split or str(Split(clients.get("partition", "iid"), clients["n"]))
        prune = prune or str(Prune(p["method"], p["sparsity"], group_path(p["local_group"])))
        return calib, split, prune

    def with_changes(self, calib=None, split=None, prune=None, **prune_changes):
        """A setting of the default experiment with some components (or method/sparsity/group) changed."""
        c, s, p = self.setting(calib, split, prune)
        if prune_changes:
            base = Prune.parse(p)
            p = str(Prune(prune_changes.get("method", base.method), prune_changes.get("sparsity", base.sparsity),
                          prune_changes.get("group", base.group)))
        return c, s, p

    # -- variants and their files -------------------------------------------------------------

    def eval_json(self, calib: str, split: str, prune: str, label: str) -> str:
        return Variant.from_label(label).eval_path(self.results, calib, split, prune)

    def variant_source(self, calib: str, split: str, prune: str, label: str) -> tuple[str | None, str]:
        """Evaluation label -> (file the variant needs, its `fedlib evaluate` arguments)."""
        return Variant.from_label(label).source(self.results, calib, split, prune)

    def local_only_labels(self, split: str) -> list[str]:
        n = Split.parse(split).clients
        return [Variant("local", client=i).label
                for i in range(min(n, self.config["baselines"].get("local_only_clients", 4)))]

    def fedprllm_labels(self, schedules: Sequence[str] | None = None) -> list[str]:
        server = self.config["server"]
        schedules = schedules or server.get("schedules", ["oneshot"])
        return [Variant.fedprllm(schedule, group, scaled).label
                for schedule in schedules for scaled in server["scaling"] for group in server["groups"]]

    def client_masks(self, calib: str, split: str, prune: str) -> list[str]:
        return [Variant("local", client=i).source(self.results, calib, split, prune)[0]
                for i in range(Split.parse(split).clients)]

    def client_shards(self, calib: str, split: str) -> list[str]:
        return [f"{self.results}/shards/{calib}/{split}/client_{i}.safetensors"
                for i in range(Split.parse(split).clients)]

    def method_options_arg(self, method: str) -> str:
        """``--method-options '<json>'`` for a job pruning with ``method``: the options
        pruning.method_options gives that method; nothing without options (commands unchanged)."""
        options = self.method_options.get(method)
        if not options:
            return ""
        text = json.dumps(options, sort_keys=True)
        return "--method-options '" + text.replace("'", "'\\''") + "'"

    def mask_args(self, prune: str) -> str:
        """CLI arguments of a client's pruning, from the prune component."""
        p = Prune.parse(prune)
        args = f"--method {p.method} --sparsity {p.sparsity} --local-group {group_arg(p.group)}"
        options = self.method_options_arg(p.method)
        return f"{args} {options}" if options else args

    def server_args(self) -> str:
        """The server's own settings (``fedlib aggregate``): ``server.robust``, the screening rule
        of :data:`fedlib.server.robust.RULES`; nothing when absent (every client's votes count)."""
        robust = self.config["server"].get("robust")
        return f"--robust {robust}" if robust else ""

    def upload_args(self) -> str:
        """How clients write the mask files they send (``fedlib client-mask``):
        ``upload.format_version``; nothing when absent (version 1, packed bits)."""
        version = self.config.get("upload", {}).get("format_version")
        return f"--format-version {version}" if version else ""

    def cohort_args(self, prune: str) -> str:
        """What the server expects of every client file it aggregates (``fedlib aggregate
        --client-*``): the clients' pruning, so no file's order decides the cohort."""
        p = Prune.parse(prune)
        return f"--client-method {p.method} --client-group {group_arg(p.group)} --client-sparsity {p.sparsity}"

    # -- FedSpaLLM layer sampling ---------------------------------------------------------------

    def _check_fedspallm_resources(self) -> None:
        resources = self.fedspallm.get("resources")
        if isinstance(resources, list):
            for n in self.fedspallm.get("clients", [4, 8, 16]):
                if len(resources) != n:
                    raise ValueError(
                        f"studies.fedspallm.resources: {len(resources)} per-client fractions, but "
                        f"studies.fedspallm.clients has {n}: expected one fraction per client "
                        "(or a single fraction for all clients)")

    @property
    def fedspallm_sampling(self) -> bool:
        """Whether FedSpaLLM clients prune a sample of the blocks per round (Algorithm 1)."""
        return self.fedspallm.get("resources") is not None

    def fedspallm_standalone(self) -> list[str]:
        """Labels of the Standalone models a FedSpaLLM job keeps: none under layer sampling
        (a client's own model only exists when it prunes every block in one round)."""
        if self.fedspallm_sampling:
            return []
        return [Variant("standalone", client=i).label for i in range(self.fedspallm.get("standalone_clients", 4))]

    def fedspallm_resources_arg(self, split: str) -> str:
        """``--resources r_1 .. r_n`` of `fedlib fedspallm` for the clients of ``split``; nothing
        without layer sampling."""
        resources = self.fedspallm.get("resources")
        if resources is None:
            return ""
        n = Split.parse(split).clients
        fractions = resources if isinstance(resources, list) else [resources] * n
        if len(fractions) != n:
            raise ValueError(f"studies.fedspallm.resources has {len(fractions)} fractions for {n} clients ({split})")
        return "--resources " + " ".join(f"{float(r):g}" for r in fractions)

    def fedspallm_args(self, split: str, prune: str) -> str:
        """`fedlib fedspallm` arguments of a setting: sparsity, expansion group, rounds, and the
        layer sampling resources and method options when configured."""
        p = Prune.parse(prune)
        args = [f"--sparsity {p.sparsity} --server-group {group_arg(p.group)} --rounds {self.fedspallm.get('rounds', 1)}",
                self.fedspallm_resources_arg(split), self.method_options_arg(p.method)]
        return " ".join(a for a in args if a)

    # -- table specs ----------------------------------------------------------------------------

    def report_context(self, calib: str, split: str, prune: str, title_extra: str = "") -> dict:
        c, s, p = Calib.parse(calib), Split.parse(split), Prune.parse(prune)
        return {
            "model": self.config["model"]["name"],
            "config": self.config_files,
            "seed": self.config["seed"],
            "config_hash": self.config_hash,
            "lines": [
                f"{s.clients} clients, {pool_description(c.dataset, c.nsamples)} x {c.seqlen} tokens "
                f"({s.describe()} split); local method {p.method} with {group_arg(p.group)} comparison "
                f"at {p.sparsity:.0%}{title_extra}"
            ],
        }

    def fedprllm_row(self, calib, split, prune, label) -> dict:
        return {"cells": Variant.from_label(label).cells, "results": [self.eval_json(calib, split, prune, label)]}

    def fedprllm_rows(self, calib, split, prune) -> list[dict]:
        return [self.fedprllm_row(calib, split, prune, label) for label in self.fedprllm_labels()]

    def baseline_rows(self, calib, split, prune, blanks=3, dense=True) -> list[dict]:
        rows = [{"cells": ["Dense"] + ["-"] * blanks, "results": [self.eval_json(calib, split, prune, "dense")]}] \
            if dense else []
        rows.append({"cells": ["Centralized"] + ["-"] * blanks,
                     "results": [self.eval_json(calib, split, prune, "centralized")]})
        local = self.local_only_labels(split)
        rows.append({
            "cells": [f"Local-only (mean ± std, {len(local)} clients)"] + ["-"] * blanks,
            "results": [self.eval_json(calib, split, prune, label) for label in local],
        })
        return rows

    def _local_group_rows(self, calib, split, prune, local) -> list[dict]:
        """Rows of Tables 2, 5, 11 for one local comparison group: baselines, then FedPrLLM
        (one-shot, no scaling) with each server group."""
        rows = [{"cells": [local.capitalize()] + row["cells"], "results": row["results"]}
                for row in self.baseline_rows(calib, split, prune, blanks=1, dense=False)]
        for group in SERVER_GROUPS:
            label = Variant.fedprllm("oneshot", group, False).label
            rows.append({"cells": [local.capitalize(), "FedPrLLM", group.capitalize()],
                         "results": [self.eval_json(calib, split, prune, label)]})
        return rows

    def table1(self, schedules: Sequence[str] | None = None, calib: str | None = None) -> dict:
        """Table 1 of the default setting (or of another calibration draw ``calib``): every row's
        paired difference from Centralized on the same windows, and FedPrLLM layer (no scaling)
        against Local-only."""
        calib, split, prune = self.setting(calib)
        p = Prune.parse(prune)
        rows = self.baseline_rows(calib, split, prune)
        labels = self.fedprllm_labels(schedules)
        rows += [self.fedprllm_row(calib, split, prune, label) for label in labels]
        local = [self.eval_json(calib, split, prune, label) for label in self.local_only_labels(split)]
        layer = [label for label in labels if Variant.from_label(label).group == "layer"
                 and not Variant.from_label(label).scale]
        contrasts = [{"name": f"{Variant.from_label(label).name} vs Local-only",
                      "results": [self.eval_json(calib, split, prune, label)], "reference": local} for label in layer]
        return {
            "title": f"Table 1 analogue: perplexity of pruned {self.config['model']['name']} "
                     f"({p.method}, {p.sparsity:.0%} sparsity)",
            "context": self.report_context(calib, split, prune),
            "columns": ["Method", "Comparison group", "Pruning strategy", "Weight scaling"],
            "rows": rows,
            "paired_reference": self.eval_json(calib, split, prune, "centralized"),
            "contrasts": contrasts,
        }

    def table1_seeds(self) -> dict:
        """Table 1 over calibration draws (studies.table1_seeds): each seed samples the pool and
        splits it over the clients; the config's seed is the draw of `make run` (its results reused)."""
        c, seed = self.config["calibration"], self.config["seed"]
        seeds = self.studies.get("table1_seeds", [0, 1, 2])
        draws = [{"name": f"seed {s}",
                  **self.table1(calib=str(Calib(c["dataset"], c["nsamples"], c["seqlen"], None if s == seed else s)))}
                 for s in seeds]
        base = draws[0]
        p = Prune.parse(self.setting()[2])
        return {
            "title": f"Table 1 analogue over {len(seeds)} calibration draws: perplexity of pruned "
                     f"{self.config['model']['name']} ({p.method}, {p.sparsity:.0%} sparsity)",
            "context": self.report_context(*self.setting(), title_extra=(
                f"; calibration draws with seeds {', '.join(map(str, seeds))} (the pool's samples and their split "
                f"over the clients; tie-breaks keep seed {seed})")),
            "columns": base["columns"],
            "draws": draws,
        }

    # Zero-shot accuracy (lm-eval) of the same variants the perplexity rules score:
    # results/zeroshot/ mirrors results/eval/. Tables: table12_run (part of `make run`: the rows
    # in zeroshot.run_rows), table12 (every Table 1 row), table13 (the local comparison group
    # changed, like table2); their specs are the perplexity specs with the zero-shot result files.

    def as_zeroshot(self, spec: dict, title: str) -> dict:
        """The same table with zero-shot accuracies: every result file swapped for its zero-shot twin;
        with a Dense row, the other rows' paired differences from it (``paired_reference``)."""
        rows = [{**row, "results": [zeroshot_path(self.results, p) for p in row["results"]]} for row in spec["rows"]]
        perplexity_only = ("paired_reference", "contrasts")  # Table 1's: against Centralized, in perplexity
        out = {**{k: v for k, v in spec.items() if k not in perplexity_only}, "measure": "zeroshot", "title": title,
               "rows": rows}
        dense = [row["results"][0] for row in rows
                 if len(row["results"]) == 1 and Variant.from_label(Path(row["results"][0]).stem).row_kind == "dense"]
        if dense:
            out["paired_reference"] = dense[0]
        return out

    def _limit_title(self) -> str:
        return "full splits" if self.zeroshot_limit is None else f"first {self.zeroshot_limit} documents per task"

    def table12(self) -> dict:
        p = Prune.parse(self.setting()[2])
        return self.as_zeroshot(self.table1(), f"Table 12 analogue: zero-shot accuracy (%) of pruned "
                                               f"{self.config['model']['name']} ({p.method}, {p.sparsity:.0%} "
                                               f"sparsity; {self._limit_title()})")

    def table12_run(self) -> dict:
        """The rows of Table 12 that `make run` evaluates (zeroshot.run_rows); target table12 has all."""
        spec = self.table12()
        spec["rows"] = [row for row in spec["rows"]
                        if Variant.from_label(Path(row["results"][0]).stem).row_kind in self.zeroshot_run_rows]
        if "dense" not in self.zeroshot_run_rows:  # differences from a row the table does not show: none
            spec.pop("paired_reference", None)
        spec["title"] = spec["title"].replace("Table 12 analogue", "Table 12 analogue (rows of `make run`)")
        return spec

    def table13(self) -> dict:
        return self.as_zeroshot(self.table2(), "Table 13 analogue: zero-shot accuracy (%) when changing the local "
                                               f"comparison group (one-shot, no scaling; {self._limit_title()})")

    # Named study targets beyond Table 1 (FedPrLLM Tables 2, 6, 10, 11, 14; Figures 2-3; FedSpaLLM).

    def _local_groups(self):
        return self.studies.get("local_groups", ["layer", "column"])

    def _methods(self):
        return self.studies.get("methods", ["sparsegpt", "owl", "besa"])

    def table2(self) -> dict:
        """Clients prune with another comparison group; the server tries all three."""
        rows = [row for local in self._local_groups() for row in self._local_group_rows(*self.with_changes(group=local), local)]
        return {
            "title": "Table 2 analogue: changing the local comparison group (one-shot, no scaling)",
            "context": self.report_context(*self.setting(), title_extra="; local group varied per row"),
            "columns": ["Local comparison group", "Method", "Server comparison group"],
            "rows": rows,
        }

    def _varied_rows(self, first_cell: str, calib, split, prune) -> list[dict]:
        """Baselines (no Dense) and FedPrLLM rows of a setting, with a leading cell."""
        return [{"cells": [first_cell] + row["cells"], "results": row["results"]}
                for row in self.baseline_rows(calib, split, prune, dense=False) + self.fedprllm_rows(calib, split, prune)]

    def table6(self) -> dict:
        rows = [row for sparsity in self.studies.get("sparsities", [0.6, 0.7])
                for row in self._varied_rows(f"{sparsity:.0%}", *self.with_changes(sparsity=sparsity))]
        return {
            "title": "Table 6 analogue: higher sparsity ratios",
            "context": self.report_context(*self.setting(), title_extra="; sparsity varied per row"),
            "columns": ["Sparsity", "Method", "Comparison group", "Pruning strategy", "Weight scaling"],
            "rows": rows,
        }

    def table10(self) -> dict:
        rows = [row for method in self._methods()
                for row in self._varied_rows(method, *self.with_changes(method=method))]
        return {
            "title": "Table 10 analogue: other local pruning methods",
            "context": self.report_context(*self.setting(), title_extra="; local method varied per row"),
            "columns": ["Local method", "Method", "Comparison group", "Pruning strategy", "Weight scaling"],
            "rows": rows,
        }

    def table11(self) -> dict:
        rows = [{"cells": [method] + row["cells"], "results": row["results"]}
                for method in self._methods() for local in self._local_groups()
                for row in self._local_group_rows(*self.with_changes(method=method, group=local), local)]
        return {
            "title": "Table 11 analogue: other local methods with another local comparison group",
            "context": self.report_context(*self.setting(), title_extra="; local method and group varied per row"),
            "columns": ["Local method", "Local comparison group", "Method", "Server comparison group"],
            "rows": rows,
        }

    def table14(self) -> dict:
        """Ultra-low data: every client holds a single calibration sample."""
        clients = self.config["clients"]["n"]
        c = self.config["calibration"]
        calib, split, prune = self.with_changes(calib=str(Calib(c["dataset"], clients, c["seqlen"])),
                                                split=str(Split("iid", clients)))
        return {
            "title": "Table 14 analogue: ultra-low data regime (1 calibration sample per client)",
            "context": self.report_context(calib, split, prune),
            "columns": ["Method", "Comparison group", "Pruning strategy", "Weight scaling"],
            "rows": self.baseline_rows(calib, split, prune) + self.fedprllm_rows(calib, split, prune),
        }

    def _sweep(self, title, xlabel, points, series=SWEEP_SERIES, xscale="log2", xformat="int") -> dict:
        """A sweep as a table and a plot spec: rows carry x and series (fedlib plot); Dense is the
        plot's reference line."""
        rows = []
        for x, (calib, split, prune) in points:
            cell = f"{x:.0%}" if xformat == "percent" else str(x)
            for label, name in series:
                rows.append({"cells": [cell, name], "x": x, "series": name,
                             "results": [self.eval_json(calib, split, prune, label)]})
            local = self.local_only_labels(split)
            rows.append({"cells": [cell, f"Local-only (mean ± std, {len(local)} clients)"], "x": x,
                         "series": "Local-only (mean ± std)",
                         "results": [self.eval_json(calib, split, prune, label) for label in local]})
        return {"title": title,
                "context": self.report_context(*self.setting(), title_extra=f"; {xlabel} varied per row"),
                "columns": [xlabel, "Method"], "rows": rows,
                "reference": [{"series": "Dense", "results": [self.eval_json(*self.setting(), "dense")]}],
                "plot": {"xlabel": xlabel, "xscale": xscale, "xformat": xformat}}

    def figure2(self) -> dict:
        c = self.config["calibration"]
        points = [(n, self.with_changes(split=str(Split("iid", n))))
                  for n in self.studies.get("clients_sweep", [2, 4, 8, 16, 32]) if n <= c["nsamples"]]
        return self._sweep(f"Figure 2 analogue: number of clients (total {c['nsamples']} samples)", "Clients", points)

    def figure3(self) -> dict:
        c = self.config["calibration"]
        points = [(t, self.with_changes(calib=str(Calib(c["dataset"], t, c["seqlen"])), split=str(Split("iid", t // 2))))
                  for t in self.studies.get("samples_sweep", [4, 8, 16, 32])]
        return self._sweep("Figure 3 analogue: number of calibration samples (clients = half)", "Samples", points)

    def sparsity_plot(self) -> dict:
        """Perplexity vs sparsity (paper Tables 6-8 as a figure): the default sparsity and studies.sparsities."""
        sparsities = sorted({self.config["pruning"]["sparsity"], *self.studies.get("sparsities", [0.6, 0.7])})
        series = [("centralized", "Centralized")] + [(label, Variant.from_label(label).name)
                                                     for label in self.fedprllm_labels()]
        points = [(s, self.with_changes(sparsity=s)) for s in sparsities]
        return self._sweep("Perplexity vs sparsity (paper Tables 6-8)", "Sparsity", points, series,
                           xscale="linear", xformat="percent")

    def _noniid_setting(self, **prune_changes):
        n = self.studies.get("noniid", {})
        return self.with_changes(calib=str(Calib("mix", n.get("per_dataset", 8), self.config["calibration"]["seqlen"])),
                                 split=f"dir{n.get('alpha', 5)}-{n.get('clients', 12)}", **prune_changes)

    def table4(self) -> dict:
        calib, split, prune = self._noniid_setting()
        return {
            "title": "Table 4 analogue: non-IID calibration data",
            "context": self.report_context(calib, split, prune, title_extra=NONIID_NOTE),
            "columns": ["Method", "Comparison group", "Pruning strategy", "Weight scaling"],
            "rows": self.baseline_rows(calib, split, prune, dense=False) + self.fedprllm_rows(calib, split, prune),
        }

    def table5(self) -> dict:
        rows = [row for local in self._local_groups()
                for row in self._local_group_rows(*self._noniid_setting(group=local), local)]
        return {
            "title": "Table 5 analogue: non-IID data, changing the local comparison group (one-shot, no scaling)",
            "context": self.report_context(*self._noniid_setting(), title_extra=f"{NONIID_NOTE}; local group varied per row"),
            "columns": ["Local comparison group", "Method", "Server comparison group"],
            "rows": rows,
        }

    def fedspallm_setting(self, clients: int, **changes):
        """A FedSpaLLM table's setting: SparseGPT with update, layer group, ``clients`` IID clients
        holding calibration.nsamples between them, or studies.fedspallm.samples_per_client each."""
        per_client = self.fedspallm.get("samples_per_client")
        c = self.config["calibration"]
        calib = str(Calib(c["dataset"], clients * per_client, c["seqlen"])) if per_client else None
        return self.with_changes(calib=calib, split=str(Split("iid", clients)), method="sparsegpt_update",
                                 group="layer", **changes)

    def fedspallm_table(self, clients: int) -> dict:
        """FedSpaLLM Tables 1-3: Random, Standalone (mean over clients' own models; not under
        layer sampling), FedSpaLLM."""
        f = self.fedspallm
        standalone = self.fedspallm_standalone()[:clients]
        rows = []
        for sparsity in f.get("sparsities", [0.5, 0.6, 0.7, 0.8]):
            calib, split, prune = self.fedspallm_setting(clients, sparsity=sparsity)
            rows.append({"cells": [f"{sparsity:.0%}", "Random"], "results": [self.eval_json(calib, split, prune, "random")]})
            if standalone:
                rows.append({"cells": [f"{sparsity:.0%}", f"Standalone (mean ± std, {len(standalone)} clients)"],
                             "results": [self.eval_json(calib, split, prune, label) for label in standalone]})
            rows.append({"cells": [f"{sparsity:.0%}", "FedSpaLLM"],
                         "results": [self.eval_json(calib, split, prune, "fedspallm")]})
        sampling = ""
        if self.fedspallm_sampling:
            resources = f["resources"]
            shown = ", ".join(f"{float(r):g}" for r in resources) if isinstance(resources, list) else f"{float(resources):g}"
            sampling = f", layer sampling with resources {shown} (no Standalone models)"
        return {
            "title": f"FedSpaLLM Table analogue: {clients} clients, Random / Standalone / FedSpaLLM",
            "context": self.report_context(*self.fedspallm_setting(clients), title_extra=(
                f"; SparseGPT with OBS update on every client, l0 aggregation + mask expansion, "
                f"{f.get('rounds', 1)} round(s){sampling}; sparsity varied per row")),
            "columns": ["Sparsity", "Method"],
            "rows": rows,
        }

    def study_specs(self) -> dict[str, Callable[[], dict]]:
        """Named study targets -> their table spec (built on call)."""
        return {
            "table1_full": lambda: self.table1(SCHEDULES),
            "table1_seeds": self.table1_seeds,
            "table12_run": self.table12_run,  # part of `make run`
            "table12": self.table12,
            "table13": self.table13,
            "table2": self.table2,
            "table6": self.table6,
            "table10": self.table10,
            "table11": self.table11,
            "table14": self.table14,
            "figure2": self.figure2,
            "figure3": self.figure3,
            "table4": self.table4,
            "table5": self.table5,
            **{f"fedspallm{n}": (lambda n=n: self.fedspallm_table(n)) for n in self.fedspallm.get("clients", [4, 8, 16])},
        }

    def study_plots(self) -> dict[str, Callable[[], dict]]:
        """PNG plots of the named targets that are figures in the papers (`fedlib plot`, same specs)."""
        return {"figure2": self.figure2, "figure3": self.figure3, "table6": self.sparsity_plot}

    def study_category(self, name: str) -> str:
        """Category of a study's table / plot in the Snakemake report (`snakemake --report`)."""
        if name.startswith("table12") or name == "table13":
            return "Zero-shot"
        if name in self.study_plots():
            return "Sweeps"
        if name.startswith("fedspallm"):
            return "FedSpaLLM"
        return "Perplexity"
