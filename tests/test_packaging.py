"""What pyproject.toml claims against the lock and the interpreters it names."""

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from test_environments import lock_pins

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def admits(spec: SpecifierSet, minor: int) -> bool:
    """Some release of Python 3.minor satisfies ``spec`` (a package may need a patch release:
    pymdown-extensions, of the docs tools, needs 3.11.5)."""
    return any(Version(f"3.{minor}.{micro}") in spec for micro in range(30))


def test_python_range_is_what_the_lock_needs():
    """The oldest Python series that requires-python admits can install every locked package
    (their Requires-Python, read from the installed distributions at the lock's versions), and
    the series below it cannot install them all: the range is neither too wide nor too narrow."""
    claimed = SpecifierSet(PROJECT["requires-python"])
    lowest = min(minor for minor in range(6, 20) if admits(claimed, minor))
    needs = {}
    for name, version in lock_pins().items():
        dist = metadata.distribution(name)
        assert Version(dist.version).public == version, f"{name}: installed {dist.version}, locked {version}"
        needs[name] = SpecifierSet(dist.metadata.get("Requires-Python") or "")
    assert all(admits(spec, lowest) for spec in needs.values()), \
        {n: str(s) for n, s in needs.items() if not admits(s, lowest)}
    too_old = {n: str(s) for n, s in needs.items() if not admits(s, lowest - 1)}
    assert too_old, f"the lock also installs on Python 3.{lowest - 1}"
    assert {"numpy", "scipy"} <= set(too_old), too_old


def test_lock_satisfies_the_ranges():
    """Every requirement of fedlib, core and extras, admits the locked version: the ranges are
    what `make install` installs."""
    lock = lock_pins()
    requirements = PROJECT["dependencies"] + [r for extra in PROJECT["optional-dependencies"].values() for r in extra]
    for req in map(Requirement, requirements):
        name = canonicalize_name(req.name)
        if name in (canonicalize_name(PROJECT["name"]), "snakemake-executor-plugin-slurm"):
            continue  # [all] names the extras; the Slurm plugin is installed on demand (make install-slurm)
        assert req.specifier.contains(lock[name], prereleases=True), f"{req}: locked {lock[name]}"
