"""Report tables (Markdown + CSV, optionally HTML) built from the workflow's evaluation results.

Every table is described by a *spec* (built by the workflow's ``*_spec()`` functions):
``title``, ``context`` (see :func:`provenance_lines`), ``columns`` (the leading,
descriptive columns), ``rows`` (each with its descriptive ``cells`` and the result JSON
files it reports) and ``measure``, which names the kind of result files and so the value
columns: ``perplexity`` (``fedlib evaluate``; one column per dataset) or ``zeroshot``
(``fedlib zeroshot``; one column per task plus the mean accuracy). One writer,
:func:`write_spec_table`, serves every measure; a :class:`Measure` says how a result file
becomes cells and which evaluation lines the header carries.

A spec with ``paired_reference`` (a result file; Table 1: Centralized, Table 12: Dense) adds
each row's paired difference from it on the same windows or documents, with its interval, and
its header names every difference whose interval includes none; ``contrasts`` compare two
other sets of results the same way (Table 1: FedPrLLM layer vs Local-only). A spec with
``draws`` (:func:`write_draws_table`) is one table over several calibration draws.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedlib.io import write_text_atomic

DATASET_TITLES = {"wikitext2": "WikiText-2", "c4": "C4", "ptb": "PTB"}
TASK_TITLES = {"boolq": "BoolQ", "rte": "RTE", "hellaswag": "HellaSwag", "winogrande": "WinoGrande",
               "arc_easy": "ARC-e", "arc_challenge": "ARC-c", "openbookqa": "OBQA"}
MEAN_KEY = "mean"


def fmt_ppl(value: float) -> str:
    return f"{value:.2f}" if value < 1000 else f"{value:.1f}"


_HTML_STYLE = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:1.5em;color:#222}"
    "h1{font-size:1.2em}ul{font-size:.85em;color:#444}"
    "table{border-collapse:collapse;font-size:.9em}"
    "th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}"
    "th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}"
)


def _is_number(cell: str) -> bool:
    try:
        float(str(cell).split(" ")[0])
        return True
    except ValueError:
        return False


def table_html(title: str, header_lines: Sequence[str], columns: Sequence[str],
               rows: Sequence[Sequence[str]]) -> str:
    """A self-contained HTML page of one table (no scripts, no external resources)."""
    esc = html.escape
    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{esc(title)}</title><style>{_HTML_STYLE}</style></head><body>",
           f"<h1>{esc(title)}</h1>", "<ul>"]
    out += [f"<li>{esc(line)}</li>" for line in header_lines]
    out += ["</ul>", "<table>", "<thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in columns) + "</tr></thead>",
            "<tbody>"]
    for row in rows:
        cells = "".join(f'<td class="num">{esc(str(c))}</td>' if _is_number(c) else f"<td>{esc(str(c))}</td>"
                        for c in row)
        out.append(f"<tr>{cells}</tr>")
    out += ["</tbody>", "</table>", "</body></html>"]
    return "\n".join(out) + "\n"


def write_table(md_path: Path, csv_path: Path, title: str, header_lines: Sequence[str],
                columns: Sequence[str], rows: Sequence[Sequence[str]], html_path: Path | None = None) -> None:
    """One table as Markdown (title, provenance lines, table), as plain CSV and, when
    ``html_path`` is given, as a self-contained HTML page (what the Snakemake report shows)."""
    md = [f"# {title}", ""]
    md += [f"- {line}" for line in header_lines]
    md += ["", "| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    md += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    write_text_atomic(md_path, "\n".join(md) + "\n")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    write_text_atomic(csv_path, buffer.getvalue())
    if html_path is not None:
        write_text_atomic(Path(html_path), table_html(title, header_lines, columns, rows))


def _load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _mean_std(values: list[float], fmt: Callable[[float], str] = fmt_ppl) -> str:
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.mean(values))} ± {fmt(statistics.stdev(values))}"


# --------------------------------------------------------------------------- measures


def _paper_order(dataset: str) -> tuple[int, str]:
    order = list(DATASET_TITLES)  # WikiText-2, C4, PTB as in the papers' tables
    return (order.index(dataset) if dataset in order else len(order), dataset)


def _perplexity_columns(example: dict) -> list[tuple[str, str]]:
    return [(d, DATASET_TITLES.get(d, d)) for d in sorted(example["perplexity"], key=_paper_order)]


def _perplexity_value(result: dict, key: str) -> float:
    return result["perplexity"][key]["ppl"]


def _perplexity_lines(example: dict) -> list[str]:
    lines, windows = [], []
    for dataset in sorted(example["perplexity"], key=_paper_order):
        row = example["perplexity"][dataset]
        windows.append(
            f"{DATASET_TITLES.get(dataset, dataset)} {row['windows']} of {row['total_windows']} "
            f"windows × {row['seqlen']} tokens"
        )
        if row.get("note"):
            lines.append(f"Offline: {row['note']}.")
    lines.append("Perplexity on " + "; ".join(windows) + " (evenly spaced, non-overlapping).")
    return lines


def _perplexity_setup(result: dict) -> dict:
    return {d: (row["windows"], row["seqlen"]) for d, row in result["perplexity"].items()}


def _zeroshot_columns(example: dict) -> list[tuple[str, str]]:
    return [(t, TASK_TITLES.get(t, t)) for t in example["tasks"]] + [(MEAN_KEY, "Mean")]


def _metric(result: dict, task: str) -> str:
    """The metric shown for ``task``: per task (``metrics``); result files written before
    acc_norm was shown name one ``metric`` for every task."""
    return result["metrics"][task] if "metrics" in result else result.get("metric", "acc")


def _zeroshot_value(result: dict, key: str) -> float:
    if key == MEAN_KEY:
        return 100 * statistics.mean(result["zeroshot"][t][_metric(result, t)] for t in result["tasks"])
    return 100 * result["zeroshot"][key][_metric(result, key)]


def _zeroshot_lines(example: dict) -> list[str]:
    tasks, limit = example["tasks"], example.get("limit")
    scored = example["zeroshot"]
    sizes = []
    for t in tasks:
        total = scored[t].get("total")
        sizes.append(f"{TASK_TITLES.get(t, t)} {scored[t]['n']}" + (f" of {total}" if total else ""))
    if limit is None:
        how = "on the full splits (no limit)"
    else:
        how = f"on the first {limit} documents of each task (limit {limit} per task)"
    by_metric: dict[str, list[str]] = {}
    for t in tasks:
        by_metric.setdefault(_metric(example, t), []).append(TASK_TITLES.get(t, t))
    metrics = "; ".join(f"`{m}` for {', '.join(names)}" for m, names in by_metric.items())
    lines = [
        f"Zero-shot accuracy (%, lm-eval 0-shot; {metrics}) {how}: " + "; ".join(sizes)
        + f" documents. Mean = unweighted mean over the {len(tasks)} tasks."
    ]
    if "acc_norm" in by_metric:
        lines.append("`acc_norm` (where lm-eval defines it) ranks the answer choices by log-likelihood per "
                     "character, so longer choices are not penalised.")
    stderrs = [scored[t].get(f"{_metric(example, t)}_stderr") for t in tasks]
    if None not in stderrs:  # None: not in the result file (written before it was shown)
        mean_se = 100 * sum(e ** 2 for e in stderrs) ** 0.5 / len(tasks)
        lines.append(f"Standard error of the {example.get('label', 'first row')} row's Mean: {mean_se:.1f} points "
                     "(sqrt of the summed squared per-task standard errors / tasks).")
    elif limit is not None:
        smallest = min(scored[t]["n"] for t in tasks)
        lines.append(f"With {smallest} documents per task one task's accuracy has a standard error of up to "
                     f"{50 / smallest ** 0.5:.0f} points: read small differences as noise.")
    if all("choices" in scored[t] for t in tasks):
        level = 100 * statistics.mean(statistics.mean(1 / c for c in scored[t]["choices"]) for t in tasks)
        lines.append(f"Chance level of the Mean on these documents (1 / answer choices): {level:.1f} %.")
    if example.get("data_dir", "hub") != "hub":
        lines.append("Offline: the stock lm-eval task definitions on local copies of their scored splits "
                     "(BoolQ, RTE, HellaSwag, WinoGrande validation; ARC, OpenBookQA test).")
    return lines


def _zeroshot_setup(result: dict) -> dict:
    return {"tasks": result["tasks"], "limit": result.get("limit"),
            "metrics": {t: _metric(result, t) for t in result["tasks"]}}


def _zeroshot_difference(result: dict, reference: dict) -> dict[str, float]:
    """The Mean's paired difference from ``reference`` on the same documents (points, 95 % interval)."""
    from fedlib.evaluate.zeroshot import paired_difference

    for t in result["tasks"]:
        for r in (result, reference):
            if "correct" not in r["zeroshot"][t]:
                raise ValueError(f"{r.get('label')}: no per-document record for {t}; rerun the zero-shot evaluation")
        if result["zeroshot"][t]["doc_ids"] != reference["zeroshot"][t]["doc_ids"]:
            raise ValueError(f"{result.get('label')} and {reference.get('label')} scored different {t} documents")
    variant, base = ([r["zeroshot"][t]["correct"][_metric(r, t)] for t in result["tasks"]] for r in (result, reference))
    diff = paired_difference(variant, base)
    return {k: 100 * v for k, v in diff.items()}


def _zeroshot_paired(results: list[dict], reference: list[dict]) -> dict[str, dict[str, float]]:
    """{Mean: difference}: one result's paired difference with its interval; several results
    (Local-only): the mean and std of their differences (no interval)."""
    (base,) = reference
    diffs = [_zeroshot_difference(r, base) for r in results]
    if len(diffs) == 1:
        return {MEAN_KEY: diffs[0]}
    deltas = [d["delta"] for d in diffs]
    return {MEAN_KEY: {"delta": statistics.mean(deltas), "std": statistics.stdev(deltas)}}


def _zeroshot_paired_fmt(d: dict[str, float]) -> str:
    if "std" in d:
        return f"{d['delta']:+.2f} ± {d['std']:.2f}"
    return f"{d['delta']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"


def _zeroshot_paired_columns(example: dict, name: str) -> list[tuple[str, str]]:
    return [(MEAN_KEY, f"Δ Mean vs {name} [95 % CI]")]


def _zeroshot_paired_lines(name: str) -> list[str]:
    return [f"Δ Mean vs {name}: the row's Mean minus {name}'s on the same documents (points), with a 95 % "
            "paired normal interval from the per-document differences (standard error "
            "sqrt(Σ_t s_t²/n_t)/T over the T tasks); an interval that excludes 0 is a resolved difference. "
            "Rows of several results: mean ± std of their differences."]


def _fmt_acc(value: float) -> str:
    return f"{value:.2f}"


def _window_nll(results: list[dict], dataset: str) -> list[float]:
    """Per window, the mean NLL over ``results`` (one result: its own; Local-only: the mean of
    its clients' log-perplexities), from the per-window losses of `fedlib evaluate`."""
    per_result = []
    for r in results:
        row = r["perplexity"][dataset]
        if "window_nll" not in row:
            raise ValueError(f"{r.get('label')}: no per-window losses for {dataset}; rerun the evaluation "
                             "(its result file was written by an older fedlib: snakemake --forcerun "
                             "evaluate_perplexity evaluate_dense)")
        per_result.append(row["window_nll"])
    if len({len(w) for w in per_result}) != 1:
        raise ValueError(f"{[r.get('label') for r in results]}: different numbers of {dataset} windows")
    return [statistics.fmean(values) for values in zip(*per_result)]


def _perplexity_paired(results: list[dict], reference: list[dict]) -> dict[str, dict[str, float]]:
    """Per dataset, the log perplexity ratio results / reference on the same windows with its
    95 % paired t interval over the windows (several results on a side: their mean log-perplexity)."""
    from fedlib.evaluate.perplexity import paired_ppl_ratio

    out = {}
    for dataset in sorted(reference[0]["perplexity"], key=_paper_order):
        ratio, ends = paired_ppl_ratio(_window_nll(results, dataset), _window_nll(reference, dataset))
        out[dataset] = {"delta": math.log(ratio), "low": math.log(ends[0]), "high": math.log(ends[1])}
    return out


def _perplexity_paired_fmt(d: dict[str, float]) -> str:
    """A log perplexity ratio and its interval: percent change, or a factor once the upper end reaches 10x."""
    ratio, low, high = (math.exp(d[k]) for k in ("delta", "low", "high"))
    if high < 10:
        return f"{ratio - 1:+.2%} [{low - 1:+.2%}, {high - 1:+.2%}]"
    factor = [f"×{x:.3g}" if x < 1000 else f"×{x:,.0f}" for x in (ratio, low, high)]
    return f"{factor[0]} [{factor[1]}, {factor[2]}]"


def _perplexity_paired_columns(example: dict, name: str) -> list[tuple[str, str]]:
    return [(d, f"{title} vs {name} [95 % CI]") for d, title in _perplexity_columns(example)]


def _perplexity_paired_lines(name: str) -> list[str]:
    return [f"Columns \"… vs {name}\": the row's perplexity over {name}'s on the same windows (percent change, "
            "or a factor), with a 95 % paired t interval over the windows' differences of mean log-likelihood; rows "
            "of several results (Local-only) pair the mean of their log-perplexities, so their interval is over "
            "windows for these clients (the spread between clients is the row's ± std). An interval that excludes "
            "no change is a resolved difference; each interval holds on its own, not jointly over the table."]


@dataclass(frozen=True)
class Measure:
    """How one kind of result file becomes table cells.

    ``columns(example)`` -> [(key, column title)]; ``value(result, key)`` -> a number;
    ``fmt`` formats it; ``lines(example)`` are the header lines saying what was evaluated;
    ``setup(result)`` must agree over every result of a table (same windows / tasks / limit);
    ``paired(results, reference)`` -> {key: {delta, low, high}} (or {delta, std}): a row's
    difference from the spec's ``paired_reference`` on the same documents or windows, 0 = none,
    one column per key of ``paired_columns(example, reference name)``, formatted by
    ``paired_fmt`` and explained by ``paired_lines(reference name)``."""

    name: str
    columns: Callable[[dict], list[tuple[str, str]]]
    value: Callable[[dict, str], float]
    fmt: Callable[[float], str]
    lines: Callable[[dict], list[str]]
    setup: Callable[[dict], dict]
    paired: Callable[[list[dict], list[dict]], dict[str, dict[str, float]]]
    paired_fmt: Callable[[dict[str, float]], str]
    paired_columns: Callable[[dict, str], list[tuple[str, str]]]
    paired_lines: Callable[[str], list[str]]


MEASURES: dict[str, Measure] = {
    "perplexity": Measure("perplexity", _perplexity_columns, _perplexity_value, fmt_ppl,
                          _perplexity_lines, _perplexity_setup, _perplexity_paired, _perplexity_paired_fmt,
                          _perplexity_paired_columns, _perplexity_paired_lines),
    "zeroshot": Measure("zeroshot", _zeroshot_columns, _zeroshot_value, _fmt_acc,
                        _zeroshot_lines, _zeroshot_setup, _zeroshot_paired, _zeroshot_paired_fmt,
                        _zeroshot_paired_columns, _zeroshot_paired_lines),
}


def measure_of(spec_or_result: dict) -> Measure:
    """The measure a spec names (``measure``; default perplexity), or that a result file holds."""
    name = spec_or_result.get("measure")
    if name is None:
        name = "zeroshot" if "zeroshot" in spec_or_result else "perplexity"
    if name not in MEASURES:
        raise ValueError(f"unknown measure {name!r}; known: {', '.join(MEASURES)}")
    return MEASURES[name]


def provenance_lines(context: dict, example: dict, measure: Measure | None = None) -> list[str]:
    """Header lines every table (and plot caption) carries: model + fingerprint, config and
    its hash, seed, the fedlib that wrote it, the setting, and exactly what was evaluated."""
    from fedlib.provenance import written_by

    measure = measure or measure_of(example)
    config_hash = f" (sha256 {context['config_hash']})" if context.get("config_hash") else ""
    lines = [
        f"Model: {context['model']} (fingerprint {example.get('model_fingerprint', '?')[:16]})",
        f"Config: {context.get('config', '?')}{config_hash}; seed {context.get('seed')}; written by {written_by()}",
    ]
    lines += context.get("lines", [])
    lines += measure.lines(example)
    return lines


def load_rows(spec: dict) -> tuple[Measure, list[list[dict]]]:
    """The spec's measure and every row's loaded result files (checked to agree on their setup)."""
    measure = measure_of(spec)
    loaded = [[_load(p) for p in row["results"]] for row in spec["rows"]]
    reference = measure.setup(loaded[0][0])
    for row, results in zip(spec["rows"], loaded):
        for path, result in zip(row["results"], results):
            if measure.setup(result) != reference:
                raise ValueError(f"{path}: evaluated with {measure.setup(result)}, but the table's first result "
                                 f"with {reference}; rerun the evaluation")
    return measure, loaded


def _load_like(paths: Sequence[str], measure: Measure, example: dict) -> list[dict]:
    """Result files outside a spec's rows (a reference, a contrast), checked to be evaluated like its rows."""
    loaded = [_load(p) for p in paths]
    for path, result in zip(paths, loaded):
        if measure.setup(result) != measure.setup(example):
            raise ValueError(f"{path}: evaluated with {measure.setup(result)}, but the table's first result "
                             f"with {measure.setup(example)}; rerun the evaluation")
    return loaded


def _row_name(cells: Sequence[str]) -> str:
    return " ".join(c for c in cells if c not in ("", "-"))


def _paired_parts(spec: dict, measure: Measure, loaded: list[list[dict]], example: dict):
    """(reference name, each row's differences from the spec's ``paired_reference`` (None for the
    reference row itself), [(name, differences)] of the spec's ``contrasts``: pairs of result
    sets {name, results, reference} compared the same way)."""
    path = spec["paired_reference"]
    reference = _load_like([path], measure, example)
    same = [str(Path(path).resolve())]
    rows = [None if [str(Path(p).resolve()) for p in row["results"]] == same else measure.paired(results, reference)
            for row, results in zip(spec["rows"], loaded)]
    contrasts = [(c["name"], measure.paired(_load_like(c["results"], measure, example),
                                            _load_like(c["reference"], measure, example)))
                 for c in spec.get("contrasts", [])]
    return reference[0].get("label", "the reference"), rows, contrasts


def _paired_summary(measure: Measure, example: dict, name: str, spec: dict, rows: list, contrasts: list) -> list[str]:
    """The contrasts' lines and the line naming every difference the table does not resolve."""
    titles = dict(measure.columns(example))
    keys = [key for key, _ in measure.paired_columns(example, name)]
    lines = [f"{cname}: " + "; ".join(f"{titles[k]} {measure.paired_fmt(diff[k])}" for k in keys) + "."
             for cname, diff in contrasts]
    unresolved = []
    named = [(f"{_row_name(row['cells'])} vs {name}", diff) for row, diff in zip(spec["rows"], rows) if diff]
    for what, diff in named + contrasts:
        # a difference without an interval (several results' mean ± std) resolves nothing either way
        missed = [titles[k] for k in keys if "low" in diff[k] and diff[k]["low"] <= 0 <= diff[k]["high"]]
        if missed:
            unresolved.append(f"{what} on {', '.join(missed)}")
    lines.append("Not resolved at 95 % (the interval includes no difference): " + "; ".join(unresolved) + "."
                 if unresolved else "Every difference with an interval in this table is resolved at 95 %.")
    return lines


def _add_paired_columns(measure: Measure, paired_columns: list[tuple[str, str]], columns: list[str],
                        table: list[list[str]], rows: list) -> None:
    columns += [title for _, title in paired_columns]
    for cells, diff in zip(table, rows):
        cells += ["reference" if diff is None else measure.paired_fmt(diff[key]) for key, _ in paired_columns]


def write_spec_table(spec: dict, md_path: Path, csv_path: Path, html_path: Path | None = None) -> None:
    """A table from a spec (see the module docstring): one file per row gives the value,
    several give mean ± std (Local-only over clients). A spec with ``draws`` is written by
    :func:`write_draws_table`."""
    if "draws" in spec:
        write_draws_table(spec, md_path, csv_path, html_path)
        return
    measure, loaded = load_rows(spec)
    example = loaded[0][0]
    value_columns = measure.columns(example)
    columns = list(spec["columns"]) + [title for _, title in value_columns]
    lines = provenance_lines(spec["context"], example, measure)
    table = [list(row["cells"]) + [_mean_std([measure.value(r, key) for r in results], measure.fmt)
                                   for key, _ in value_columns]
             for row, results in zip(spec["rows"], loaded)]
    if spec.get("paired_reference"):
        name, rows, contrasts = _paired_parts(spec, measure, loaded, example)
        paired_columns = measure.paired_columns(example, name)
        lines += measure.paired_lines(name) + _paired_summary(measure, example, name, spec, rows, contrasts)
        _add_paired_columns(measure, paired_columns, columns, table, rows)
    write_table(md_path, csv_path, spec["title"], lines, columns, table, html_path)


def write_draws_table(spec: dict, md_path: Path, csv_path: Path, html_path: Path | None = None) -> None:
    """One table over several calibration draws: ``draws`` is a list of specs with the same rows
    (cells) and a ``name``, e.g. Table 1 of each seed. Each cell is the mean over the draws of the
    row's value in each draw (several results in a draw: their mean) ± the half-width of its 95 %
    t interval over the draws; with a ``paired_reference`` in each draw, the row's paired
    difference from it in each draw, averaged over the draws with its t interval over the draws."""
    from fedlib.stats import t_interval

    draws = spec["draws"]
    if len(draws) < 2:
        raise ValueError(f"{spec['title']}: {len(draws)} draw(s); an interval over draws needs at least 2")
    measure = measure_of(spec)
    loaded = [load_rows({**draw, "measure": measure.name})[1] for draw in draws]
    example = loaded[0][0][0]
    for draw, rows in zip(draws, loaded):
        if [row["cells"] for row in draw["rows"]] != [row["cells"] for row in draws[0]["rows"]]:
            raise ValueError(f"draw {draw['name']}: rows {[row['cells'] for row in draw['rows']]} differ from "
                             f"draw {draws[0]['name']}'s")
        if measure.setup(rows[0][0]) != measure.setup(example):
            raise ValueError(f"draw {draw['name']}: evaluated with {measure.setup(rows[0][0])}, draw "
                             f"{draws[0]['name']} with {measure.setup(example)}; rerun the evaluation")
    value_columns = measure.columns(example)
    columns = list(spec["columns"]) + [title for _, title in value_columns]
    n = len(draws)
    lines = provenance_lines(spec["context"], example, measure) + [
        f"{n} calibration draws ({', '.join(d['name'] for d in draws)}). Each value: the mean over the draws "
        f"(a row of several results: their mean in each draw) ± the half-width of its 95 % t interval over the "
        f"{n} draws ({n - 1} degrees of freedom), the evaluation windows the same in every draw."]
    table = []
    for i, cells in enumerate(row["cells"] for row in draws[0]["rows"]):
        values = []
        for key, _ in value_columns:
            mean, low, high = t_interval([statistics.fmean(measure.value(r, key) for r in rows[i]) for rows in loaded])
            values.append(f"{measure.fmt(mean)} ± {measure.fmt(high - mean)}")
        table.append(list(cells) + values)
    if all(draw.get("paired_reference") for draw in draws):
        parts = [_paired_parts(draw, measure, rows, example) for draw, rows in zip(draws, loaded)]
        name = parts[0][0]
        paired_columns = measure.paired_columns(example, name)

        def combined(diffs: list[dict]) -> dict:
            return {key: dict(zip(("delta", "low", "high"), t_interval([d[key]["delta"] for d in diffs])))
                    for key, _ in paired_columns}

        rows = [None if parts[0][1][i] is None else combined([p[1][i] for p in parts]) for i in range(len(table))]
        contrasts = [(cname, combined([p[2][j][1] for p in parts])) for j, (cname, _) in enumerate(parts[0][2])]
        lines += [f"Columns \"… vs {name}\": in each draw the row's paired difference from that draw's {name} "
                  f"on the same evaluation windows (as in Table 1); here its mean over the {n} draws with the 95 % t interval "
                  f"over the draws, so the interval is the spread between calibration draws, not between windows. "
                  f"An interval that excludes no change is a resolved difference; each holds on its own."]
        lines += _paired_summary(measure, example, name, draws[0], rows, contrasts)
        _add_paired_columns(measure, paired_columns, columns, table, rows)
    write_table(md_path, csv_path, spec["title"], lines, columns, table, html_path)


#: The perplexity tables' historical name; every measure goes through the same writer.
write_perplexity_table = write_spec_table
