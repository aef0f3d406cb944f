"""Crash safety and determinism of the workflow on .test/ (issue 14).

A run killed with ``kill -9`` (its whole process group: Snakemake and its jobs) at seeded
points, between jobs and while a job is writing a file, and started again each time (the shipped
profile) after ``snakemake --unlock`` (``make unlock``: the workflow never removes a lock itself,
since only the user knows that no run is alive on another host), ends with the same bytes as a clean run in
another folder in every result file (results/ and reports/, except the logs and benchmark
files, which hold times) and leaves no temporary file behind. Every file of the killed run is
computed in its own folder, so the same bytes also show that two runs give the same bytes (a
second clean run would show nothing more).

One target covers every kind of stage at the least cost: two clients' masks, the Centralized
mask, one FedPrLLM aggregation, perplexity on one dataset, zero-shot on one task, Table 1 and
the zero-shot table, and the privacy inversion (a stage whose records held wall times).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_workflow import REPO, load_test_config, without_venv_path, write_config

pytestmark = pytest.mark.workflow

SECTIONS = dict(clients={"n": 2}, server={"groups": ["layer"], "scaling": [False]},
                evaluation={"datasets": ["wikitext2"]},
                zeroshot={"tasks": ["rte"], "run_rows": ["fedprllm_noscale"]})
TARGETS = ["reports/table1.md", "reports/table12_run.md",
           "results/privacy/c4-3x32/iid-2/wanda-0.5-row/run/inversion.json"]
NOT_RESULTS = ("logs", "benchmarks")  # results/ folders of per-job times and messages
TEMP_NAME = re.compile(r"\..+\.(tmp|spool)")  # fedlib.io's temporary files
JOB_START = re.compile(r"^(?:local)?rule (\w+):$", re.M)  # Snakemake starts a job
SEED = 14  # of the kill points
KILLS = 6


def result_digests(workdir: Path) -> dict[str, str]:
    """sha256 of every file in results/ and reports/ (not logs/ or benchmarks/)."""
    digests = {}
    for top in ("results", "reports"):
        for path in sorted((workdir / top).rglob("*")):
            rel = path.relative_to(workdir)
            if path.is_file() and not (top == "results" and rel.parts[1] in NOT_RESULTS):
                digests[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def leftovers(workdir: Path) -> list[str]:
    """Hidden or temporary files and folders anywhere under results/ and reports/."""
    return sorted(str(p.relative_to(workdir)) for top in ("results", "reports")
                  for p in (workdir / top).rglob(".*"))


def new_workdir(tmp_path_factory, name: str) -> Path:
    workdir = tmp_path_factory.mktemp(name)
    write_config(workdir, load_test_config(**SECTIONS))
    return workdir


def command(workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--cores", "2", *(args or TARGETS), "--configfile", "config.yaml"]


def unlock_after_kill(workdir: Path, check_refusal: bool = False) -> None:
    """The user's step after a killed run: Snakemake's own --unlock (the workflow never removes a
    lock itself). ``check_refusal``: first show that a run without it is refused, lock kept."""
    if not any((workdir / ".snakemake" / "locks").glob("*")):
        return
    if check_refusal:
        refused = subprocess.run(command(workdir), capture_output=True, text=True, env=without_venv_path(), cwd=workdir)
        assert refused.returncode != 0 and "cannot be locked" in refused.stdout + refused.stderr
        assert any((workdir / ".snakemake" / "locks").glob("*"))
    subprocess.run(command(workdir, "--unlock"), check=True, capture_output=True, env=without_venv_path(), cwd=workdir)


def children_cpu() -> float:
    """CPU seconds of this process's finished children and theirs (what a run cost, whatever
    else the machine is doing)."""
    t = os.times()
    return t.children_user + t.children_system


def run_clean(workdir: Path) -> str:
    start, cpu = time.perf_counter(), children_cpu()
    proc = subprocess.run(command(workdir), capture_output=True, text=True, env=without_venv_path(), cwd=workdir)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return f"{time.perf_counter() - start:.0f}s wall, {children_cpu() - cpu:.0f}s CPU"


def kill_plan(seed: int = SEED) -> list[tuple[str, float]]:
    """(kind, parameter) of each kill. ``writing``: the first temporary file that appears in
    results/ after the parameter-th job of the segment finished (a job is writing an output);
    ``finished``: right after the parameter-th "Finished job"; ``started``: parameter seconds after
    the segment's second job started (inside a job). The writing kills come first, while mask
    files (written for a while through a spool file) are still to be computed. The target has
    17 jobs and the first kill comes after about 7 quick ones, so every later kill lets at most
    a job or two finish (a ``started`` kill, none): all six land before the workflow is done."""
    rng = random.Random(seed)
    writing = [("writing", 0), ("writing", rng.randint(0, 1))]
    others = [("finished", 1), ("finished", 1),
              ("started", round(rng.uniform(0.3, 1.5), 2)), ("started", round(rng.uniform(0.3, 1.5), 2))]
    rng.shuffle(others)
    return (writing + others)[:KILLS]


def temp_files(results: Path) -> set[str]:
    found = set()
    for folder, dirs, files in os.walk(results):
        found.update(os.path.join(folder, n) for n in files + dirs if TEMP_NAME.fullmatch(n))
    return found


def run_segment(workdir: Path, kind: str | None, param: float) -> dict:
    """Start Snakemake in its own process group; kill -9 the group at the point (kind, param),
    or let it finish (kind None). What happened."""
    env = dict(without_venv_path(), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(command(workdir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=workdir, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    before = temp_files(workdir / "results")  # left by the previous kill
    deadline = time.monotonic() + 900
    started_at, caught = None, None
    seen = finished = starts = 0
    while proc.poll() is None and time.monotonic() < deadline:
        for line in lines[seen:len(lines)]:
            finished += "Finished job" in line
            starts += bool(JOB_START.match(line))
            seen += 1
        fire = False
        if kind == "finished":
            fire = finished >= param
        elif kind == "started" and starts >= 2:
            started_at = started_at or time.monotonic()
            fire = time.monotonic() - started_at >= param
        elif kind == "writing" and finished >= param:
            new = temp_files(workdir / "results") - before
            if new:
                fire, caught = True, sorted(str(Path(p).relative_to(workdir)) for p in new)
        if fire:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    else:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("snakemake ran for 15 minutes:\n" + "".join(lines[-50:]))
    proc.wait()
    reader.join(timeout=10)
    jobs = JOB_START.findall("".join(lines))
    return {"returncode": proc.returncode, "killed": proc.returncode == -signal.SIGKILL, "caught": caught,
            "jobs": jobs, "output": "".join(lines)}


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    workdir = new_workdir(tmp_path_factory, "clean")
    print(f"\nclean run: {run_clean(workdir)}")
    return workdir


def test_the_clean_run_has_every_stage_kind(clean_run):
    digests = result_digests(clean_run)
    kinds = {Path(p).parts[1] for p in digests if p.startswith("results/")}
    assert {"masks", "global", "eval", "zeroshot", "privacy"} <= kinds, kinds  # every stage kind is there
    assert {"reports/table1.csv", "reports/table12_run.csv"} <= set(digests)
    assert leftovers(clean_run) == []


def test_kill_9_at_seeded_points_then_rerun_gives_identical_bytes(clean_run, tmp_path_factory):
    workdir = new_workdir(tmp_path_factory, "killed")
    plan = kill_plan()
    print(f"\nkill points (seed {SEED}): {plan}")
    start, cpu = time.perf_counter(), children_cpu()
    landed = 0
    for i, (kind, param) in enumerate(plan):
        unlock_after_kill(workdir, check_refusal=i == 1)
        seg = run_segment(workdir, kind, param)
        assert seg["killed"] or seg["returncode"] == 0, seg["output"][-4000:]
        incomplete = list((workdir / ".snakemake" / "incomplete").glob("*"))
        print(f"segment {i}: {kind} {param}: {'killed' if seg['killed'] else 'finished'} after jobs "
              f"{seg['jobs']}; temp files caught {seg['caught']}; outputs marked incomplete: {len(incomplete)}")
        if not seg["killed"]:
            break
        landed += 1
    assert landed >= 5, f"only {landed} of the planned kills landed before the workflow finished"
    unlock_after_kill(workdir)
    final = run_segment(workdir, None, 0)
    assert final["returncode"] == 0, final["output"][-4000:]
    # (CPU of Snakemake processes only where killed: their jobs die unreaped by this process)
    print(f"kill chain and final run: {time.perf_counter() - start:.0f}s wall, {children_cpu() - cpu:.0f}s CPU")

    expected, got = result_digests(clean_run), result_digests(workdir)
    assert got.keys() == expected.keys()
    assert [p for p in expected if expected[p] != got[p]] == []
    assert leftovers(workdir) == []
    proc = subprocess.run(command(workdir) + ["-n"], capture_output=True, text=True, env=without_venv_path(),
                          cwd=workdir)
    assert "Nothing to be done" in proc.stdout + proc.stderr
