"""The bundled privacy audit's report: assembles the tables of the analyses the ``report`` verb writes.

Each analysis owns its table (:mod:`fedlib.privacy.tables`, one module per entry of
:mod:`fedlib.privacy_analyses`); :func:`write_reports` takes a spec (built by
``workflow/rules/privacy.smk``)::

    {"context": {model, config, config_hash, seed, lines},   # as report_context()
     "out_dir": "reports", "suffix": "" | "_full", "size": "run" | "full",
     "entropy": JSON, "similarity": JSON, "sensitivity": JSON, "membership": JSON,
     "inversion": JSON, "secagg": JSON,
     "defence": {"records": {eps: JSON}, "evals": {eps: JSON}, "clean_eval": JSON,
                 "dense_eval": JSON, "datasets": [...], "group": "layer"}}

loads every result once (some tables read another analysis's: sensitivity the similarity's
natural variation, defence the membership attacks and the sensitivity) and has each analysis's
``write(spec, results)`` write ``privacy_<analysis><suffix>.md/.csv/.html`` (and its plots) for
every analysis present, in the registry's order. Every table header starts with the provenance
lines of the other tables (model + fingerprint, config + hash, seed, the fedlib version and commit
that wrote it, the setting) and then says exactly what was computed, with its sizes.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from fedlib.privacy.tables.common import _load
from fedlib.privacy_analyses import ANALYSES, REPORT


def write_reports(spec: dict) -> list[Path]:
    """Every table (and plot) the spec has results for; returns the written paths."""
    analyses = [a for a in ANALYSES if a.report == REPORT]
    # a result file is loaded once; defence's entry is a spec of its own (several files per ε)
    results = {a.name: _load(v) if isinstance(v, str) and v else (v or None)
               for a in analyses for v in [spec.get(a.name)]}
    written: list[Path] = []
    for analysis in analyses:
        written += getattr(import_module(analysis.table_module), analysis.writer)(spec, results)
    return written
