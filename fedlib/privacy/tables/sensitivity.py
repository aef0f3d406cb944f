"""The sensitivity analysis's table: the Hamming distance between masks of data sets that differ in one
sample, beside the natural variation (the similarity analysis's pairs)."""

from __future__ import annotations

import statistics
from pathlib import Path

from fedlib.privacy.tables.common import (
    _block_scope,
    PAPER,
    pct,
    provenance,
    _size_label,
    _types,
    _where,
    _write_tables,
)
from fedlib.privacy.tables.similarity import _pair_stats


def sensitivity_table(res: dict, spec: dict, out_dir: Path, suffix: str, natural: dict | None) -> list[Path]:
    sizes = res["type_sizes"]
    types = _types(sizes)
    total = res["total_entries"]
    rows = []
    for j, nb in enumerate(res["neighbours"]):
        rows.append([f"D'_{j + 1}", str(nb["replaced_row"]), f"{nb['changed_bits']:,}", pct(nb["changed_bits"] / total, 3)]
                    + [pct(nb["diff"].get(t, 0) / sizes[t], 3) for t in types])
    changed = [nb["changed_bits"] for nb in res["neighbours"]]
    rows.append(["Mean over neighbours", "-", f"{statistics.mean(changed):,.0f}",
                 pct(statistics.mean(changed) / total, 3)]
                + [pct(statistics.mean(nb["diff"].get(t, 0) for nb in res["neighbours"]) / sizes[t], 3) for t in types])
    if natural is not None and "clients" in natural and res["blocks"] is None:
        nat = natural["clients"]
        rows.append([f"Natural variation: two different clients' data (privacy_similarity, "
                     f"{len(nat['pairs'])} pairs)", "-", "-", pct(statistics.mean(_pair_stats(nat["pairs"], natural["type_sizes"])), 3)]
                    + [pct(statistics.mean(_pair_stats(nat["pairs"], natural["type_sizes"], [t])), 3) for t in types])
    rows.append(["Paper: LLaMA-7B, Wanda", "-", "-", pct(PAPER["sensitivity_hamming"])] + ["-"] * len(types))
    scope = "the whole model" if res["blocks"] is None else _block_scope(res["blocks"])
    header = provenance(spec["context"], res["model_fingerprint"]) + [
        _size_label(spec),
        f"D = {Path(res.get('calib', 'D')).name}: {res['n_samples']} calibration samples × {res['seqlen']} tokens "
        f"(a client's shard); D'_j = D with sample j mod {res['n_samples']} replaced by a sample from another "
        f"client's shard: {len(res['neighbours'])} neighbouring data sets (differing in exactly one sample). "
        f"Masks of {scope} ({res['n_layers']} linears, {total:,} bits; {res['method']}, {res['group']}, "
        f"{res['sparsity']:.0%}), computed as the client computes them"
        + (f"; D's mask is the client's shared mask file ({Path(res['base_mask']).name})." if res.get("base_mask")
           else "."),
        "NOT a differential-privacy ε. The paper reads its 4.96 % as 'equivalent to a formal privacy budget of "
        "ε ≈ 0.05'; that ε is not derived from any mechanism, and no formal DP ε follows from a Hamming distance. "
        "Wanda is deterministic: two neighbouring data sets whose masks differ (every row above) give output "
        "distributions with disjoint supports, so the release is not ε-DP for any finite ε. For an empirical ε "
        "lower bound see privacy_membership; for a mechanism with a stated ε see privacy_defence.",
        f"With {res['n_samples']} samples per data set, one sample is 1/{res['n_samples']} of the data, so a "
        "replace-one change is comparable to the natural variation between different data sets; the number of "
        "changed bits (Δ) is what group privacy would multiply a per-bit ε by.",
    ]
    columns = ["Neighbour", "Replaced sample", "Changed bits", "Hamming (all layers)"] + [f"{t}" for t in types]
    tables = _write_tables(out_dir, "sensitivity", suffix, "Privacy audit 3: sensitivity of the mask to one calibration sample", header, columns, rows)
    return tables


def write(spec: dict, results: dict) -> list[Path]:
    """Its tables in the bundled report (:func:`fedlib.privacy.audit_report.write_reports`): none
    without its result."""
    if not results.get("sensitivity"):
        return []
    return sensitivity_table(results["sensitivity"], spec, *_where(spec), results.get("similarity"))
