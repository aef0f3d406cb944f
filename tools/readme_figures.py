"""Result figures in README.md come from result files, through this command, never by hand.

A generated block in the README sits between ``<!-- figures:NAME -->`` and
``<!-- /figures:NAME -->``; each NAME has a source file (a benchmark's JSON, a report's CSV)
and a renderer here. ``python tools/readme_figures.py`` rewrites every block whose source
exists; ``--check`` only compares and exits 1 when a block differs from its source (the test
suite runs it, so a committed figure cannot drift from its committed JSON).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _machine(data: dict) -> str:
    m = data.get("machine", {})
    return f"{m.get('cpus', '?')} CPUs ({m.get('machine', '?')}), torch {m.get('torch', '?')}"


def precision(data: dict) -> str:
    """bfloat16 vs float32 client masks on the embedded model (benchmarks/bench_precision.py)."""
    cal, ev = data["calibration"], data["evaluation"]
    lines = [
        f"{data['model']}, {cal['samples']} × {cal['seqlen']} {cal['dataset']} calibration tokens; perplexity on "
        f"{ev['windows']} {ev['dataset']} windows of {ev['seqlen']} tokens, evaluated in float32 so that only "
        f"the mask differs (dense: float32 {data['dense_ppl_float32']:.2f}, bfloat16 {data['dense_ppl_bfloat16']:.2f}). "
        f"Commit {data.get('commit', '?')}; {_machine(data)}.",
        "",
        "| method | group | sparsity | masks agree | weights that differ | ppl, float32 masks | ppl, bfloat16 masks | "
        "bfloat16 masks, bfloat16 evaluation | client time bf16 / fp32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["methods"]:
        lines.append(
            f"| {r['method']} | {r['group']} | {r['sparsity']:.0%} | {r['agreement']:.3%} | {r['differing_weights']:,} "
            f"| {r['ppl_float32_masks']:.2f} | {r['ppl_bfloat16_masks']:.2f} ({r['ppl_relative_difference']:+.2%}) "
            f"| {r['ppl_bfloat16_masks_bfloat16_eval']:.2f} | {r['seconds_bfloat16'] / r['seconds_float32']:.2f}× |")
    return "\n".join(lines)


def scale(data: dict) -> str:
    """Client and server at the embedded model's and at LLaMA-2-7B's shape (benchmarks/bench_scale.py)."""
    load = data.get("load", {})
    lines = [
        f"Commit {data.get('commit', '?')} (jobsize estimates: {data.get('estimates_commit', data.get('commit', '?'))}); "
        f"{_machine(data)}; load average before/after "
        f"{load.get('loadavg_before', '?')} / {load.get('loadavg_after', '?')}. {data.get('note', '')[:1].upper()}{data.get('note', '')[1:]}.",
        "",
        "| model | params | stored | client dtype, threads | calibration | client peak RSS (estimate) "
        "| s per block | client | aggregate of (real) | aggregate peak RSS (estimate) | aggregate |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["records"]:
        agg = r["aggregate"]
        lines.append(
            f"| {r['model']} | {r['params'] / 1e9:.2f} B | {r['dtype']} | {r['compute_dtype']}, {r['threads']} "
            f"| {r['samples']} × {r['seqlen']} | {r['peak_rss_mib']:,.0f} MiB ({r['estimate_mib']:,}) "
            f"| {r['seconds_per_block']:.2f} s | {r['client_seconds']:,.0f} s "
            f"| {agg['n_clients']} ({agg['real_clients']}) | {agg['peak_rss_mib']:,.0f} MiB ({agg['estimate_mib']:,}) "
            f"| {agg['seconds']:,.0f} s |")
        for other in r.get("other_compute_dtypes", []):
            lines.append(f"| ↳ same model, {other['dtype']} client | | | {other['dtype']}, {other['threads']} | "
                         f"| {other['peak_rss_mib']:,.0f} MiB ({other['estimate_mib']:,}) | {other['seconds_per_block']:.2f} s "
                         f"| {other['seconds']:,.0f} s | | | |")
    runs = [(r, row) for r in data["records"] for row in [r, *r.get("other_compute_dtypes", [])]]
    over = [row for _, row in runs if row["peak_rss_mib"] > row["estimate_mib"]]
    over += [r["aggregate"] for r in data["records"] if r["aggregate"]["peak_rss_mib"] > r["aggregate"]["estimate_mib"]]
    big = [row["peak_rss_mib"] for r, row in runs if r.get("random_weights")]
    lines += ["", f"Goal ({data['goal']}): {'met' if big and max(big) <= 4096 else 'NOT met'} "
              f"(largest {max(big, default=0):,.0f} MiB). Every job within its jobsize estimate: "
              f"{'yes' if not over else f'NO ({len(over)} above)'}."]
    return "\n".join(lines)


def _provenance(data: dict) -> str:
    return f"Commit {data.get('commit', '?')}; {_machine(data)}."


def client_mask(data: dict) -> str:
    """Wanda client mask vs two dense passes (benchmarks/bench_client_mask.py)."""
    return (f"- Wanda client mask, {data['tokens']:,} calibration tokens, vs two dense passes through the blocks "
            f"(the floor of any layer-wise method): {data['wanda_median']:.1f} s vs {data['floor_median']:.1f} s, "
            f"**{data['wanda_over_floor']:.2f}×** (goal {data['goal']}; medians of {len(data['wanda_seconds'])} "
            f"interleaved repeats). {_provenance(data)}")


def server(data: dict) -> str:
    """Mask file size and aggregation cost vs clients (benchmarks/bench_server.py)."""
    rows = sorted(data["aggregate"].items(), key=lambda kv: int(kv[0]))
    (small, a), (large, b) = rows[0], rows[-1]
    return (f"- Mask file: **{data['mask_file_bits_per_weight']:.3f} bits per weight** "
            f"({data['weights']:,} weights). Server aggregation (`fedlib aggregate`, its own process), "
            f"{small} vs {large} clients: {a['seconds']:.0f} s / {a['peak_rss_mib']:,.0f} MiB vs "
            f"{b['seconds']:.0f} s / {b['peak_rss_mib']:,.0f} MiB: peak memory "
            f"**{data['peak_ratio_large_over_small']:.2f}×** for {int(large) // int(small)}× the clients. "
            f"{_provenance(data)}")


def workflow(data: dict) -> str:
    """Where a `make run` spends its time (benchmarks/workflow_summary.py over its benchmark files)."""
    rules = sorted(data["rules"].items(), key=lambda kv: -kv[1]["seconds"])
    jobs = sum(r["jobs"] for _, r in rules)
    wall = f"wall time **{data['wall_seconds'] / 60:.1f} min**, " if data.get("wall_seconds") else ""
    lines = [f"`make run`: {jobs} jobs, {wall}{data['job_seconds_total'] / 60:.1f} min of job time. "
             f"{_provenance(data)}", "",
             "| rule | jobs | seconds per job | share of job time | peak RSS of a job |", "|---|---|---|---|---|"]
    lines += [f"| {rule} | {r['jobs']} | {r['seconds'] / r['jobs']:.1f} | {r['share']:.1%} | {r['max_rss_mib']:,.0f} MiB |"
              for rule, r in rules]
    return "\n".join(lines)


def table_csv(path: Path) -> Callable[[dict], str]:
    """A report table (its CSV) with the provenance lines of its Markdown header."""

    def render(rows: list[list[str]]) -> str:
        md = path.with_suffix(".md").read_text().splitlines()
        provenance = [line.removeprefix("- ") for line in md if line.startswith(("- Model:", "- Config:"))]
        out = [f"From `{path.relative_to(REPO)}`: " + "; ".join(provenance) + ".", ""]
        out.append("| " + " | ".join(rows[0]) + " |")
        out.append("|" + "---|" * len(rows[0]))
        out += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        return "\n".join(out)

    return render


def _load(path: Path):
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return list(csv.reader(path.open()))


SOURCES: dict[str, tuple[Path, Callable]] = {
    "precision": (REPO / "benchmarks/results/precision.json", precision),
    "scale": (REPO / "benchmarks/results/scale.json", scale),
    "client-mask": (REPO / "benchmarks/results/client_mask.json", client_mask),
    "server": (REPO / "benchmarks/results/server.json", server),
    "workflow": (REPO / "benchmarks/results/workflow.json", workflow),
    **{name: (REPO / path, table_csv(REPO / path)) for name, path in (
        ("table1", "reports/table1.csv"),
        ("table12-run", "reports/table12_run.csv"),
        ("gemma-table1", "reports/gemma3-270m/table1.csv"),
    )},
}


def blocks(text: str) -> dict[str, str]:
    """name -> the text between its markers (each on its own line)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- figures:([\w-]+) -->\n(.*?)<!-- /figures:\1 -->", text, re.S)}


def render_all(text: str, names=None) -> tuple[str, list[str]]:
    """README text with every available block regenerated, and the names regenerated."""
    done = []
    for name in blocks(text):
        source, render = SOURCES[name]
        if (names and name not in names) or not source.is_file():
            continue
        body = render(_load(source)) + "\n"
        text = re.sub(rf"(<!-- figures:{name} -->\n).*?(<!-- /figures:{name} -->)",
                      lambda m: m.group(1) + body + m.group(2), text, flags=re.S)
        done.append(name)
    return text, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if a block differs")
    parser.add_argument("--readme", default=str(REPO / "README.md"))
    parser.add_argument("names", nargs="*", help="blocks to regenerate (default: all whose source exists)")
    args = parser.parse_args()
    readme = Path(args.readme)
    text = readme.read_text()
    unknown = set(blocks(text)) - set(SOURCES)
    if unknown:
        print(f"{readme}: unknown figure blocks {sorted(unknown)}; known: {sorted(SOURCES)}", file=sys.stderr)
        return 2
    new, done = render_all(text, set(args.names))
    if args.check:
        stale = [n for n in done if blocks(new)[n] != blocks(text)[n]]
        for name in stale:
            print(f"{readme}: block {name} differs from {SOURCES[name][0].relative_to(REPO)} "
                  f"(run python tools/readme_figures.py)", file=sys.stderr)
        return 1 if stale else 0
    readme.write_text(new)
    print(f"regenerated {', '.join(done) or 'nothing'} in {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
