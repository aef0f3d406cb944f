"""A workflow run killed with ``kill -9`` resumes without manual steps.

Snakemake (9.x) locks a working directory with plain files in ``.snakemake/locks`` that name
no process. A run killed with ``kill -9`` (or a power loss) leaves them behind, and every later
run stops with "Directory cannot be locked" until someone runs ``snakemake --unlock``, which is
only safe if no other Snakemake is working in the directory. So every Snakemake of this workflow
also holds a shared ``flock`` on ``.snakemake/fedlib-run.flock`` for as long as it lives (the
Snakefile calls :func:`claim_workdir` while it is read, before Snakemake takes its own lock);
the kernel drops an ``flock`` when its process dies, ``kill -9`` included. A run that can take
that lock *exclusively* is the only live Snakemake of the workflow here: a Snakemake lock it
finds is stale, and it removes it as ``--unlock`` would. Otherwise it leaves everything to
Snakemake, which refuses overlapping runs as usual. (The outputs a killed run left half done
are marked incomplete by Snakemake; the profiles' ``rerun-incomplete`` reruns them.)
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

CLAIM_FILE = "fedlib-run.flock"
_held: list[int] = []  # this process's claim: closing the descriptor would drop the flock


def claim_workdir(snakemake_dir: Path = Path(".snakemake")) -> bool:
    """Hold this process's claim on the working directory of ``snakemake_dir`` until it exits;
    first, if no other process holds one, remove Snakemake's stale lock. True if it did.

    Where the file system has no ``flock`` (some network file systems), nothing is claimed or
    removed: Snakemake's own behaviour applies."""
    snakemake_dir = Path(snakemake_dir)
    snakemake_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(snakemake_dir / CLAIM_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    removed = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another Snakemake of this workflow is alive here: its lock is not stale
        else:
            locks = snakemake_dir / "locks"
            if locks.is_dir() and any(locks.iterdir()):
                shutil.rmtree(locks)
                removed = True
        # shared from here on (waits while another run is inside this check)
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return removed
    _held.append(fd)
    return removed
