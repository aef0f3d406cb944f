"""The tiny workflow on a real Slurm through the executor plugin and the shipped profile
(`make test-slurm`; needs a running Slurm with accounting, e.g. ../shared/tools/slurm-up.sh).

Checked with sacct, job by job: every job completed; it asked for the CPUs of its rule's
threads, for one GPU exactly when it runs the model (device auto), and for the host memory
fedlib.jobsize estimates, which must cover what the job used (MaxRSS) on a cluster that kills
jobs over their request; cheap rules (data preparation, reports) ran on the submit host."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedlib.jobsize import host_mem_mb, tokens_in
from test_workflow import REPO, copy_test_dir, load_test_config, without_venv_path

pytestmark = pytest.mark.slurm

MODEL_RULES = {"client_mask", "centralized_mask", "evaluate_dense", "evaluate_perplexity", "zeroshot_dense",
               "zeroshot", "privacy_sensitivity", "privacy_membership", "privacy_defence_eval"}
LOCAL_RULES = {"materialize_model", "calibration_pool", "client_data", "eval_windows", "table1",
               "study_table12_run", "privacy_report_run"}


def sacct_jobs(ids: list[str]) -> dict[str, dict]:
    """Slurm job id -> its allocation's request and state, with the largest MaxRSS (MiB) of
    its steps (the batch script, and the srun step the plugin runs the job in)."""
    fields = ["JobID", "State", "ReqCPUS", "ReqMem", "ReqTRES", "MaxRSS"]
    out = subprocess.run(["sacct", "-n", "-P", "-j", ",".join(ids), "--format", ",".join(fields)],
                         capture_output=True, text=True, check=True).stdout
    jobs: dict[str, dict] = {}
    for line in out.splitlines():
        row = dict(zip(fields, line.split("|")))
        job, _, step = row["JobID"].partition(".")
        entry = jobs.setdefault(job, {"max_rss_mib": 0.0})
        if not step:
            entry.update(row)
        elif row["MaxRSS"]:
            entry["max_rss_mib"] = max(entry["max_rss_mib"], _mib(row["MaxRSS"]))
    return jobs


def _mib(value: str) -> float:
    """A sacct size (bytes, or with a K/M/G/T suffix) in MiB."""
    number, unit = re.fullmatch(r"([0-9.]+)([KMGT]?)", value).groups()
    return float(number) * {"": 2**-20, "K": 2**-10, "M": 1, "G": 2**10, "T": 2**20}[unit]


def test_tiny_workflow_on_slurm(tmp_path):
    if not (shutil.which("sbatch") and shutil.which("sacct")):
        pytest.fail("no Slurm here (sbatch/sacct not on PATH): run `make test-slurm`, which brings one up")
    copy_test_dir(tmp_path)
    config = load_test_config()
    env = without_venv_path()
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", "config.yaml", "--workflow-profile", str(REPO / "profiles" / "slurm"),
         "--slurm-init-seconds-before-status-checks", "5"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=3600,
    )
    log = proc.stdout + proc.stderr
    (tmp_path / "snakemake.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    assert (tmp_path / "reports" / "table1.csv").is_file() and (tmp_path / "reports" / "privacy_defence.md").is_file()

    # Slurm job id -> rule, from the plugin's log paths (.snakemake/slurm_logs/rule_<name>/...)
    submitted = {m.group(1): m.group(2) for m in
                 re.finditer(r"submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_(\w+)/(\S+)\)", log)}
    assert submitted, log[-4000:]
    logs = {m.group(1): m.group(2) for m in re.finditer(r"SLURM jobid (\d+) \(log: (\S+)\)", log)}
    jobs = sacct_jobs(sorted(submitted))
    assert set(jobs) == set(submitted), (sorted(jobs), sorted(submitted))
    rules: dict[str, list[dict]] = {}
    for slurm_id, job in jobs.items():
        rule = submitted[slurm_id]
        job["log"] = logs[slurm_id]
        rules.setdefault(rule, []).append(job)
        # no job was killed (over its memory request) or failed: every one ran once
        assert job["State"] == "COMPLETED", (rule, job)
        assert int(job["ReqCPUS"]) == config["threads"], (rule, job)
        gpus = re.search(r"gres/gpu=(\d+)", job["ReqTRES"])
        assert (int(gpus.group(1)) if gpus else 0) == (1 if rule in MODEL_RULES else 0), (rule, job["ReqTRES"])
        requested = _mib(job["ReqMem"])
        assert job["max_rss_mib"] <= requested, (rule, job)
        assert requested <= 4096, (rule, job)  # a tiny model asks for little, not a site default
    assert MODEL_RULES <= set(rules), sorted(rules)
    assert not LOCAL_RULES & set(rules), sorted(LOCAL_RULES & set(rules))

    # the request of client 0's mask job, computed here from the model and its shard
    shard = tmp_path / "results" / "shards" / "c4-3x32" / "iid-3" / "client_0.safetensors"
    expected = host_mem_mb(tmp_path / config["model"]["name"], "blocks", "float32", tokens_in([shard]), config["pruning"]["batch_size"])
    client0 = [j for j in rules["client_mask"] if Path(j["log"]).parent.name.endswith("_0")]
    assert [_mib(j["ReqMem"]) for j in client0] == [expected], (client0, expected)
