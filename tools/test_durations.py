"""The slowest tests of `make test`, into benchmarks/results/test_durations.json.

``python tools/test_durations.py`` runs the suite as `make test` runs it (pytest with 2 workers,
``--dist loadfile``) with a JUnit XML report and reads each test's time from it (setup, call and
teardown together: a test that first asks for a shared Snakemake run carries that run's time);
``--junit FILE`` reads the report of a run made otherwise instead. The JSON holds the run's wall
time, its outcome counts and the slowest tests (15 unless ``--top``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))  # the checkout's fedlib (the commit measured), as from tests

from common import write  # noqa: E402

MAKE_TEST = ["-q", "-rs", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]  # `make test`'s pytest arguments


def node_id(classname: str, name: str, root: Path) -> str:
    """pytest's node id of a JUnit test case: ``tests.test_x.TestY`` + ``test_z`` ->
    ``tests/test_x.py::TestY::test_z`` (the module is the longest prefix that is a file under ``root``)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = Path(*parts[:cut]).with_suffix(".py")
        if (root / module).is_file():
            return "::".join([module.as_posix(), *parts[cut:], name])
    return f"{classname}::{name}"


def outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
    return "passed"


def summarize(junit: Path, top: int, root: Path = REPO) -> dict:
    """The run's wall time and outcome counts, and its ``top`` slowest tests, from pytest's JUnit XML
    (run in ``root``)."""
    report = ET.parse(junit).getroot()
    suite = report if report.tag == "testsuite" else report.find("testsuite")
    if suite is None:
        raise SystemExit(f"{junit}: no <testsuite> element (expected pytest's --junitxml report)")
    cases = [{"test": node_id(c.get("classname", ""), c.get("name", ""), root), "seconds": float(c.get("time", 0)),
              "outcome": outcome(c)} for c in suite.iter("testcase")]
    cases.sort(key=lambda c: -c["seconds"])
    counts: dict[str, int] = {}
    for case in cases:
        counts[case["outcome"]] = counts.get(case["outcome"], 0) + 1
    return {"wall_seconds": float(suite.get("time", 0)), "tests": len(cases), "outcomes": counts,
            "test_seconds_total": round(sum(c["seconds"] for c in cases), 3), "slowest": cases[:top]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--junit", type=Path, help="a pytest --junitxml report to read instead of running the suite")
    parser.add_argument("--top", type=int, default=15, help="how many of the slowest tests to keep")
    parser.add_argument("pytest_args", nargs="*", help=f"pytest's arguments (after --; default {' '.join(MAKE_TEST)})")
    args = parser.parse_args()
    command = None  # of a run made elsewhere (--junit): not known here
    if args.junit is not None:
        if args.pytest_args:
            parser.error("--junit reads a finished run: pytest arguments would not be used")
        summary = summarize(args.junit, args.top)
    else:
        pytest_args = args.pytest_args or MAKE_TEST
        command = ["python", "-m", "pytest", *pytest_args]
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "junit.xml"
            proc = subprocess.run([sys.executable, *command[1:], f"--junitxml={junit}"], cwd=REPO)
            if not junit.is_file():
                raise SystemExit(f"pytest exited with {proc.returncode} and wrote no report")
            summary = summarize(junit, args.top)
        summary["pytest_exit_code"] = proc.returncode
    for case in summary["slowest"]:
        print(f"{case['seconds']:8.1f}s  {case['outcome']:7s} {case['test']}")
    print(f"{summary['tests']} tests, {summary['outcomes']}, {summary['wall_seconds']:.0f}s wall")
    write("test_durations", {"command": command and " ".join(command), **summary})


if __name__ == "__main__":
    main()
