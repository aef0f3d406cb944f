"""Which fedlib wrote a table: its version and the git commit of its source, read when the
table is written. (Not a rule parameter: a new commit must not rerun finished report jobs.)"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from fedlib import __version__

#: what decides results: a checkout whose tracked files here differ from HEAD says so
_SOURCES = ("fedlib", "workflow", "Snakefile")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)


@functools.cache
def source_commit() -> str:
    """Short hash of the checkout fedlib runs from, ``+changes`` when its library or workflow
    differs from that commit; ``unknown`` for an installed (non-checkout) fedlib."""
    root = Path(__file__).resolve().parent.parent
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
            return "unknown"
        head = _git(root, "rev-parse", "--short", "HEAD").stdout.strip()
        changed = _git(root, "diff", "--quiet", "HEAD", "--", *_SOURCES).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+changes" if changed else "")


def written_by() -> str:
    return f"fedlib {__version__}, commit {source_commit()}"
