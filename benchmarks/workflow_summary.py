"""Which rules dominate a workflow run: sums Snakemake's `benchmark:` files per rule."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from common import write

from fedlib.cost import read_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", default="results")
    parser.add_argument("--wall", type=float, help="measured wall time of the run, seconds")
    parser.add_argument("--before", type=Path,
                        help="this script's JSON of an earlier run: kept beside this one for a before/after table")
    args = parser.parse_args()
    per_rule: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "seconds": 0.0, "max_rss_mib": 0.0})
    for tsv in sorted(Path(args.results, "benchmarks").rglob("*.tsv")):
        rule = tsv.relative_to(Path(args.results, "benchmarks")).parts[0].removesuffix(".tsv")
        job = read_benchmark(tsv)
        entry = per_rule[rule]
        entry["jobs"] += 1
        entry["seconds"] += job["s"]
        entry["max_rss_mib"] = max(entry["max_rss_mib"], job["max_rss"] or 0.0)
    total = sum(e["seconds"] for e in per_rule.values())
    for rule, entry in sorted(per_rule.items(), key=lambda kv: -kv[1]["seconds"]):
        entry["share"] = entry["seconds"] / total
        print(f"{rule:22s} {entry['jobs']:3d} jobs {entry['seconds']:8.1f}s {entry['share']:6.1%}")
    payload = {"wall_seconds": args.wall, "job_seconds_total": total, "rules": dict(per_rule)}
    if args.before:
        before = json.loads(args.before.read_text())
        payload["before"] = {key: before[key] for key in ("commit", "machine", "wall_seconds", "job_seconds_total", "rules")}
    write("workflow", payload)


if __name__ == "__main__":
    main()
