"""What `make bench-gpu` relies on, checked without a GPU: the client's summary line it parses, and
a GPU client's import closure (a stock GPU image has torch, transformers, safetensors, numpy, scipy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gpu  # noqa: E402
from fedlib.cli import main  # noqa: E402
from fedlib.data import save_tokens  # noqa: E402

#: what a GPU client must not need: the workflow's and the privacy audit's dependencies
NOT_ON_A_GPU_IMAGE = ("snakemake", "lm_eval", "constriction", "dp_accounting", "cryptography", "jsonschema",
                      "matplotlib", "datasets")


def test_bench_reads_the_client_summary(tiny_model_dir, tmp_path, capsys):
    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0)))
    assert main(["client-mask", "--model", str(tiny_model_dir), "--calib", str(calib),
                 "--out", str(tmp_path / "m.safetensors")]) == 0
    found = bench_gpu.SUMMARY.search(capsys.readouterr().out)
    assert found is not None and found.group(4) is None  # no device peak on a CPU
    on_gpu = ("wrote m (wanda, row, 0.5) on cuda:0/bfloat16 in 31.2s (0.81s per block, opened in 4.1s, "
              "device peak 9.12 GiB)")
    assert bench_gpu.SUMMARY.search(on_gpu).groups() == ("31.2", "0.81", "4.1", "9.12")


@pytest.mark.slow
def test_a_gpu_client_imports_only_what_a_stock_gpu_image_has(tiny_model_dir, tmp_path):
    calib, windows = tmp_path / "calib.safetensors", tmp_path / "windows.safetensors"
    save_tokens(calib, torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0)))
    save_tokens(windows, torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1)),
                dataset="wikitext2", total_windows=2)
    model, mask, glob = str(tiny_model_dir), str(tmp_path / "m.safetensors"), str(tmp_path / "g.safetensors")
    script = f"""
import sys
from fedlib.cli import main
for method in ("wanda", "sparsegpt_update"):
    assert main(["client-mask", "--model", {model!r}, "--calib", {str(calib)!r}, "--method", method,
                 "--out", {mask!r}]) == 0
assert main(["aggregate", "--model", {model!r}, "--out", {glob!r}, {mask!r}]) == 0
assert main(["evaluate", "--model", {model!r}, "--mask", {glob!r}, "--windows", {str(windows)!r},
             "--out", {str(tmp_path / "e.json")!r}]) == 0
print("IMPORTED", sorted(m for m in {NOT_ON_A_GPU_IMAGE!r} if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip().splitlines()[-1] == "IMPORTED []"
