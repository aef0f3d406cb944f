"""fedlib as a library: installed with its core dependencies only into a fresh virtual environment,
a site's client-mask and a server's aggregate run from it (no Snakemake, lm-eval or matplotlib
there) and give the global mask this checkout gives. Minutes: it installs torch and transformers
(pip's cache and this machine's local wheels make it quicker)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from conftest import tiny_llama
from fedlib.cli import main
from fedlib.data import save_tokens
from fedlib.maskfile import MaskFile

REPO = Path(__file__).resolve().parents[1]
#: the workflow's, evaluation's and plots' packages: not core dependencies
ABSENT = ("snakemake", "lm_eval", "matplotlib", "datasets", "dp_accounting", "flwr")
#: what an sdist holds: the package and what pyproject.toml reads
SOURCE = ("pyproject.toml", "README.md", "LICENSE", "fedlib")


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_core_install_runs_the_protocol(tmp_path):
    src = tmp_path / "src"  # a copy without .git: the version is setuptools-scm's fallback
    src.mkdir()
    for name in SOURCE:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, src / name)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    # --no-compile: byte-compiling all of torch and transformers is most of an install's time; the
    # protocol below compiles only what it imports
    python, pip = venv / "bin" / "python", [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                            "--no-compile", "-c", str(REPO / "requirements" / "lock.txt")]
    run([*pip, "torch"])
    run([*pip, str(src)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    present = run([str(python), "-c", "import importlib.util as u, sys; "
                   f"print(*[m for m in {ABSENT!r} if u.find_spec(m)])"], env=env, cwd=tmp_path).stdout.split()
    assert present == []
    where = run([str(python), "-c", "import fedlib, pathlib; p = pathlib.Path(fedlib.__file__).parent; "
                 "print(p); print(*[f for f in ('schemas/config.schema.yaml', 'data_sources.json', 'py.typed') "
                 "if (p / f).is_file()])"], env=env, cwd=tmp_path).stdout.splitlines()
    assert str(venv) in where[0] and where[1].split() == ["schemas/config.schema.yaml", "data_sources.json", "py.typed"]
    fallback = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools_scm"]["fallback_version"]
    fedlib = str(venv / "bin" / "fedlib")
    assert run([fedlib, "--version"], env=env, cwd=tmp_path).stdout.split() == ["fedlib", fallback]

    model = tmp_path / "model"
    tiny_llama(vocab_size=128).save_pretrained(model)
    masks = []
    for client in range(2):
        calib = tmp_path / f"calib_{client}.safetensors"
        save_tokens(calib, torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(client)))
        masks.append(tmp_path / f"client_{client}.mask.safetensors")
        run([fedlib, "client-mask", "--model", str(model), "--calib", str(calib), "--client-id", str(client),
             "--out", str(masks[-1])], env=env, cwd=tmp_path)
    installed = tmp_path / "global.mask.safetensors"
    run([fedlib, "aggregate", "--model", str(model), "--group", "layer", "--out", str(installed), *map(str, masks)],
        env=env, cwd=tmp_path)
    # the same protocol with this checkout's fedlib, in this process
    here = []
    for client in range(2):
        here.append(tmp_path / f"here_{client}.mask.safetensors")
        assert main(["client-mask", "--model", str(model), "--calib", str(tmp_path / f"calib_{client}.safetensors"),
                     "--client-id", str(client), "--out", str(here[-1])]) == 0
    checkout = tmp_path / "here_global.mask.safetensors"
    assert main(["aggregate", "--model", str(model), "--group", "layer", "--out", str(checkout), *map(str, here)]) == 0
    got, want = MaskFile(installed).masks(), MaskFile(checkout).masks()
    assert got.keys() == want.keys() and len(got) == 14  # 2 blocks x 7 linears
    assert all(torch.equal(got[name], want[name]) for name in want)
    assert 0 < sum(int(m.sum()) for m in got.values()) < sum(m.numel() for m in got.values())
