"""The similarity analysis's table: Hamming distances between masks of disjoint calibration sets."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from fedlib.privacy.tables.common import PAPER, pct, provenance, _size_label, _types, _where, _write_tables


def _pair_stats(pairs, sizes, types=None) -> list[float]:
    types = types or list(sizes)
    n = sum(sizes[t] for t in types)
    return [sum(p["diff"].get(t, 0) for t in types) / n for p in pairs]


def _dist_cells(values) -> list[str]:
    v = np.asarray(values)
    std = float(v.std(ddof=1)) if v.size > 1 else 0.0
    return [str(v.size), pct(float(v.mean())), pct(std), pct(float(v.min())), pct(float(np.median(v))),
            pct(float(v.max())), pct(1 - float(v.mean()))]


def similarity_table(res: dict, spec: dict, out_dir: Path, suffix: str) -> list[Path]:
    sizes = res["type_sizes"]
    rows, lines = [], []
    if "clients" in res:
        c = res["clients"]
        k = statistics.mean(c["n_samples"])
        rows.append([f"{len(c['client_ids'])} client masks (shared files), all layers"]
                    + _dist_cells(_pair_stats(c["pairs"], sizes)))
        for t in _types(sizes):
            rows.append([f"  {t}"] + _dist_cells(_pair_stats(c["pairs"], sizes, [t])))
        lines.append(f"Client masks: every pair of the {len(c['client_ids'])} clients' mask files of the default "
                     f"setting ({c['method']}, {c['group']}, {c['sparsity']:.0%}); each client's {k:g} calibration "
                     "samples are a disjoint random part of the seeded pool, so each mask comes from different "
                     "private data.")
    if "seeds" in res:
        s = res["seeds"]
        rows.append([f"{len(s['seeds'])} masks from seeded calibration draws ({s['n_samples']} × {s['seqlen']} "
                     "tokens each), all layers"] + _dist_cells(_pair_stats(s["pairs"], sizes)))
        lines.append(f"Seeded draws: whole-model masks computed from independent calibration draws with seeds "
                     f"{s['seeds']} ({s['n_samples']} samples × {s['seqlen']} tokens each).")
    rows.append(["Paper: LLaMA-7B, Wanda, different random calibration sets", "-", pct(PAPER["similarity_hamming"]),
                 "-", "-", "-", "-", "> 95 %"])
    header = provenance(spec["context"], res["model_fingerprint"]) + [_size_label(spec)] + lines + [
        f"Hamming distance = fraction of the {res['total_entries']:,} mask bits that differ (per layer type: of "
        "that type's bits); distribution over pairs. Masks of fewer samples differ more: compare settings with "
        "the same number of samples per data set.",
    ]
    columns = ["Masks compared", "Pairs", "Mean Hamming", "Std", "Min", "Median", "Max", "Identical bits (mean)"]
    tables = _write_tables(out_dir, "similarity", suffix, "Privacy audit 2: mask similarity across private data sets (Hamming distance)", header, columns, rows)
    return tables


def write(spec: dict, results: dict) -> list[Path]:
    """Its tables in the bundled report (:func:`fedlib.privacy.audit_report.write_reports`): none
    without its result."""
    if not results.get("similarity"):
        return []
    return similarity_table(results["similarity"], spec, *_where(spec))
