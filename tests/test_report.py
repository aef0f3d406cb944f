"""Zero-shot through the CLI, the spec-driven tables (perplexity and zero-shot), and the plots."""

import csv
import json
import math
import statistics
import struct
import subprocess
from pathlib import Path

import pytest

from fedlib.cli import main
from fedlib.plots import figure_size
from fedlib.provenance import source_commit, written_by
from fedlib.report import write_spec_table

CONTEXT = {"model": "tiny", "config": "config.yaml", "config_hash": "0123456789ab", "seed": 0,
           "lines": ["3 clients, 3 calibration samples (IID split)"]}


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_zeroshot_verb_on_a_masked_tiny_model(tiny_model_dir, data_dir, tmp_path, capsys):
    model = str(tiny_model_dir)
    client = tmp_path / "client.mask.safetensors"
    assert main(["client-mask", "--model", model, "--method", "magnitude", "--out", str(client)]) == 0
    glob = tmp_path / "global.mask.safetensors"
    assert main(["aggregate", "--model", model, "--group", "layer", "--out", str(glob), str(client)]) == 0
    out = tmp_path / "zs.json"
    assert main(["zeroshot", "--model", model, "--mask", str(glob), "--scale", "--tasks", "arc_easy", "rte",
                 "--data-dir", str(data_dir), "--limit", "3", "--batch-size", "4", "--threads", "1",
                 "--label", "fedprllm_oneshot_layer_scale", "--log-samples", str(tmp_path / "samples.jsonl"),
                 "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["tasks"] == ["arc_easy", "rte"] and record["limit"] == 3
    assert record["metrics"] == {"arc_easy": "acc_norm", "rte": "acc"}  # acc_norm where lm-eval defines it
    assert record["mean_acc"] == pytest.approx((record["zeroshot"]["arc_easy"]["acc_norm"]
                                                + record["zeroshot"]["rte"]["acc"]) / 2)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["task"], r["doc_id"]) for r in samples] == [(t, i) for t in ("arc_easy", "rte") for i in range(3)]
    for task in ("arc_easy", "rte"):  # the per-document record in the result file is lm-eval's
        for metric, correct in record["zeroshot"][task]["correct"].items():
            assert correct == [int(r[metric]) for r in samples if r["task"] == task]
    assert record["scale"] and record["applied"]["scaled"] and record["measured_sparsity"] >= 0.5
    assert record["zeroshot"]["rte"]["n"] == 3 and record["zeroshot"]["rte"]["total"] == 277
    assert record["zeroshot"]["arc_easy"]["acc_norm"] is not None and record["zeroshot"]["rte"]["acc_norm"] is None
    assert 0 <= record["mean_acc"] <= 1
    assert "rte: acc" in capsys.readouterr().out
    # a bad call names the problem and writes nothing
    bad = tmp_path / "bad.json"
    assert main(["zeroshot", "--model", model, "--scale", "--tasks", "rte", "--data-dir", str(data_dir),
                 "--out", str(bad)]) == 2
    assert "--scale needs --mask" in capsys.readouterr().err and not bad.exists()


def _zeroshot_result(path, accs, limit=20, tasks=("hellaswag", "rte")):
    path.write_text(json.dumps({
        "label": path.stem, "model_fingerprint": "f" * 64, "tasks": list(tasks), "limit": limit, "metric": "acc",
        "data_dir": "/data", "zeroshot": {t: {"acc": a, "acc_norm": None, "n": limit, "total": 100}
                                          for t, a in zip(tasks, accs)},
    }))
    return str(path)


def _paired_result(path, correct: dict[str, list[int]]):
    """A result file as `fedlib zeroshot` writes it now: per-task metrics and per-document records."""
    tasks = list(correct)
    metrics = {"hellaswag": "acc_norm", "rte": "acc"}
    zeroshot = {}
    for t, c in correct.items():
        n, mean = len(c), sum(c) / len(c)
        stderr = (sum((x - mean) ** 2 for x in c) / (n - 1) / n) ** 0.5
        zeroshot[t] = {"acc": mean, "acc_stderr": stderr, "n": n, "total": 100, "doc_ids": list(range(n)),
                       "choices": [4 if t == "hellaswag" else 2] * n, "correct": {metrics[t]: c},
                       "acc_norm": mean if metrics[t] == "acc_norm" else None,
                       "acc_norm_stderr": stderr if metrics[t] == "acc_norm" else None}
        if metrics[t] == "acc_norm":
            zeroshot[t]["correct"]["acc"] = c
    path.write_text(json.dumps({"label": path.stem, "model_fingerprint": "f" * 64, "tasks": tasks, "limit": 8,
                                "metrics": {t: metrics[t] for t in tasks}, "data_dir": "/data",
                                "zeroshot": zeroshot}))
    return str(path)


def test_zeroshot_table_shows_paired_differences_from_dense(tmp_path):
    dense = {"hellaswag": [1, 1, 0, 1, 1, 0, 1, 1], "rte": [1, 0, 1, 1, 0, 1, 1, 1]}
    broken = {"hellaswag": [0, 0, 0, 1, 0, 0, 0, 0], "rte": [0, 0, 1, 0, 0, 1, 0, 1]}
    spec = {"title": "Table 12 analogue", "measure": "zeroshot", "context": CONTEXT, "columns": ["Method"],
            "rows": [{"cells": ["Dense"], "results": [_paired_result(tmp_path / "dense.json", dense)]},
                     {"cells": ["Column"], "results": [_paired_result(tmp_path / "column.json", broken)]}],
            "paired_reference": str(tmp_path / "dense.json")}
    md, table = tmp_path / "t.md", tmp_path / "t.csv"
    write_spec_table(spec, md, table)
    rows = list(csv.reader(table.open()))
    assert rows[0] == ["Method", "HellaSwag", "RTE", "Mean", "Δ Mean vs dense [95 % CI]"]
    assert rows[1] == ["Dense", "75.00", "75.00", "75.00", "reference"]
    # by hand: differences per document, hellaswag -5/8 (s² = 0.26786), rte -3/8 (s² = 0.26786);
    # Δ = -50 points, SE = sqrt(2 * 0.26786 / 8) / 2 = 0.12939 -> ± 25.36 points
    assert rows[2] == ["Column", "12.50", "37.50", "25.00", "-50.00 [-75.36, -24.64]"]
    header = md.read_text()
    assert "`acc_norm` for HellaSwag; `acc` for RTE" in header
    assert "Chance level of the Mean on these documents (1 / answer choices): 37.5 %" in header
    # the Dense Mean's standard error: sqrt(2 * (0.75 * 0.25 * 8 / 7) / 8) / 2 = 0.1157 -> 11.6 points
    assert "Standard error of the dense row's Mean: 11.6 points" in header
    assert "paired normal interval" in header
    # a reference scored on other documents is refused, naming both
    shifted = json.loads(Path(spec["rows"][1]["results"][0]).read_text())
    shifted["zeroshot"]["rte"]["doc_ids"] = list(range(1, 9))
    Path(spec["rows"][1]["results"][0]).write_text(json.dumps(shifted))
    with pytest.raises(ValueError, match="column and dense scored different rte documents"):
        write_spec_table(spec, md, table)


def _ppl_result(path, ppl):
    path.write_text(json.dumps({
        "label": path.stem, "model_fingerprint": "e" * 64,
        "perplexity": {d: {"ppl": ppl * f, "windows": 4, "total_windows": 40, "seqlen": 32, "note": ""}
                       for d, f in (("wikitext2", 1.0), ("c4", 1.5))},
    }))
    return str(path)


def test_zeroshot_table_from_a_spec(tmp_path):
    spec = {
        "title": "Table 12 analogue", "measure": "zeroshot", "context": CONTEXT,
        "columns": ["Method", "Comparison group"],
        "rows": [
            {"cells": ["Dense", "-"], "results": [_zeroshot_result(tmp_path / "dense.json", [0.5, 0.6])]},
            {"cells": ["Local-only", "-"], "results": [_zeroshot_result(tmp_path / f"l{i}.json", [0.4 + i / 10, 0.5])
                                                      for i in range(2)]},
        ],
    }
    md, table, page = tmp_path / "t.md", tmp_path / "t.csv", tmp_path / "t.html"
    write_spec_table(spec, md, table, page)
    rows = list(csv.reader(table.open()))
    assert rows[0] == ["Method", "Comparison group", "HellaSwag", "RTE", "Mean"]
    assert rows[1] == ["Dense", "-", "50.00", "60.00", "55.00"]
    assert rows[2] == ["Local-only", "-", "45.00 ± 7.07", "50.00 ± 0.00", "47.50 ± 3.54"]
    header = md.read_text()
    for fact in ("limit 20 per task", "HellaSwag 20 of 100", "sha256 0123456789ab", f"written by {written_by()}",
                 "fingerprint ffffffffffffffff", "3 clients", "standard error"):
        assert fact in header, fact
    assert "<td class=\"num\">47.50 ± 3.54</td>" in page.read_text()
    # results scored with another limit do not go into one table silently
    spec["rows"][1]["results"][1] = _zeroshot_result(tmp_path / "other.json", [0.4, 0.5], limit=50)
    with pytest.raises(ValueError, match="other.json"):
        write_spec_table(spec, md, table)


def test_perplexity_table_keeps_its_format(tmp_path):
    spec = {"title": "Table 1 analogue", "context": CONTEXT, "columns": ["Method"],
            "rows": [{"cells": ["Dense"], "results": [_ppl_result(tmp_path / "dense.json", 12.345)]}]}
    write_spec_table(spec, tmp_path / "t.md", tmp_path / "t.csv")
    assert list(csv.reader((tmp_path / "t.csv").open())) == [["Method", "WikiText-2", "C4"], ["Dense", "12.35", "18.52"]]
    assert "WikiText-2 4 of 40 windows × 32 tokens" in (tmp_path / "t.md").read_text()


def test_plot_verb_writes_pngs_of_the_expected_size(tmp_path):
    rows = []
    for x in (2, 4, 8):
        rows.append({"cells": [str(x), "FedPrLLM"], "x": x, "series": "FedPrLLM",
                     "results": [_ppl_result(tmp_path / f"f{x}.json", 20 + x)]})
        rows.append({"cells": [str(x), "Local-only"], "x": x, "series": "Local-only (mean ± std)",
                     "results": [_ppl_result(tmp_path / f"l{x}_{i}.json", 25 + x + i) for i in range(3)]})
    spec = {"title": "Figure 2 analogue", "context": CONTEXT, "columns": ["Clients", "Method"], "rows": rows,
            "reference": [{"series": "Dense", "results": [_ppl_result(tmp_path / "dense.json", 11)]}],
            "plot": {"xlabel": "Clients", "xscale": "log2"}}
    out = tmp_path / "figure2.png"
    assert main(["plot", "--spec", json.dumps(spec), "--out", str(out)]) == 0
    assert png_size(out) == figure_size(2)  # one panel per perplexity dataset
    # a zero-shot sweep read from a spec file: one panel (mean accuracy), percent x axis
    zs_rows = [{"cells": [f"{s:.0%}", "FedPrLLM"], "x": s, "series": "FedPrLLM",
                "results": [_zeroshot_result(tmp_path / f"z{s}.json", [0.6 - s / 2, 0.5])]} for s in (0.5, 0.6)]
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"title": "accuracy vs sparsity", "measure": "zeroshot", "context": CONTEXT,
                                     "columns": ["Sparsity", "Method"], "rows": zs_rows,
                                     "plot": {"xlabel": "Sparsity", "xformat": "percent"}}))
    out = tmp_path / "sparsity.png"
    assert main(["plot", "--spec", str(spec_file), "--out", str(out)]) == 0
    assert png_size(out) == figure_size(1)


def test_tables_name_the_commit_of_the_code_that_wrote_them():
    """Provenance is read when the table is written (a rule parameter would rerun every report
    job after any commit): the checkout's HEAD, marked when the library or workflow differs."""
    repo = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout")
    changed = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--",
                              "fedlib", "workflow", "Snakefile"], capture_output=True, text=True).stdout.strip()
    assert source_commit() == head + ("+changes" if changed else "")
    assert written_by().endswith(f"commit {source_commit()}")


def _windowed_result(path, window_nll: dict, label=None):
    """A perplexity result with per-window losses (ppl = exp of their mean, as for equal windows)."""
    path.write_text(json.dumps({
        "label": label or path.stem, "model_fingerprint": "e" * 64,
        "perplexity": {d: {"ppl": math.exp(statistics.fmean(v)), "nll": statistics.fmean(v), "windows": len(v),
                           "total_windows": 40, "seqlen": 32, "note": "", "window_nll": v}
                       for d, v in window_nll.items()},
    }))
    return str(path)


def _shifted(base: dict, shift: dict) -> dict:
    return {d: [b + s for b, s in zip(base[d], shift[d])] for d in base}


BASE = {"wikitext2": [3.0, 3.2, 2.9, 3.1], "c4": [3.5, 3.6, 3.4, 3.7]}


def test_table1_pairs_every_row_with_centralized_on_the_same_windows(tmp_path):
    """Cells against t intervals of the per-window log-ratio differences worked out by hand
    (scipy: mean ± t(0.975, 3) · s / 2, then exp); Local-only pairs its clients' mean log-perplexity."""
    central = _windowed_result(tmp_path / "central.json", BASE, label="centralized")
    fed = _windowed_result(tmp_path / "fed.json", _shifted(BASE, {"wikitext2": [0.02, 0.03, 0.01, 0.02],
                                                                 "c4": [0.05, -0.04, 0.03, -0.02]}))
    local = [_windowed_result(tmp_path / f"local_{i}.json", _shifted(BASE, shift)) for i, shift in enumerate((
        {"wikitext2": [0.06, 0.07, 0.05, 0.06], "c4": [0.01, 0.02, 0.00, 0.01]},
        {"wikitext2": [0.02, 0.03, 0.03, 0.04], "c4": [0.03, 0.02, 0.05, 0.03]}))]
    column = _windowed_result(tmp_path / "column.json", _shifted(BASE, {"wikitext2": [9.0, 9.5, 10.0, 9.2],
                                                                       "c4": [1.0, 1.2, 0.9, 1.1]}))
    spec = {"title": "Table 1 analogue", "context": CONTEXT, "columns": ["Method", "Group"],
            "rows": [{"cells": ["Centralized", "-"], "results": [central]},
                     {"cells": ["Local-only", "-"], "results": local},
                     {"cells": ["FedPrLLM", "Layer"], "results": [fed]},
                     {"cells": ["FedPrLLM", "Column"], "results": [column]}],
            "paired_reference": central,
            "contrasts": [{"name": "FedPrLLM (layer) vs Local-only", "results": [fed], "reference": local}]}
    md, table = tmp_path / "t.md", tmp_path / "t.csv"
    write_spec_table(spec, md, table)
    rows = list(csv.reader(table.open()))
    assert rows[0][-2:] == ["WikiText-2 vs centralized [95 % CI]", "C4 vs centralized [95 % CI]"]
    assert rows[1][-2:] == ["reference", "reference"]
    assert rows[2][-2:] == ["+4.60% [+3.65%, +5.57%]", "+2.15% [+1.74%, +2.55%]"]
    assert rows[3][-2:] == ["+2.02% [+0.70%, +3.35%]", "+0.50% [-6.00%, +7.45%]"]
    assert rows[4][-2:] == ["×12,394 [×6,204, ×24,762]", "+185.77% [+132.70%, +250.93%]"]
    header = md.read_text()
    assert ("- FedPrLLM (layer) vs Local-only: WikiText-2 -2.47% [-3.36%, -1.57%]; C4 -1.61% [-7.84%, +5.04%]."
            in header)
    # exactly the intervals that include no change are named
    assert ("- Not resolved at 95 % (the interval includes no difference): FedPrLLM Layer vs centralized on C4; "
            "FedPrLLM (layer) vs Local-only on C4.\n") in header
    # results without per-window losses cannot be paired: the error names the file's label and the dataset
    stale = json.loads(Path(fed).read_text())
    del stale["perplexity"]["c4"]["window_nll"]
    Path(fed).write_text(json.dumps(stale))
    with pytest.raises(ValueError, match="fed: no per-window losses for c4; rerun the evaluation"):
        write_spec_table(spec, md, table)


def test_table_over_draws_gives_means_with_t_intervals_over_the_draws(tmp_path):
    """Three draws: cells are mean ± t(0.975, 2)·s/√3 over the draws (by hand with scipy); the
    difference from each draw's Centralized is averaged over the draws with its t interval."""
    dense = _windowed_result(tmp_path / "dense.json", {"wikitext2": [2.5] * 4})
    draws = []
    for i, (shift, fdiff) in enumerate(((0.0, [0.02, 0.03, 0.01, 0.02]), (0.1, [0.01, 0.02, 0.02, 0.03]),
                                        (-0.05, [0.03, 0.03, 0.02, 0.04]))):
        central = [b + shift for b in BASE["wikitext2"]]
        c = _windowed_result(tmp_path / f"central_{i}.json", {"wikitext2": central}, label="centralized")
        f = _windowed_result(tmp_path / f"fed_{i}.json", {"wikitext2": [x + d for x, d in zip(central, fdiff)]})
        draws.append({"name": f"seed {i}", "paired_reference": c,
                      "rows": [{"cells": ["Dense"], "results": [dense]}, {"cells": ["Centralized"], "results": [c]},
                               {"cells": ["FedPrLLM"], "results": [f]}]})
    spec = {"title": "Table 1 over draws", "context": CONTEXT, "columns": ["Method"], "draws": draws}
    md, table = tmp_path / "t.md", tmp_path / "t.csv"
    write_spec_table(spec, md, table)
    assert list(csv.reader(table.open())) == [
        ["Method", "WikiText-2", "WikiText-2 vs centralized [95 % CI]"],
        ["Dense", "12.18 ± 0.00", "-43.26% [-53.06%, -31.40%]"],
        ["Centralized", "21.51 ± 4.13", "reference"],
        ["FedPrLLM", "22.02 ± 4.00", "+2.36% [+0.90%, +3.84%]"],
    ]
    header = md.read_text()
    assert "3 calibration draws (seed 0, seed 1, seed 2)" in header and "2 degrees of freedom" in header
    assert "Every difference with an interval in this table is resolved at 95 %." in header
    with pytest.raises(ValueError, match="an interval over draws needs at least 2"):
        write_spec_table({**spec, "draws": draws[:1]}, md, table)
    draws[2]["rows"][2]["cells"] = ["Other"]
    with pytest.raises(ValueError, match="draw seed 2: rows .* differ from draw seed 0's"):
        write_spec_table(spec, md, table)
