"""The Snakemake workflow end to end on a tiny config: dry run, real run, no-op rerun,
and that only the stages a change affects rerun."""

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedlib.data import load_tokens, save_tokens

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.workflow


def tiny_config(model_dir, data_dir, windows=2):
    return {
        "seed": 0, "threads": 1, "data_dir": str(data_dir),
        "model": {"name": str(model_dir)},
        "calibration": {"dataset": "c4", "nsamples": 3, "seqlen": 32, "c4_docs": [0, 50]},
        "clients": {"n": 3, "partition": "iid"},
        "pruning": {"method": "wanda", "sparsity": 0.5, "local_group": "row", "batch_size": 8},
        "server": {"groups": ["layer", "column"], "scaling": [False, True]},
        "baselines": {"local_only_clients": 1},
        "evaluation": {"datasets": ["wikitext2", "c4", "ptb"], "seqlen": 32, "windows": windows,
                       "c4_docs": [800, 820], "batch_size": 1},
        "zeroshot": {"tasks": ["rte", "arc_easy"], "limit": 2, "batch_size": 8,
                     "run_rows": ["dense", "centralized", "fedprllm_noscale"]},
    }


def snakemake(workdir, *args):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
         "--cores", "2", *args],
        capture_output=True, text=True, env=env, cwd=workdir,
    )
    if proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def planned_jobs(output):
    """Rule -> count from the dry run's job stats table."""
    table = output.split("Job stats:", 1)[1] if "Job stats:" in output else ""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir, data_dir):
    work = tmp_path_factory.mktemp("workflow")
    (work / "config.yaml").write_text(yaml.safe_dump(tiny_config(tiny_model_dir, data_dir)))
    return work


def test_dry_run_plans_every_stage(workdir):
    jobs = planned_jobs(snakemake(workdir, "--configfile", "config.yaml", "-n"))
    assert jobs["client_mask"] == 3 and jobs["centralized_mask"] == 1
    assert jobs["aggregate"] == 2 and jobs["evaluate_dense"] == 1
    assert jobs["evaluate_perplexity"] == 1 + 1 + 4  # Centralized, 1 Local-only, 2 groups x 2 scalings
    assert jobs["client_data"] == 3 and jobs["table1"] == 1


def test_real_run_then_reruns_only_what_changed(workdir, tiny_model_dir, data_dir):
    snakemake(workdir, "--configfile", "config.yaml")
    rows = list(csv.reader((workdir / "reports" / "table1.csv").open()))
    assert rows[0][:4] == ["Method", "Comparison group", "Pruning strategy", "Weight scaling"]
    methods = [r[0] for r in rows[1:]]
    assert methods[:2] == ["Dense", "Centralized"] and methods[2].startswith("Local-only")
    assert methods.count("FedPrLLM") == 4
    for row in rows[1:]:
        for value in row[4:]:
            assert float(value.split(" ")[0]) > 1.0
    markdown = (workdir / "reports" / "table1.md").read_text()
    assert str(tiny_model_dir) in markdown and "held-out documents" in markdown
    for rule in ("client_mask", "aggregate", "evaluate", "report"):  # log: and benchmark: on every rule
        assert any((workdir / "results" / "logs" / rule).rglob("*.log")), rule
    for rule in ("client_mask", "aggregate", "evaluate", "report"):
        assert any((workdir / "results" / "benchmarks" / rule).rglob("*.tsv")), rule

    # a rerun does nothing
    assert "Nothing to be done" in snakemake(workdir, "--configfile", "config.yaml", "-n")

    # an evaluation setting changes: evaluation reruns, no mask is recomputed
    (workdir / "config_eval.yaml").write_text(yaml.safe_dump(tiny_config(tiny_model_dir, data_dir, windows=3)))
    jobs = planned_jobs(snakemake(workdir, "--configfile", "config_eval.yaml", "-n"))
    assert jobs.get("evaluate_perplexity") == 6 and jobs.get("evaluate_dense") == 1
    assert "client_mask" not in jobs and "centralized_mask" not in jobs and "aggregate" not in jobs

    # one client's data changes: only that client's mask and what depends on it
    # (a touch is not a change: Snakemake compares checksums of small inputs)
    shard = workdir / "results" / "shards" / "c4-3x32" / "iid-3" / "client_2.safetensors"
    ids, meta = load_tokens(shard)
    save_tokens(shard, ids.flip(1), **meta)
    jobs = planned_jobs(snakemake(workdir, "--configfile", "config.yaml", "-n"))
    assert jobs["client_mask"] == 1 and jobs["aggregate"] == 2
    assert "client_data" not in jobs and "calibration_pool" not in jobs and "centralized_mask" not in jobs
    # client 2 is not a Local-only client here: Dense, Centralized and Local-only stay
    assert jobs["evaluate_perplexity"] == 4 and "evaluate_dense" not in jobs


def test_invalid_config_is_rejected(tmp_path, tiny_model_dir, data_dir):
    config = tiny_config(tiny_model_dir, data_dir)
    config["pruning"]["sparsity"] = 1.5
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(AssertionError, match="sparsity"):
        snakemake(tmp_path, "--configfile", "config.yaml", "-n")


def test_named_study_targets_plan(tmp_path, tiny_model_dir, data_dir):
    """Every named study target resolves to a complete DAG on a tiny config."""
    config = tiny_config(tiny_model_dir, data_dir)
    config["studies"] = {"local_groups": ["layer"], "sparsities": [0.6], "methods": ["sparsegpt", "owl"],
                         "clients_sweep": [1, 3], "samples_sweep": [2, 4],
                         "noniid": {"per_dataset": 2, "clients": 3, "alpha": 5},
                         "fedspallm": {"clients": [2], "sparsities": [0.5], "standalone_clients": 1, "rounds": 1}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    targets = ["table1_full", "table2", "table4", "table5", "table6", "table10", "table11", "table14",
               "figure2", "figure3", "fedspallm2"]
    jobs = planned_jobs(snakemake(tmp_path, *targets, "--configfile", str(tmp_path / "config.yaml"), "-n"))
    assert jobs["iterative"] == 4 and jobs["fedspallm"] == 1 and jobs["random_mask"] == 1
    assert all(jobs[f"study_{t}"] == 1 for t in targets)
