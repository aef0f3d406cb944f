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


def load_results(paths: Sequence[Path]) -> dict[str, dict]:
    results = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        results[data["label"]] = data
    return results


def _ppl(result: dict, dataset: str) -> float:
    return result["perplexity"][dataset]["ppl"]


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return fmt_ppl(values[0])
    return f"{fmt_ppl(statistics.mean(values))} ± {fmt_ppl(statistics.stdev(values))}"


def provenance_lines(context: dict, results: dict[str, dict]) -> list[str]:
    from fedlib import __version__

    any_result = next(iter(results.values()))
    lines = [
        f"Model: {context['model']} (fingerprint {any_result.get('model_fingerprint', '?')[:16]})",
        f"Config: {context.get('config', '?')}; seed {context.get('seed')}; "
        f"fedlib {__version__}, commit {context.get('commit', '?')}",
    ]
    if "setting" in context:
        lines.append(context["setting"])
    windows = []
    for dataset, row in any_result["perplexity"].items():
        windows.append(
            f"{DATASET_TITLES.get(dataset, dataset)} {row['windows']} of {row['total_windows']} "
            f"windows × {row['seqlen']} tokens"
        )
        if row.get("note"):
            lines.append(f"Offline: {row['note']}.")
    lines.append("Perplexity on " + "; ".join(windows) + " (evenly spaced, non-overlapping).")
    return lines


def write_table1(paths: Sequence[Path], md_path: Path, csv_path: Path, context: dict) -> None:
    """FedPrLLM Table 1 analogue: Dense, Centralized, Local-only and FedPrLLM x group x scaling."""
    results = load_results(paths)
    datasets = list(next(iter(results.values()))["perplexity"])
    columns = ["Method", "Comparison group", "Pruning strategy", "Weight scaling"] + [
        DATASET_TITLES.get(d, d) for d in datasets
    ]
    rows = []
    if "dense" in results:
        rows.append(["Dense", "-", "-", "-"] + [fmt_ppl(_ppl(results["dense"], d)) for d in datasets])
    if "centralized" in results:
        rows.append(["Centralized", "-", "-", "-"] + [fmt_ppl(_ppl(results["centralized"], d)) for d in datasets])
    local = [r for label, r in sorted(results.items()) if label.startswith("local_")]
    if local:
        rows.append([f"Local-only (mean ± std, {len(local)} clients)", "-", "-", "-"] + [
            _mean_std([_ppl(r, d) for r in local]) for d in datasets
        ])
    for strategy in ("oneshot", "iterative"):
        for scale in ("noscale", "scale"):
            for group in ("layer", "row", "column"):
                label = f"fedprllm_{strategy}_{group}_{scale}"
                if label in results:
                    rows.append([
                        "FedPrLLM", group.capitalize(),
                        "One-shot" if strategy == "oneshot" else "Iterative",
                        "✓" if scale == "scale" else "✗",
                    ] + [fmt_ppl(_ppl(results[label], d)) for d in datasets])
    write_table(md_path, csv_path,
                f"Table 1 analogue: perplexity of pruned {context['model']} "
                f"({context.get('method', 'wanda')}, {context.get('sparsity', 0.5):.0%} sparsity)",
                provenance_lines(context, results), columns, rows)
