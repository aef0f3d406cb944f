"""Report tables (Markdown + CSV) built from the workflow's evaluation results."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from fedlib.io import write_text_atomic

DATASET_TITLES = {"wikitext2": "WikiText-2", "c4": "C4", "ptb": "PTB"}


def fmt_ppl(value: float) -> str:
    return f"{value:.2f}" if value < 1000 else f"{value:.1f}"


def write_table(md_path: Path, csv_path: Path, title: str, header_lines: Sequence[str],
                columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """One table as Markdown (title, provenance lines, table) and as plain CSV."""
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


def _load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return fmt_ppl(values[0])
    return f"{fmt_ppl(statistics.mean(values))} ± {fmt_ppl(statistics.stdev(values))}"


def provenance_lines(context: dict, example: dict) -> list[str]:
    """Header lines every table carries: model + fingerprint, config, seed, version, commit,
    the setting and exactly which evaluation windows were scored."""
    from fedlib import __version__

    lines = [
        f"Model: {context['model']} (fingerprint {example.get('model_fingerprint', '?')[:16]})",
        f"Config: {context.get('config', '?')}; seed {context.get('seed')}; "
        f"fedlib {__version__}, commit {context.get('commit', '?')}",
    ]
    lines += context.get("lines", [])
    windows = []
    for dataset, row in example["perplexity"].items():
        windows.append(
            f"{DATASET_TITLES.get(dataset, dataset)} {row['windows']} of {row['total_windows']} "
            f"windows × {row['seqlen']} tokens"
        )
        if row.get("note"):
            lines.append(f"Offline: {row['note']}.")
    lines.append("Perplexity on " + "; ".join(windows) + " (evenly spaced, non-overlapping).")
    return lines


def write_perplexity_table(spec: dict, md_path: Path, csv_path: Path) -> None:
    """A perplexity table from a spec: ``title``, ``context`` (see :func:`provenance_lines`),
    ``columns`` (the leading, descriptive columns) and ``rows``, each with its descriptive
    ``cells`` and the evaluation ``results`` (JSON files) it reports: one file gives the
    value, several give mean ± std (Local-only over clients)."""
    rows = spec["rows"]
    loaded = [[_load(p) for p in row["results"]] for row in rows]
    example = loaded[0][0]
    datasets = list(example["perplexity"])
    columns = list(spec["columns"]) + [DATASET_TITLES.get(d, d) for d in datasets]
    table = []
    for row, results in zip(rows, loaded):
        values = [_mean_std([r["perplexity"][d]["ppl"] for r in results]) for d in datasets]
        table.append(list(row["cells"]) + values)
    write_table(md_path, csv_path, spec["title"], provenance_lines(spec["context"], example), columns, table)
