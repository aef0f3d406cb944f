"""Report tables (Markdown + CSV, optionally HTML) built from the workflow's evaluation results.

Every table is described by a *spec* (built by the workflow's ``*_spec()`` functions):
``title``, ``context`` (see :func:`provenance_lines`), ``columns`` (the leading,
descriptive columns), ``rows`` (each with its descriptive ``cells`` and the result JSON
files it reports) and ``measure``, which names the kind of result files and so the value
columns: ``perplexity`` (``fedlib evaluate``; one column per dataset) or ``zeroshot``
(``fedlib zeroshot``; one column per task plus the mean accuracy). One writer,
:func:`write_spec_table`, serves every measure; a :class:`Measure` says how a result file
becomes cells and which evaluation lines the header carries.
"""

from __future__ import annotations

import csv
import html
import io
import json
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


def _zeroshot_paired(result: dict, reference: dict) -> dict[str, float]:
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


def _fmt_acc(value: float) -> str:
    return f"{value:.2f}"


@dataclass(frozen=True)
class Measure:
    """How one kind of result file becomes table cells.

    ``columns(example)`` -> [(key, column title)]; ``value(result, key)`` -> a number;
    ``fmt`` formats it; ``lines(example)`` are the header lines saying what was evaluated;
    ``setup(result)`` must agree over every result of a table (same windows / tasks / limit);
    ``paired(result, reference)`` -> {delta, se, low, high}: the difference from the spec's
    ``paired_reference`` result on the same documents (a column when the spec names one)."""

    name: str
    columns: Callable[[dict], list[tuple[str, str]]]
    value: Callable[[dict, str], float]
    fmt: Callable[[float], str]
    lines: Callable[[dict], list[str]]
    setup: Callable[[dict], dict]
    paired: Callable[[dict, dict], dict[str, float]] | None = None


MEASURES: dict[str, Measure] = {
    "perplexity": Measure("perplexity", _perplexity_columns, _perplexity_value, fmt_ppl,
                          _perplexity_lines, _perplexity_setup),
    "zeroshot": Measure("zeroshot", _zeroshot_columns, _zeroshot_value, _fmt_acc,
                        _zeroshot_lines, _zeroshot_setup, _zeroshot_paired),
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


def write_spec_table(spec: dict, md_path: Path, csv_path: Path, html_path: Path | None = None) -> None:
    """A table from a spec (see the module docstring): one file per row gives the value,
    several give mean ± std (Local-only over clients)."""
    measure, loaded = load_rows(spec)
    example = loaded[0][0]
    value_columns = measure.columns(example)
    columns = list(spec["columns"]) + [title for _, title in value_columns]
    lines = provenance_lines(spec["context"], example, measure)
    reference_path = spec.get("paired_reference") if measure.paired else None
    if reference_path:
        reference = _load(reference_path)
        if measure.setup(reference) != measure.setup(example):
            raise ValueError(f"{reference_path}: evaluated with {measure.setup(reference)}, but the table's first "
                             f"result with {measure.setup(example)}; rerun the evaluation")
        name = reference.get("label", "the reference")
        columns.append(f"Δ Mean vs {name} [95 % CI]")
        lines.append(f"Δ Mean vs {name}: the row's Mean minus {name}'s on the same documents (points), with a 95 % "
                     "paired normal interval from the per-document differences (standard error "
                     "sqrt(Σ_t s_t²/n_t)/T over the T tasks); an interval that excludes 0 is a resolved difference. "
                     "Rows of several results: mean ± std of their differences.")
    table = []
    for row, results in zip(spec["rows"], loaded):
        values = [_mean_std([measure.value(r, key) for r in results], measure.fmt) for key, _ in value_columns]
        if reference_path:
            values.append(_paired_cell(row["results"], results, reference_path, reference, measure))
        table.append(list(row["cells"]) + values)
    write_table(md_path, csv_path, spec["title"], lines, columns, table, html_path)


def _paired_cell(paths: Sequence[str], results: list[dict], reference_path: str, reference: dict,
                 measure: Measure) -> str:
    if [str(Path(p).resolve()) for p in paths] == [str(Path(reference_path).resolve())]:
        return "reference"
    diffs = [measure.paired(r, reference) for r in results]
    if len(diffs) == 1:
        d = diffs[0]
        return f"{d['delta']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"
    deltas = [d["delta"] for d in diffs]
    return f"{statistics.mean(deltas):+.2f} ± {statistics.stdev(deltas):.2f}"


#: The perplexity tables' historical name; every measure goes through the same writer.
write_perplexity_table = write_spec_table
