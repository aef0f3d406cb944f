"""Progress of the long loops (a model's blocks, a file's layers) for a person to follow: a bar
on a terminal, one line per step with its time, the mean rate and an ETA in a job log.

Off unless a command turns it on (:func:`reporting`): the same loops run by the thousand inside
tests and privacy audits, where a line per block would bury the log.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TextIO

_ACTIVE: contextvars.ContextVar[tuple[str, TextIO] | None] = contextvars.ContextVar("fedlib_progress", default=None)


@contextlib.contextmanager
def reporting(label: str, stream: TextIO | None = None) -> Iterator[None]:
    """Report the loops run inside the context, each step prefixed with ``label``, to
    ``stream`` (standard error by default)."""
    token = _ACTIVE.set((label, stream if stream is not None else sys.stderr))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def track(items: Sequence, unit: str) -> Iterator:
    """``items`` one by one; when reporting, each one is reported once the caller is done with
    it (the time between handing it out and being asked for the next)."""
    active = _ACTIVE.get()
    if active is None:
        yield from items
        return
    label, stream = active
    if stream.isatty():
        from tqdm import tqdm

        yield from tqdm(items, desc=label, unit=unit, file=stream, dynamic_ncols=True)
        return
    total, start = len(items), time.perf_counter()
    for done, item in enumerate(items, 1):
        began = time.perf_counter()
        yield item
        now = time.perf_counter()
        rate = (now - start) / done
        print(f"{label}: {unit} {done}/{total} in {now - began:.2f}s ({rate:.2f}s per {unit}, "
              f"ETA {_duration(rate * (total - done))})", file=stream, flush=True)
