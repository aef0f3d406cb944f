"""Cost tables: transfer sizes against the files the CLI really writes, the network model against a
hand computation, the time table against benchmark files written here."""

import csv
import json
import os

import pytest
import torch
from conftest import tiny_llama

from fedlib import cost
from fedlib.cli import main
from fedlib.data import save_tokens

CONTEXT = {"model": "tiny", "config": "test.yaml", "config_hash": "abc", "seed": 1, "lines": ["a test"]}


def test_transfer_sizes_are_the_files_the_protocol_sends(tmp_path):
    """One-shot upload = the client files' sizes; iterative round L = the size of the file
    `fedlib client-mask --round L` writes (upload) and of the global file `fedlib aggregate --mode
    iterative` wrote for blocks < L (download), both run here through the CLI."""
    model_dir = tmp_path / "model"
    tiny_llama(layers=3).save_pretrained(model_dir)
    ids = ["0", "1", "1234567890123"]  # header sizes differ (by more than the header's 8-byte padding): id, samples
    calib = []
    for c, n in zip(ids, (2, 2, 11)):
        path = tmp_path / f"calib_{c}.safetensors"
        save_tokens(path, torch.randint(0, 128, (n, 16), generator=torch.Generator().manual_seed(int(c))))
        calib.append(str(path))
    local = ["--method", "wanda", "--sparsity", "0.5", "--group", "row", "--seed", "1", "--batch-size", "1"]
    server = ["--model", str(model_dir), "--group", "layer", "--sparsity", "0.5", "--seed", "1"]
    one_shot = []
    for c, data in zip(ids, calib):
        out = tmp_path / f"one_shot_{c}.mask.safetensors"
        assert main(["client-mask", "--model", str(model_dir), "--calib", data, *local, "--client-id", c,
                     "--out", str(out)]) == 0
        one_shot.append(out)
    glob = tmp_path / "global.mask.safetensors"
    assert main(["aggregate", *server, "--out", str(glob), *map(str, one_shot)]) == 0
    uploads, downloads, previous = [], [], None
    for block in range(3):
        sizes = []
        for c, data in zip(ids, calib):
            out = tmp_path / f"round{block}_{c}.mask.safetensors"
            assert main(["client-mask", "--model", str(model_dir), "--calib", data, *local, "--client-id", c,
                         "--round", str(block), "--out", str(out)]
                        + (["--global-masks", str(previous)] if previous else [])) == 0
            sizes.append(os.path.getsize(out))
        uploads.append(sizes)
        downloads.append(os.path.getsize(previous) if previous else 0)
        current = tmp_path / f"global_round{block}.mask.safetensors"
        assert main(["aggregate", *server, "--mode", "iterative", "--round", str(block), "--out", str(current),
                     *(str(tmp_path / f"round{block}_{c}.mask.safetensors") for c in ids)]
                    + (["--previous", str(previous)] if previous else [])) == 0
        previous = current

    record = tmp_path / "transfer.json"
    out = {"--out-md": tmp_path / "t.md", "--out-csv": tmp_path / "t.csv", "--out-html": tmp_path / "t.html"}
    assert main(["cost", "transfer", "--model", str(model_dir), "--clients", *map(str, one_shot), "--global", str(glob),
                 "--record", str(record), "--context", json.dumps(CONTEXT),
                 *[str(x) for pair in out.items() for x in pair]]) == 0
    oneshot, iterative = json.loads(record.read_text())["strategies"]
    v1 = cost.upload_title(1)
    assert [u[v1] for u in oneshot["rounds"][0]["up"]] == [os.path.getsize(p) for p in one_shot]
    assert len(set(os.path.getsize(p) for p in one_shot)) > 1  # the check can tell clients apart
    assert [[u[v1] for u in r["up"]] for r in iterative["rounds"]] == uploads
    assert [r["down"] for r in iterative["rounds"]] == [[d] * 3 for d in downloads]
    assert downloads[0] == 0 < downloads[1] < downloads[2]  # round L downloads blocks < L
    assert oneshot["final_download"] == iterative["final_download"] == os.path.getsize(glob)
    # mask entries: every block's linears, uploaded once; downloads of blocks < L
    block_entries = sum(p.numel() for n, p in tiny_llama(layers=3).named_parameters()
                        if ".layers.0." in n and n.endswith("proj.weight"))
    assert [r["up_parameters"] for r in iterative["rounds"]] == [block_entries] * 3
    assert [r["down_parameters"] for r in iterative["rounds"]] == [0, block_entries, 2 * block_entries]
    assert oneshot["rounds"][0]["up_parameters"] == 3 * block_entries
    rows = list(csv.reader(open(out["--out-csv"])))
    assert rows[1][:3] == ["FedPrLLM one-shot", "layer", "1"] and rows[2][:3] == ["FedPrLLM iterative", "layer", "3"]
    assert rows[2][4] == f"{max(sum(column) for column in zip(*uploads)):,}"
    assert "commit" in out["--out-md"].read_text()  # the context line every table carries

    # the network table reads that record
    net = {"--out-md": tmp_path / "n.md", "--out-csv": tmp_path / "n.csv"}
    assert main(["cost", "network", "--record", str(record), "--context", json.dumps(CONTEXT),
                 *[str(x) for pair in net.items() for x in pair]]) == 0
    table = list(csv.DictReader(open(net["--out-csv"])))
    assert len(table) == 2 * len(cost.PROFILES)
    wan = [r for r in table if r["Network profile"] == "Cross-silo WAN"]
    profile = next(p for p in cost.PROFILES if p.name == "Cross-silo WAN")
    assert float(wan[1]["Time in rounds (s)"].replace(",", "")) == pytest.approx(
        cost.strategy_seconds(iterative, profile), abs=1e-3)


def _strategy(ups, downs, final):
    return {"strategy": "s", "group": "layer", "final_download": final,
            "rounds": [{"up": [{"format v1 (as sent)": b} for b in up], "down": down,
                        "up_parameters": 1, "down_parameters": 0} for up, down in zip(ups, downs)]}


def test_network_model_against_a_hand_computation():
    profile = cost.NetworkProfile("p", latency_s=0.01, up_bps=8e6, down_bps=16e6, server_bps=32e6)
    # one round: 5 clients upload 1 MB each (1 s + 10 ms on their own 8 Mbit/s links; the server's
    # 32 Mbit/s link carries 5 MB: 1.25 s + 10 ms, the slower), download 2 MB each (1 s + 10 ms;
    # the server sends 10 MB: 2.5 s + 10 ms); then the final file, 4 MB each (2 s vs 5 s + 10 ms)
    s = _strategy([[1e6] * 5], [[2e6] * 5], 4e6)
    assert cost.round_seconds([1e6] * 5, [2e6] * 5, profile) == pytest.approx(1.26 + 2.51)
    assert cost.strategy_seconds(s, profile) == pytest.approx(1.26 + 2.51)
    assert cost.final_seconds(s, profile) == pytest.approx(5.01)
    assert cost.final_seconds(dict(s, final_download=None), profile) is None
    # a straggler at half bandwidth: its upload takes 2.01 s, its download 1 MB... 2 MB at 8 Mbit/s
    # = 2.01 s (still below the server's 2.51), its final file 4 s (below 5.01)
    assert cost.round_seconds([1e6] * 5, [2e6] * 5, profile, stragglers=1) == pytest.approx(2.01 + 2.51)
    assert cost.straggler_count(5) == 1 and cost.straggler_count(64) == 13 and cost.straggler_count(16) == 3
    # the penalty is paid in every round: 3 rounds cost 3 x 0.75 s more
    three = _strategy([[1e6] * 5] * 3, [[2e6] * 5] * 3, 0)
    penalty = cost.strategy_seconds(three, profile, 1) - cost.strategy_seconds(three, profile)
    assert penalty == pytest.approx(3 * (2.01 - 1.26))
    assert cost.transfer_seconds(0, 1e6, 0.1) == 0.0  # nothing sent, no latency


def _bench(path, seconds, rss):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
                    f"{seconds}\t0:00:01\t{rss}\t1\t1\t1\t0\t0\t50\t1\n")
    return str(path)


def test_time_table_from_benchmark_files(tmp_path):
    clients = [_bench(tmp_path / f"c{i}.tsv", s, r) for i, (s, r) in enumerate([(2.0, 300), (4.5, 350), (3.1, 320)])]
    spec = {"columns": ["Method"],
            "rows": [{"cells": ["FedPrLLM"], "client": clients, "server": [_bench(tmp_path / "a.tsv", 1.25, 400)]},
                     {"cells": ["Centralized"], "client": [_bench(tmp_path / "z.tsv", 7, 200)]}]}
    md, out = tmp_path / "t.md", tmp_path / "t.csv"
    assert main(["cost", "time", "--spec", json.dumps(spec), "--context", json.dumps(CONTEXT), "--out-md", str(md), "--out-csv", str(out)]) == 0
    rows = list(csv.reader(open(out)))
    assert rows[1] == ["FedPrLLM", "3", "3.2", "4.5", "1.2", "400"]
    assert rows[2] == ["Centralized", "1", "7.0", "7.0", "-", "200"]
    bad = tmp_path / "bad.tsv"
    bad.write_text("s\tmax_rss\nNA\t3\n")
    spec["rows"][1]["client"] = [str(bad)]
    with pytest.raises(ValueError, match=r"bad.tsv: field 's': expected a number"):
        cost.time_rows(spec)


def test_fedspallm_record_and_bad_input(tmp_path):
    record = tmp_path / "rounds.json"
    record.write_text(json.dumps({"n_clients": 4, "rounds": [{"round": 0, "bytes_up": 400, "bytes_down": 80}]}))
    s = cost.fedspallm_transfer(record)
    assert s["rounds"][0]["down"] == [20] * 4 and s["rounds"][0]["up"][0] == {"format v1 (as sent)": 100}
    columns, rows = cost.transfer_rows([s])
    assert rows[0][columns.index("All clients, up + down in rounds (bytes)")] == "480"
    record.write_text(json.dumps({"n_clients": 4, "rounds": [{"round": 0}]}))
    with pytest.raises(ValueError, match="rounds.json: expected a FedSpaLLM record"):
        cost.fedspallm_transfer(record)
