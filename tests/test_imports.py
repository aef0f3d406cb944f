"""No import circles in fedlib: the modules' imports (top-level and inside functions) form a DAG,
and the vocabulary leaves (fedlib.protocol, fedlib.cli_args, fedlib.strategy_options) import
nothing of fedlib (but the protocol's vocabulary) or torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "fedlib"


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside ``if TYPE_CHECKING:`` (never executed at run time)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return True
    return False


def imported_modules(path: Path, modules: set[str], root: Path = REPO) -> set[str]:
    """The fedlib modules ``path`` executes on import or in its functions: each imported module
    and the packages above it (whose ``__init__`` runs first), but not its own packages."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    this = module_name(path, root)
    found = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "fedlib":
            targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names if alias.name.split(".")[0] == "fedlib"]
        else:
            continue
        for target in targets:
            if target in modules:  # `from fedlib.x import y`: y is a module or a name in fedlib.x
                found.update([target, *ancestors(target)])
    own = set(ancestors(this)) | {this}
    return found - own


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path that ends where it starts), or None: a depth-first search."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_scan_sees_function_level_imports_and_skips_type_checking(tmp_path):
    source = tmp_path / "fedlib" / "x.py"
    source.parent.mkdir()
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fedlib.a import A\n\n"
                      "def f():\n    from fedlib.b.c import g\n    import fedlib.d\n")
    modules = {"fedlib", "fedlib.a", "fedlib.b", "fedlib.b.c", "fedlib.d", "fedlib.x"}
    assert imported_modules(source, modules, tmp_path) == {"fedlib.b", "fedlib.b.c", "fedlib.d"}


def test_no_import_circle():
    graph = import_graph()
    assert "fedlib.maskfile" in graph and "fedlib.cli" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "runtime import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("leaf", ["fedlib.protocol", "fedlib.cli_args", "fedlib.strategy_options"])
def test_vocabulary_leaves_import_nothing_of_fedlib_or_torch(leaf):
    """(the command line's vocabulary is built on the protocol's)"""
    code = (f"import sys, {leaf}\n"
            "print(*sorted(m for m in sys.modules if m.split('.')[0] in ('fedlib', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == sorted({"fedlib", "fedlib._version", "fedlib.protocol", leaf})


def test_the_workflow_definition_imports_no_torch_or_scipy():
    """Snakemake reads the Snakefile on every start (a dry run, each test of the workflow, each
    cluster job): the fedlib modules the .smk files import, the domain study's file names and the
    job sizes of the .test model load no torch, scipy or transformers (2-4 s of CPU each)."""
    smk = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    modules = sorted({m for path in smk for m in re.findall(r"^\s*from (fedlib[\w.]*) import", path.read_text(), re.M)})
    assert {"fedlib.catalog", "fedlib.catalog.domain", "fedlib.jobsize", "fedlib.config_check"} <= set(modules)
    code = ("import sys, yaml\n" + "".join(f"import {m}\n" for m in modules) +
            "from fedlib.catalog import Catalog\nfrom fedlib.catalog.domain import DomainCatalog\n"
            "from fedlib.config_check import with_schema_defaults\n"
            "config = with_schema_defaults(yaml.safe_load(open('.test/config.yaml')))\n"
            "DomainCatalog(Catalog(config)).dp_file_patterns()\n"
            "fedlib.jobsize.host_mem_mb('.test/model', 'blocks', tokens=(96, 32))\n"
            "print(*sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'scipy', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == []
