"""The slowest tests of a pytest run, from its JUnit XML (``pytest --junitxml=FILE``; `make test`
writes build/junit.xml), into benchmarks/results/test_durations.json, which README.md's block
``test-durations`` renders (tools/readme_figures.py)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def slowest(junit: Path, n: int) -> dict:
    root = ET.parse(junit).getroot()
    cases = [(float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}") for c in root.iter("testcase")]
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return {
        "tests": len(cases),
        "seconds_total": round(sum(float(s.get("time", 0)) for s in suites), 1),
        "slowest": [{"test": name, "seconds": round(sec, 1)} for sec, name in sorted(cases, reverse=True)[:n]],
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip() or "?",
        "machine": {"cpus": os.cpu_count(), "machine": platform.machine()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="pytest's JUnit XML")
    parser.add_argument("-n", type=int, default=15, help="how many of the slowest tests (default 15)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/test_durations.json")
    args = parser.parse_args()
    record = slowest(args.junit, args.n)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.out}: the {len(record['slowest'])} slowest of {record['tests']} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
