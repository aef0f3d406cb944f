"""The Snakemake workflow end to end on .test/ (its config, tiny model and data slices): dry
run, real run, no-op rerun, and that only the stages a change affects rerun."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedlib.data import load_tokens, save_tokens

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.workflow


TEST_DIR = REPO / ".test"  # the test config and the tiny model and data it runs on
COPY_IGNORE = shutil.ignore_patterns("results", "reports", "resources", "logs", ".snakemake")


def load_test_config(**sections) -> dict:
    """.test/config.yaml with some keys of its sections changed (``evaluation={"windows": 3}``)."""
    config = yaml.safe_load((TEST_DIR / "config.yaml").read_text())
    for section, changes in sections.items():
        config[section].update(changes)
    return config


def write_config(dest: Path, config: dict) -> None:
    """.test/ at ``dest`` with ``config`` as its config.yaml."""
    copy_test_dir(dest)
    (dest / "config.yaml").write_text(yaml.safe_dump(config))


def copy_test_dir(dest: Path) -> Path:
    """.test/ copied to ``dest``: the workflow writes its results beside the config it runs."""
    shutil.copytree(TEST_DIR, dest, ignore=COPY_IGNORE, dirs_exist_ok=True)
    return dest


def without_venv_path() -> dict:
    """The environment minus this interpreter's bin folder on PATH: jobs must find their
    `python` the way they do for a user who runs .venv/bin/snakemake without activating."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    return dict(os.environ, PATH=path)


def snakemake(workdir, *args):
    env = without_venv_path()
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
def workdir(tmp_path_factory):
    return copy_test_dir(tmp_path_factory.mktemp("workflow"))


def test_dry_run_plans_every_stage(workdir):
    jobs = planned_jobs(snakemake(workdir, "--configfile", "config.yaml", "-n"))
    assert jobs["client_mask"] == 3 and jobs["centralized_mask"] == 1
    assert jobs["aggregate"] == 2 and jobs["evaluate_dense"] == 1
    assert jobs["evaluate_perplexity"] == 1 + 1 + 4  # Centralized, 1 Local-only, 2 groups x 2 scalings
    assert jobs["client_data"] == 3 and jobs["table1"] == 1
    # the reduced privacy audit: one job per analysis, one noisy global mask + evaluation per ε
    assert all(jobs[f"privacy_{a}"] == 1 for a in ("entropy", "similarity", "sensitivity", "membership", "inversion"))
    assert jobs["privacy_rr_aggregate"] == 1 and jobs["privacy_defence_eval"] == 1 and jobs["privacy_report_run"] == 1
    # zero-shot rows of `make run`: Dense, Centralized, FedPrLLM per group without scaling
    assert jobs["zeroshot_dense"] == 1 and jobs["zeroshot"] == 1 + 2 and jobs["study_table12_run"] == 1


def test_real_run_then_reruns_only_what_changed(workdir):
    snakemake(workdir, "--configfile", "config.yaml")
    rows = list(csv.reader((workdir / "reports" / "table1.csv").open()))
    assert rows[0][:4] == ["Method", "Comparison group", "Pruning strategy", "Weight scaling"]
    methods = [r[0] for r in rows[1:]]
    assert methods[:2] == ["Dense", "Centralized"] and methods[2].startswith("Local-only")
    assert methods.count("FedPrLLM") == 4
    assert rows[0][7:] == [f"{d} vs centralized [95 % CI]" for d in ("WikiText-2", "C4", "PTB")]
    for row in rows[1:]:
        for value in row[4:7]:
            assert float(value.split(" ")[0]) > 1.0
    assert rows[2][7:] == ["reference"] * 3
    for row in rows[1:2] + rows[4:]:  # the row's perplexity over Centralized's, inside its paired interval
        for value, ppl, central in zip(row[7:], row[4:7], rows[2][4:7]):
            factor = value.startswith("×")
            ratio, low, high = (float(x.strip("×%").replace(",", "")) for x in
                                re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", value).groups())
            assert low <= ratio <= high
            shown = ratio if factor else 1 + ratio / 100
            assert shown == pytest.approx(float(ppl) / float(central), rel=0.01)
    markdown = (workdir / "reports" / "table1.md").read_text()
    assert "FedPrLLM (layer, one-shot) vs Local-only: WikiText-2 " in markdown
    assert "- Not resolved at 95 %" in markdown or "- Every difference with an interval" in markdown
    assert "./model (fingerprint" in markdown and "held-out documents" in markdown
    for name in ("entropy", "similarity", "sensitivity", "membership", "inversion", "defence"):
        assert "./model" in (workdir / "reports" / f"privacy_{name}.md").read_text(), name
    assert (workdir / "reports" / "privacy_defence.png").stat().st_size > 0
    zeroshot = list(csv.reader((workdir / "reports" / "table12_run.csv").open()))
    assert zeroshot[0][4:] == ["RTE", "ARC-e", "Mean", "Δ Mean vs dense [95 % CI]"]
    assert [r[:2] for r in zeroshot[1:]] == [["Dense", "-"], ["Centralized", "-"], ["FedPrLLM", "Layer"],
                                             ["FedPrLLM", "Column"]]
    assert all(0 <= float(v) <= 100 for r in zeroshot[1:] for v in r[4:-1])
    assert zeroshot[1][-1] == "reference"
    for r in zeroshot[2:]:  # the row's Mean minus Dense's, inside its interval
        diff, low, high = map(float, re.fullmatch(r"([-+][\d.]+) \[([-+][\d.]+), ([-+][\d.]+)\]", r[-1]).groups())
        assert low <= diff <= high and abs(diff - (float(r[-2]) - float(zeroshot[1][-2]))) < 0.01
    assert "limit 2 per task" in (workdir / "reports" / "table12_run.md").read_text()
    transfer = list(csv.reader((workdir / "reports" / "cost_transfer.csv").open()))
    assert [r[:3] for r in transfer[1:]] == [["FedPrLLM one-shot", "layer", "1"], ["FedPrLLM iterative", "layer", "2"]]
    assert (workdir / "reports" / "cost_network.csv").is_file()
    for rule in ("client_mask", "aggregate", "evaluate", "zeroshot", "report"):  # log: and benchmark: on every rule
        assert any((workdir / "results" / "logs" / rule).rglob("*.log")), rule
    for rule in ("client_mask", "aggregate", "evaluate", "zeroshot", "report"):
        assert any((workdir / "results" / "benchmarks" / rule).rglob("*.tsv")), rule

    # a rerun does nothing
    assert "Nothing to be done" in snakemake(workdir, "--configfile", "config.yaml", "-n")

    # the HTML report is built from the existing results: no job runs, nothing is rewritten
    before = {p: p.stat().st_mtime_ns for p in (workdir / "results").rglob("*") if p.is_file()}
    before.update({p: p.stat().st_mtime_ns for p in (workdir / "reports").rglob("*") if p.is_file()})
    log = snakemake(workdir, "--configfile", "config.yaml", "--report", "reports/report.html")
    assert "Report created" in log and "Finished job" not in log
    after = {p: p.stat().st_mtime_ns for p in (workdir / "results").rglob("*") if p.is_file()}
    after.update({p: p.stat().st_mtime_ns for p in (workdir / "reports").rglob("*")
                  if p.is_file() and p.name != "report.html"})
    assert after == before
    assert "Nothing to be done" in snakemake(workdir, "--configfile", "config.yaml", "-n")
    report = (workdir / "reports" / "report.html").read_text()
    assert "table1.html" in report and "table12_run.html" in report and '"Zero-shot"' in report
    assert "privacy_membership.html" in report and "privacy_defence.png" in report and '"Privacy"' in report
    assert "cost_transfer.html" in report and "cost_network.html" in report and '"Cost"' in report

    # an evaluation setting changes: evaluation reruns, no mask is recomputed
    (workdir / "config_eval.yaml").write_text(yaml.safe_dump(load_test_config(evaluation={"windows": 3})))
    jobs = planned_jobs(snakemake(workdir, "--configfile", "config_eval.yaml", "-n"))
    assert jobs.get("evaluate_perplexity") == 6 and jobs.get("evaluate_dense") == 1
    assert "client_mask" not in jobs and "centralized_mask" not in jobs and "aggregate" not in jobs
    assert "zeroshot" not in jobs and "zeroshot_dense" not in jobs  # perplexity windows only

    # one client's data changes: only that client's mask and what depends on it
    # (a touch is not a change: Snakemake compares checksums of small inputs)
    shard = workdir / "results" / "shards" / "c4-3x32" / "iid-3" / "client_2.safetensors"
    original = shard.read_bytes()
    ids, meta = load_tokens(shard)
    save_tokens(shard, ids.flip(1), **meta)
    jobs = planned_jobs(snakemake(workdir, "--configfile", "config.yaml", "-n"))
    assert jobs["client_mask"] == 1 and jobs["aggregate"] == 2
    assert "client_data" not in jobs and "calibration_pool" not in jobs and "centralized_mask" not in jobs
    # client 2 is not a Local-only client here: Dense, Centralized and Local-only stay
    assert jobs["evaluate_perplexity"] == 4 and "evaluate_dense" not in jobs
    assert jobs["zeroshot"] == 2 and "zeroshot_dense" not in jobs  # FedPrLLM layer and column
    shard.write_bytes(original)  # the same content again (the privacy targets below run in this folder)


def test_html_report_renders_in_a_browser(workdir):
    """tools/check_report.py in headless chromium on the report the previous test built:
    the app lists both categories, tables render with their CSV's cells, captions show."""
    import shutil

    if not (workdir / "reports" / "report.html").is_file():
        pytest.skip("no report: test_real_run_then_reruns_only_what_changed did not get that far")
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("no chromium on PATH: the HTML report was built but not checked in a browser "
                    "(Debian: apt-get install chromium)")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "check_report.py"), "reports/report.html",
                           "--expect-category", "Perplexity", "--expect-category", "Zero-shot",
                           "--expect-category", "Privacy"],
                          capture_output=True, text=True, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reports/table12_run.html: 4 rows x 7 columns rendered (= its CSV)" in proc.stdout
    assert "reports/privacy_membership.html:" in proc.stdout and "reports/privacy_defence.png:" in proc.stdout


def test_named_study_targets_plan(tmp_path):
    """Every named study target resolves to a complete DAG on a tiny config."""
    config = load_test_config()
    config["studies"] = {"local_groups": ["layer"], "sparsities": [0.6], "methods": ["sparsegpt", "owl"],
                         "clients_sweep": [1, 3], "samples_sweep": [2, 4],
                         "noniid": {"per_dataset": 2, "clients": 3, "alpha": 5},
                         "fedspallm": {"clients": [2], "sparsities": [0.5], "standalone_clients": 1, "rounds": 1},
                         "table1_seeds": [0, 5]}
    write_config(tmp_path, config)
    targets = ["table1_full", "table1_seeds", "table2", "table4", "table5", "table6", "table10", "table11", "table14",
               "figure2", "figure3", "fedspallm2", "table12", "table13"]
    out = snakemake(tmp_path, *targets, "--configfile", str(tmp_path / "config.yaml"), "-n", "-p")
    jobs = planned_jobs(out)
    # table1_seeds' second draw: its own pool, sampled and split with seed 5 (tie-breaks keep the config's seed 0)
    assert re.search(r"--seed 5 --c4-docs 0 50 --out results/pools/c4-3x32-seed5\.safetensors", out)
    assert re.search(r"--pool results/pools/c4-3x32-seed5\.safetensors .*--seed 5 ", out)
    assert re.search(r"--calib results/shards/c4-3x32-seed5/iid-3/client_0\.safetensors .*--seed 0 ", out)
    assert jobs["iterative"] == 4 and jobs["fedspallm"] == 1 and jobs["random_mask"] == 1
    assert all(jobs[f"study_{t}"] == 1 for t in targets)
    assert jobs["plot_figure2"] == jobs["plot_figure3"] == jobs["plot_table6"] == 1
    # table12: Dense, Centralized, 1 Local-only, 2 groups x 2 scalings; table13 (local group layer):
    # Centralized, 1 Local-only, FedPrLLM layer/row/column
    assert jobs["zeroshot_dense"] == 1 and jobs["zeroshot"] == (1 + 1 + 4) + (1 + 1 + 3)


def test_cost_targets_plan(tmp_path):
    """cost_time reads the benchmark files of the setting's jobs (it plans them); cost_fedspallm
    runs FedSpaLLM on the default setting's clients for its row."""
    copy_test_dir(tmp_path)
    jobs = planned_jobs(snakemake(tmp_path, "cost_time", "cost_fedspallm", "--configfile", "config.yaml", "-n"))
    assert jobs["cost_time_table"] == 1 and jobs["client_mask"] == 3 and jobs["centralized_mask"] == 1
    assert jobs["aggregate"] == 2 and jobs["fedspallm"] == 1
    assert jobs["cost_transfer_fedspallm"] == jobs["cost_network_fedspallm"] == 1
    assert "cost_transfer" not in jobs and "evaluate_perplexity" not in jobs


def test_workflow_passes_snakemake_lint(tmp_path):
    """The catalog's conventions (log on every rule, no hard-coded prefixes, functions out of rule files)."""
    copy_test_dir(tmp_path)
    out = snakemake(tmp_path, "--configfile", "config.yaml", "--lint")
    assert "Lints for" not in out, out


MODULE_SNAKEFILE = """
configfile: "config.yaml"


module fedlib:
    snakefile:
        "{snakefile}"
    config:
        config


use rule * from fedlib as fedlib_*


rule outer:
    output:
        "outer.txt",
    shell:
        "echo PYTHONPATH=${{{{PYTHONPATH-}}}} > {{output}}"
"""


def test_the_workflow_is_usable_as_a_module(tmp_path):
    """Another workflow imports this one (`module` + `use rule *`): the dry run plans rule all's
    jobs, a real target runs the same command as in the workflow itself, and the importer's own
    rules see no environment of ours (no PYTHONPATH leaks through a shell prefix)."""
    outer, alone = tmp_path / "outer", tmp_path / "alone"
    copy_test_dir(outer)
    copy_test_dir(alone)
    (outer / "Snakefile").write_text(MODULE_SNAKEFILE.format(snakefile=REPO / "Snakefile"))
    env = {k: v for k, v in without_venv_path().items() if k != "PYTHONPATH"}

    def outer_snakemake(*args):
        proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], capture_output=True,
                              text=True, env=env, cwd=outer)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return proc.stdout + proc.stderr

    jobs = planned_jobs(outer_snakemake("-n", "fedlib_all"))
    assert jobs["fedlib_client_mask"] == 3 and jobs["fedlib_table1"] == 1 and jobs["fedlib_all"] == 1
    pool = "results/pools/c4-3x32.safetensors"
    command = re.compile(r"^.* -m fedlib calibration-pool .*$", re.M)
    printed = command.search(outer_snakemake("-n", "-p", pool))[0]
    assert printed == command.search(snakemake(alone, pool, "--configfile", "config.yaml", "-n", "-p"))[0]
    outer_snakemake(pool, "outer.txt")
    assert tuple(load_tokens(outer / pool)[0].shape) == (3, 32)
    assert (outer / "outer.txt").read_text() == "PYTHONPATH=\n"


def test_fedspallm_samples_per_client_sets_the_pool(tmp_path):
    """studies.fedspallm.samples_per_client gives every client that many samples (the paper's
    setting) instead of splitting calibration.nsamples."""
    config = load_test_config()
    config["studies"] = {"fedspallm": {"clients": [2], "sparsities": [0.5], "standalone_clients": 1,
                                       "samples_per_client": 5}}
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "fedspallm2", "--configfile", str(tmp_path / "config.yaml"), "-n", "-p")
    seqlen = config["calibration"]["seqlen"]
    assert f"results/pools/c4-10x{seqlen}.safetensors" in out
    assert "--nsamples 10 " in out and "/iid-2/sparsegpt_update-0.5-layer/fedspallm.json" in out


def test_settings_reach_the_commands(tmp_path):
    """pruning.method_options goes to every job pruning with the method it names (nothing else
    changes); studies.fedspallm.resources turns on layer sampling, without Standalone models;
    server.robust goes to the one-shot server (rule aggregate, its {strategy} from the path) and
    upload.format_version to the clients' uploads only (not Centralized's mask)."""
    config = load_test_config(server={"robust": "mad"})
    config["pruning"]["method"] = "owl"  # options the methods accept (the shell quoting: tests/test_catalog.py)
    config["pruning"]["method_options"] = {"owl": {"lam": 0.1}, "sparsegpt_update": {"blocksize": 16}}
    config["studies"] = {"fedspallm": {"clients": [2], "sparsities": [0.5], "standalone_clients": 1, "rounds": 2,
                                       "resources": [0.5, 1]}}
    config["upload"] = {"format_version": 2}
    write_config(tmp_path, config)
    out = snakemake(tmp_path, "fedspallm2", "table1", "privacy", "--configfile", str(tmp_path / "config.yaml"), "-n", "-p")
    commands = [line for line in out.splitlines() if "python -m fedlib " in line]
    owl = "--method-options '{\"lam\": 0.1}'"
    for verb in ("client-mask", "privacy similarity", "privacy sensitivity", "privacy membership"):
        assert any(f"fedlib {verb} " in c for c in commands), verb
        assert all(owl in c for c in commands if f"fedlib {verb} " in c), verb
    fedspallm = [c for c in commands if "fedlib fedspallm " in c]
    assert len(fedspallm) == 1
    assert "--rounds 2 --resources 0.5 1 --method-options '{\"blocksize\": 16}'" in fedspallm[0]
    assert "--standalone-out" not in fedspallm[0] and "standalone_" not in out
    assert not any("--method-options" in c for c in commands if "fedlib aggregate " in c or "fedlib evaluate " in c)
    aggregate = [c for c in commands if "fedlib aggregate " in c]
    assert aggregate and all("--strategy fedprllm " in c and " --robust mad " in c for c in aggregate)
    assert all("/fedprllm_oneshot_" in c for c in aggregate)
    uploads = [c for c in commands if "fedlib client-mask " in c]
    assert {"--client-id centralized" in c for c in uploads} == {True, False}
    assert all(("--format-version 2" in c) != ("--client-id centralized" in c) for c in uploads)


@pytest.mark.parametrize("where, value, message", [
    # one case of each check the workflow runs at parse time (tests/test_config_check.py has every case of
    # each, in-process): the schema, the catalog, fedlib.config_check on the config, the model it names
    # and the data files it needs (both found relative to the workflow's working directory)
    (("pruning", "sparsity"), 1.5, r"On instance\['pruning'\]\['sparsity'\]"),
    (("studies", "fedspallm", "resources"), [0.5, 0.5], "2 per-client fractions"),
    (("clients", "n"), 4, r"clients\.n = 4: expected at most calibration\.nsamples = 3"),
    (("model", "name"), "./modle", r'model\.name = "\./modle": expected an embedded alias'),
    (("data", "c4/train.jsonl"), "", r'calibration\.dataset = "c4": expected a non-empty data file .*c4/train\.jsonl'),
])
def test_invalid_config_is_rejected(tmp_path, where, value, message):
    """Refused by the dry run, before any job, with a message naming the key; ("data", file)
    is a data file of .test/ written with ``value`` instead."""
    config = load_test_config()
    if where[0] == "data":
        write_config(tmp_path, config)
        (tmp_path / "data" / where[1]).write_text(value)
    else:
        section = config
        for key in where[:-1]:
            section = section[key]
        section[where[-1]] = value
        write_config(tmp_path, config)
    with pytest.raises(AssertionError, match=message):
        snakemake(tmp_path, "--configfile", "config.yaml", "-n")
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()


def test_test_fixture_is_what_its_script_writes(tmp_path):
    """.test/data holds the first lines of the mirror's files, and .test/model is the seeded tiny
    model: both equal a fresh run of tools/make_test_fixture.py."""
    from safetensors.torch import load_file

    subprocess.run([sys.executable, str(REPO / "tools" / "make_test_fixture.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for path in sorted((tmp_path / "data").rglob("*")):
        if path.is_file():
            committed = TEST_DIR / "data" / path.relative_to(tmp_path / "data")
            assert committed.read_bytes() == path.read_bytes(), committed
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (TEST_DIR / "model" / name).read_text() == (tmp_path / "model" / name).read_text(), name
    fresh, committed = load_file(tmp_path / "model" / "model.safetensors"), load_file(TEST_DIR / "model" / "model.safetensors")
    assert fresh.keys() == committed.keys() and all(fresh[k].equal(committed[k]) for k in fresh)


@pytest.fixture(scope="module")
def privacy_targets(workdir):
    """The named privacy targets (not part of `make run`, fedlib.privacy_analyses): one Snakemake run
    makes them all, in the folder of the real run above when it ran first (their common jobs, pools,
    shards, client masks, are then done)."""
    from fedlib.privacy_analyses import TARGETS

    snakemake(workdir, *(analysis.target for analysis in TARGETS), "--configfile", "config.yaml")
    return workdir


def test_secagg_target_runs(privacy_targets):
    """privacy_secagg: the membership game against the sum of m client masks and its global mask, per m,
    on the membership analysis's population and client size; the table has both views per m."""
    import json

    [path] = privacy_targets.glob("results/privacy/*/*/*/secagg.json")
    res = json.loads(path.read_text())
    assert [c["m"] for c in res["cohorts"]] == [1, 3]
    assert (res["targets"], res["samples"], res["seqlen"], res["pool"], res["draws"], res["blocks"]) == \
        (3, 1, 8, 2, 1, 1)
    rows = list(csv.reader((privacy_targets / "reports" / "privacy_secagg.csv").open()))
    assert [(r[0], r[1].split(" ")[0]) for r in rows[1:]] == [("1", "sum"), ("1", "global"), ("3", "sum"),
                                                               ("3", "global")]


def test_membership_scale_target_runs(privacy_targets):
    """privacy_membership_scale: one game per seed on the whole mask, then the table with a row per
    seed and the pooled row; each game's JSON is the size the config asked for."""
    import json

    games = sorted(privacy_targets.glob("results/privacy/*/*/*/membership_scale/2x16/seed*.json"))
    assert [g.name for g in games] == ["seed0.json", "seed1.json"]
    for seed, path in enumerate(games):
        res = json.loads(path.read_text())
        assert (res["seed"], res["samples"], res["seqlen"], res["blocks"], res["targets"], res["pairs"]) == \
            (seed, 2, 16, None, 2, 2)
        assert res["population"] == 6 and res["observed_layers"] == 14
    rows = list(csv.reader((privacy_targets / "reports" / "privacy_membership_scale.csv").open()))
    assert [r[1].split(",")[0] for r in rows[1:]] == ["0", "1", "pooled"]
    assert rows[3][2] == "4 / 4"


def test_membership_shared_target_runs(privacy_targets):
    """privacy_membership_shared: one game per seed on the whole mask, then the table with a row
    per seed and the pooled row; each game's JSON is the size the config asked for."""
    import json

    games = sorted(privacy_targets.glob("results/privacy/*/*/*/membership_shared/2x16-of4-s4-c4/seed*.json"))
    assert [g.name for g in games] == ["seed0.json", "seed1.json"]
    for seed, path in enumerate(games):
        res = json.loads(path.read_text())
        assert [res[k] for k in ("seed", "samples", "seqlen", "population", "shadows", "clients")] == \
            [seed, 2, 16, 4, 4, 4]
        assert res["observed_layers"] == 14 and len(res["scores"]) == 4
    rows = list(csv.reader((privacy_targets / "reports" / "privacy_membership_shared.csv").open()))
    body = [r for r in rows[1:] if r and r[0] == "2 × 16"]
    assert [r[1] for r in body] == ["0", "1", "pooled, 2 seeds"]
    assert body[2][3] == "16 / 16"


def test_attribute_target_runs(privacy_targets):
    """privacy_attribute: one game per property and seed on the whole mask, then the table with a
    row per seed and a pooled row per property."""
    import json

    games = sorted(privacy_targets.glob("results/privacy/*/*/*/attribute/2x16/*/seed*.json"))
    assert [f"{g.parent.name}/{g.name}" for g in games] == [
        "domain-wikitext2/seed0.json", "domain-wikitext2/seed1.json", "term-of/seed0.json", "term-of/seed1.json"]
    for path in games:
        res = json.loads(path.read_text())
        assert (res["samples"], res["seqlen"], res["blocks"], res["trials"], res["pairs"]) == (2, 16, None, 2, 4)
        assert res["observed_layers"] == 14 and res["masks_computed"] == 12
    assert json.loads(games[0].read_text())["property"]["kind"] == "domain"
    assert json.loads(games[2].read_text())["property"] == {"kind": "term", "term": "of"}
    rows = list(csv.reader((privacy_targets / "reports" / "privacy_attribute.csv").open()))
    body = [r for r in rows[1:] if r and r[0] in ("domain: WikiText-2", "term: 'of'")]
    assert [r[1].split(",")[0] for r in body] == ["0", "1", "pooled"] * 2
    assert body[2][2] == "4 / 4"


def test_inversion_client_target_runs(privacy_targets):
    """privacy_inversion_client: the server inverts the real mask files of the configured clients
    (their uploads equal the bag masks of their shards), then the table with the mean row."""
    import json

    results = sorted(privacy_targets.glob("results/privacy/*/*/*/inversion_client/client_*.json"))
    assert [p.name for p in results] == ["client_0.json", "client_1.json"]
    for path in results:
        res = json.loads(path.read_text())
        assert all(res["upload_is_bag_mask"].values()) and len(res["upload_is_bag_mask"]) == 3
        assert res["tokens"] == 32 and len(res["decoded_tokens"]) == 32 and res["moves"] <= 3
        assert set(res["unigram_bag_overlap"]) == {"heldout", "wikitext2"}
    rows = list(csv.reader((privacy_targets / "reports" / "privacy_inversion_client.csv").open()))
    body = [r for r in rows[1:] if r and (r[0] in ("0", "1") or r[0].startswith("mean of"))]
    assert [r[0] for r in body] == ["0", "1", "mean of 2 clients [95 % t interval]"]
    assert [r[2] for r in body[:2]] == ["yes", "yes"]


def test_dp_target_runs(privacy_targets):
    """privacy_dp: the audited table, and the utility table with a federation of larger clients
    (a pool split IID), the ε = 0 public-text model and randomized response beside them."""
    from fedlib.maskfile import read_header

    base = next(privacy_targets.glob("results/privacy/*/*/*/run/dp"))
    larger = read_header(base / "c4-4x32" / "64" / "client_1.mask.safetensors")
    assert larger.n_samples == 2 and "dp" in larger.extra
    assert read_header(base / "public" / "0" / "global.mask.safetensors").n_samples == 4
    rows = list(csv.reader((privacy_targets / "reports" / "privacy_dp_utility.csv").open()))
    body = [r for r in rows[1:] if r and r[0] != "Mechanism" and len(r) == 6]
    assert [(r[1].split(" (")[0], r[2]) for r in body if "DP" in r[0]] == [
        ("2 × 1 × 32", "∞"), ("2 × 1 × 32", "64"), ("2 × 2 × 32", "∞"), ("2 × 2 × 32", "64")]
    assert [r[2] for r in body if r[0].startswith("Wanda on public text")] == ["0"]
    assert any(r[0].startswith("Randomized response") for r in body)
    assert (privacy_targets / "reports" / "privacy_dp_utility.png").stat().st_size > 0
    # the release audit and its positive controls: ε = 1 (release_audit.epsilons) below the game's
    # ceiling, where the noiseless control is caught; the table's ε = 64 above it, where nothing can fail
    audit = json.loads((base / "release_audit.json").read_text())
    verdicts = {(r["claimed"]["epsilon"], r["mechanism"]): r["verdict"] for r in audit["rows"]}
    assert audit["trials"] == 2000 and audit["population"] == 4 and audit["tokens"] == 32
    assert verdicts[1.0, "honest"] == "within claim" and verdicts[1.0, "no-noise"] == "caught"
    assert {verdicts[64.0, m] for m in ("honest", "understated", "no-noise")} == {"cannot fail"}
    table = list(csv.reader((privacy_targets / "reports" / "privacy_dp_release.csv").open()))
    assert [(r[0], r[-1]) for r in table[1:] if len(r) == 10] == [
        (f"{e:g}", verdicts[e, m]) for e in (1.0, 64.0) for m in ("honest", "understated", "no-noise")]


@pytest.fixture(scope="module")
def domain_run(tmp_path_factory):
    """.test/ after the target domain ran in it, with the dry run's job counts."""
    workdir = copy_test_dir(tmp_path_factory.mktemp("domain"))
    jobs = planned_jobs(snakemake(workdir, "domain", "--configfile", "config.yaml", "-n"))
    snakemake(workdir, "domain", "--configfile", "config.yaml")
    return workdir, jobs


def test_domain_target_runs(domain_run):
    """domain: in-domain (PTB) clients against public C4 text, every row paired against public-only;
    the DP rows' files carry their guarantees, the audit stays below the proven ε, and the public
    text and the control clients' text are C4 documents apart from the evaluation's."""
    from fedlib.data import load_tokens
    from fedlib.maskfile import read_header

    tmp_path, jobs = domain_run
    # 1 seed in-domain + 1 control setting; 4 mechanisms (2 per client, 2 secure sums) x 1 ε; 2 clients
    # (pooling over data seeds: test_domain_report_pools_data_seeds, on this run's files)
    assert jobs["domain_dp"] == 2 and jobs["domain_membership"] == 4 and jobs["domain_dp_fedprllm"] == 2 * 2
    assert jobs["domain_eval"] == (5 + 4) + (1 + 4)
    base = tmp_path / "results" / "domain"
    client = json.loads(read_header(base / "private/s0/sp0.5/dp/lowdim-8/client_1.mask.safetensors").extra["dp"])
    assert client["mechanism"] == "normalised" and client["basis"] == 4 and client["sensitivity"] == 2.0
    secagg = read_header(base / "private/s0/sp0.5/dp/distributed-8/secagg.mask.safetensors")
    assert secagg.n_samples == 4 and json.loads(secagg.extra["dp"])["clients"] == 2
    assert json.loads(secagg.extra["dp"])["estimator"] == "threshold"
    posterior = json.loads(read_header(base / "private/s0/sp0.5/dp/distributed_posterior-8/secagg.mask.safetensors")
                           .extra["dp"])
    assert posterior["estimator"] == "posterior" and posterior["sigma"] == json.loads(secagg.extra["dp"])["sigma"]
    audit = json.loads((base / "membership/distributed_posterior-8.json").read_text())
    assert audit["dp"]["estimator"] == "posterior"
    assert load_tokens(base / "pools/public-s0.safetensors")[1]["docs"] == [0, 25]
    rows = list(csv.reader((tmp_path / "reports" / "domain.csv").open()))
    header, body = rows[0], rows[1:]
    cell = {name: header.index(name) for name in ("Clients' text", "Row", "ε", "audit ≤ proven")}
    titles = [r[cell["Row"]] for r in body]
    assert titles[:2] == ["Dense (bfloat16)", "Dense (float32)"]
    for title in ("Public text only (ε = 0)", "Centralized in-domain (ceiling)", "Local-only (client 0 of each seed)",
                  "FedPrLLM layer", "Public + private mix (Wanda on both)", "DP distributed (SecAgg sum, every channel)"):
        assert title in titles
    dp_rows = [r for r in body if r[cell["Row"]].startswith("DP ")]
    assert len(dp_rows) == 4 + 4 and all(r[cell["audit ≤ proven"]] == "yes" and r[cell["ε"]] == "8" for r in dp_rows)
    # a 4-target game cannot show a bound near ε = 8: the report says its audits cannot fail
    ceiling, can_fail = header.index("audit ceiling"), header.index("audit can fail (ceiling > proven)")
    assert all(float(r[ceiling]) < 8 and r[can_fail] == "no" for r in dp_rows)
    assert sum(r[cell["Clients' text"]].startswith("C4") for r in body) == 2 + 4
    md = (tmp_path / "reports" / "domain.md").read_text()
    assert "Worse than public-only beyond the interval" in md and "Audited ε ≤ proven ε: in every row; but no audit" in md
    assert (tmp_path / "reports" / "domain.png").stat().st_size > 0
    # domain_headroom over the study's files, scored on PTB validation (where an estimator is chosen, apart
    # from the test windows the study scores): the pass and its table, paired against the same windows
    (tmp_path / "headroom.yaml").write_text(
        "domain:\n  headroom:\n    variants: [{estimator: posterior, epsilon: 8, multipliers: [1, 4]},\n"
        "      {estimator: threshold, epsilon: 8}]\n    noise_seeds: [0, 1]\n    split: validation\n")
    snakemake(tmp_path, "domain_headroom", "--configfile", "config.yaml", "headroom.yaml", "--set-threads",
              "domain_headroom_pass=2")
    record = json.loads((base / "private/s0/sp0.5/headroom.json").read_text())
    assert [r["label"] for r in record["rows"]] == ["exact", "posterior-eps8-x1-n0", "posterior-eps8-x1-n1",
                                                    "posterior-eps8-x4-n0", "posterior-eps8-x4-n1",
                                                    "threshold-eps8-x1-n0", "threshold-eps8-x1-n1"]
    validation, meta = load_tokens(base / "eval_windows/ptb-validation.safetensors")
    test = load_tokens(base / "eval_windows/ptb.safetensors")[0]
    assert meta["split"] == "validation" and record["split"] == "validation"
    assert validation.shape == test.shape and not set(map(tuple, validation.tolist())) & set(map(tuple, test.tolist()))
    public = json.loads((base / "public/s0/sp0.5/public.validation.json").read_text())["perplexity"]["ptb"]
    assert public["split"] == "validation" and "split" not in json.loads(
        (base / "public/s0/sp0.5/public.eval.json").read_text())["perplexity"]["ptb"]
    assert all(len(r["window_nll"]) == public["windows"] for r in record["rows"])
    # 4 samples at ε = 8: the threshold keeps the public prior, scored as `fedlib evaluate` scored the
    # public mask (same threads: bfloat16 sums depend on them), window for window
    quiet = [r for r in record["rows"] if r["estimator"] == "threshold"]
    assert all(r["moved_coordinates"] == 0 and r["window_nll"] == public["window_nll"] for r in quiet)
    headroom = list(csv.reader((tmp_path / "reports" / "headroom.csv").open()))
    assert [r[2] for r in headroom[1:]] == ["1", "1", "4", "1"] and [r[4] for r in headroom[1:]] == ["1", "2", "2", "2"]
    headroom_md = (tmp_path / "reports" / "headroom.md").read_text()
    assert f"Public-only ptb ppl {public['ppl']:.2f}" in headroom_md and "ptb validation windows" in headroom_md
    # with the analysis on validation the study's report names the estimator chosen there (the lowest mean
    # Δ vs public-only at data x 1, computed here from the files) and rewrites nothing but itself
    import numpy as np

    rerun = planned_jobs(snakemake(tmp_path, "domain", "--configfile", "config.yaml", "headroom.yaml", "-n"))
    assert rerun == {"domain_report": 1, "domain": 1}, rerun
    snakemake(tmp_path, "domain", "--configfile", "config.yaml", "headroom.yaml")
    shift = {}
    for r in record["rows"]:
        if r.get("multiplier") == 1 and r["estimator"] != "exact":
            shift.setdefault(r["estimator"], []).append(np.mean(r["window_nll"]) - np.mean(public["window_nll"]))
    expected = min(shift, key=lambda e: np.mean(shift[e]))  # the record's order breaks a tie, as the report's
    md = (tmp_path / "reports" / "domain.md").read_text()
    assert f"Chosen on held-out windows: the {expected} estimator" in md and "reading no test window" in md


def test_domain_report_pools_data_seeds_and_noise_draws(domain_run, tmp_path):
    """The report pools its rows over data seeds and a DP row's noise draws: with a second seed and a
    second noise draw (this run's evaluation files with per-window NLLs moved by a seeded draw, file
    by file), each in-domain row's perplexity and change against public-only equal the mean over
    every seed's (and draw's) windows, computed here from the files; each draw has its own ledger.
    The workflow plans a draw's pass, masks and evaluations in dp-n<draw>/."""
    import shlex

    import numpy as np

    from fedlib.studies.domain import domain_table

    workdir, _ = domain_run
    (workdir / "draws.yaml").write_text("domain: {noise_draws: 3}\n")
    jobs = planned_jobs(snakemake(workdir, "domain", "--configfile", "config.yaml", "draws.yaml", "-n"))
    assert jobs["domain_dp"] == 2 * 2 and jobs["domain_dp_fedprllm"] == 2 * 2 * 2 and jobs["domain_eval"] == 2 * 2 * 4
    printed = snakemake(workdir, "domain", "--configfile", "config.yaml", "-n", "-p", "--forcerun", "domain_report")
    command = next(line for line in printed.splitlines() if " privacy domain-report --spec " in line)
    argv = shlex.split(command.rsplit(" > ", 1)[0])
    spec = json.loads(argv[argv.index("--spec") + 1])
    [cell] = spec["evals"]["private"]
    assert cell["draws"] == []
    rng = np.random.default_rng(7)

    def moved(path, name):
        """A copy of an evaluation file, its PTB window NLLs moved by row and window by window."""
        result = json.loads(Path(path).read_text())
        nll = result["perplexity"]["ptb"]["window_nll"]
        shift = rng.uniform(-0.3, 0.3) + rng.normal(0, 0.05, len(nll))
        result["perplexity"]["ptb"]["window_nll"] = [v + float(d) for v, d in zip(nll, shift)]
        (tmp_path / name).write_text(json.dumps(result))
        return str(tmp_path / name)

    record = str(workdir / cell["record"])
    first = {**cell, "rows": {r: str(workdir / p) for r, p in cell["rows"].items()}, "record": record}
    second = {**first, "seed": 1, "rows": {r: moved(p, f"s1-{r}.json") for r, p in first["rows"].items()}}
    labels = [r for r in cell["rows"] if "-" in r]  # the DP rows
    for c in (first, second):
        c["draws"] = [{"rows": {r: moved(c["rows"][r], f"s{c['seed']}-n1-{r}.json") for r in labels},
                       "record": record}]
    spec["evals"]["private"] = [first, second]
    for c in spec["evals"]["control"]:
        c["rows"] = {r: str(workdir / p) for r, p in c["rows"].items()}
        c["record"] = str(workdir / c["record"])
    spec["dense"] = {k: str(workdir / v) for k, v in spec["dense"].items()}
    spec["membership"] = {k: str(workdir / v) for k, v in spec["membership"].items()}
    spec["diagnostics"] = []
    spec["out_dir"] = str(tmp_path / "reports")
    (tmp_path / "reports").mkdir()
    domain_table(spec)

    def window_nll(path):
        return np.asarray(json.loads(Path(path).read_text())["perplexity"]["ptb"]["window_nll"])

    def evaluations(row):
        return [window_nll(c["rows"][row]) for c in (first, second)] + \
            [window_nll(d["rows"][row]) for c in (first, second) for d in c["draws"] if row in d["rows"]]

    public = evaluations("public")  # per seed
    rows = list(csv.reader((tmp_path / "reports" / "domain.csv").open()))
    header, body = rows[0], [r for r in rows[1:] if r[0].endswith("(in-domain)")]
    ppl, change = header.index("PTB ppl"), header.index("Δ PTB ppl vs public [95% CI]")
    titles = {"public": "Public text only (ε = 0)", "central": "Centralized in-domain (ceiling)",
              "fedprllm": "FedPrLLM layer", "mix": "Public + private mix (Wanda on both)",
              **{label: spec["titles"][label.rsplit("-", 1)[0]] for label in labels}}
    by_title = {r[header.index("Row")]: r for r in body}
    for row, title in titles.items():
        nll = evaluations(row)
        assert len(nll) == (4 if row in labels else 2)
        assert float(by_title[title][ppl]) == pytest.approx(np.exp(np.mean(nll)), rel=2e-3), row
        if row != "public":  # each draw paired against its seed's public-only windows
            expected = np.expm1(np.mean([e - public[i % 2] for i, e in enumerate(nll)]))
            assert float(by_title[title][change].split("%")[0]) / 100 == pytest.approx(expected, abs=6e-4), row
    md = (tmp_path / "reports" / "domain.md").read_text()
    assert "seeds 0, 1" in md and "over seeds, 2 noise draws per seed (DP rows) and windows" in md
    assert "Ledger, private pool of data seed 1, noise draw 1:" in md and "not summed over them" in md

    # without a negative control (domain.control.sparsities: []) the in-domain rows are the same
    spec["evals"]["control"], spec["out_dir"] = [], str(tmp_path / "no-control")
    (tmp_path / "no-control").mkdir()
    domain_table(spec)
    alone = list(csv.reader((tmp_path / "no-control" / "domain.csv").open()))
    assert [r for r in alone[1:] if "negative control" in r[0]] == [] and any("negative control" in r[0] for r in rows)
    assert [r for r in alone if not r[0].startswith("C4")] == [r for r in rows if not r[0].startswith("C4")]
    assert "Negative control: none" in (tmp_path / "no-control" / "domain.md").read_text()
