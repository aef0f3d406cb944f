"""The DP headroom table (``fedlib privacy headroom-report``): each row of
:mod:`fedlib.privacy.dp_headroom` paired against public-only on the same windows, and the share
of Centralized's gain it keeps, pooled over the row's noise draws.

Intervals: bootstrap over the noise draws and the windows (2000 resamples), so that a row's
interval covers the noise it was drawn with as well as the evaluation windows.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from fedlib.io import write_text_atomic
from fedlib.studies.paired import BOOTSTRAP, change_cell, interval, kept_cell, load, percents, window_nll

ESTIMATOR_TITLES = {"exact": "exact private energies (no clip, no noise)",
                    "threshold": "threshold estimator (soft threshold; the default)",
                    "posterior": "posterior estimator (empirical-Bayes posterior mean)",
                    "oracle": "oracle linear shrinkage (reads the private mean: a reference, not a mechanism)"}


def _rows_by_group(record: dict) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in record["rows"]:
        groups.setdefault((row["estimator"], row["epsilon"], row["multiplier"]), []).append(row)
    return groups


def headroom_summary(record: dict, public: np.ndarray, central: np.ndarray) -> list[dict]:
    """One dict per (estimator, ε, multiplier): Δ vs public-only and gain kept, with intervals."""
    if public.shape != central.shape:
        raise ValueError(f"public-only has {public.shape[0]} windows, Centralized {central.shape[0]}")
    rng = np.random.default_rng(0)
    windows = rng.integers(0, public.shape[0], size=(BOOTSTRAP, public.shape[0]))
    ceiling = (central - public)[windows].mean(axis=1)
    out = []
    for (estimator, epsilon, multiplier), rows in _rows_by_group(record).items():
        nll = np.stack([np.asarray(r["window_nll"], dtype=np.float64) for r in rows])
        if nll.shape[1] != public.shape[0]:
            raise ValueError(f"headroom row {rows[0]['label']}: {nll.shape[1]} windows, public-only {public.shape[0]}")
        diff = nll - public
        draws = rng.integers(0, len(rows), size=(BOOTSTRAP, len(rows)))
        resampled = np.array([diff[d][:, w].mean() for d, w in zip(draws, windows)])
        delta = float(diff.mean())
        gain = float((central - public).mean())
        out.append({"estimator": estimator, "epsilon": epsilon, "multiplier": multiplier,
                    "samples": record["samples"] * multiplier, "noise_draws": len(rows),
                    "ppl": math.exp(nll.mean()), "delta": delta, "ci": interval(resampled),
                    "kept": delta / gain, "kept_ci": interval(resampled / ceiling),
                    "kept_by_draw": [float(d.mean() / gain) for d in diff],
                    "moved": float(np.mean([r["moved_coordinates"] for r in rows]))})
    return out


def paired_record(headroom: Path, public_eval: Path, central_eval: Path, dataset: str) -> tuple[dict, np.ndarray,
                                                                                                np.ndarray]:
    """(the analysis's record, public-only's and Centralized's window NLLs), refused unless the two
    evaluations scored the analysis's split (so that they pair window for window)."""
    record = load(headroom)
    split = record.get("split", "test")
    nll = []
    for path in (public_eval, central_eval):
        result = load(path)
        if result["perplexity"][dataset].get("split", "test") != split:
            raise ValueError(f"{path}: scored on {dataset} {result['perplexity'][dataset].get('split', 'test')}, "
                             f"the analysis on {split}: pair them on the same windows")
        nll.append(window_nll(result, dataset))
    return record, nll[0], nll[1]


def headroom_table(headroom: Path, public_eval: Path, central_eval: Path, dataset: str, out: Path,
                   provenance: str) -> list[Path]:
    """Write ``out`` (markdown) and its .csv; ``provenance`` names the model and config."""
    from fedlib.provenance import written_by

    record, pub_nll, cen_nll = paired_record(headroom, public_eval, central_eval, dataset)
    split = record.get("split", "test")
    summary = headroom_summary(record, pub_nll, cen_nll)
    gain = math.expm1(float((cen_nll - pub_nll).mean()))
    lines = [
        "# DP headroom: what limits the distributed mechanism's masks",
        "",
        f"- {provenance}; written by {written_by()}",
        f"- Clients' samples: {record['samples']} ({record['clients']} clients); clip {record['clip']:g} × the public "
        f"scale; {record['coordinates']} released coordinates; evaluation: {record['windows']} {dataset} {split} windows "
        f"in {record['eval_dtype']} on {record['eval_threads']} CPU thread(s), "
        + ("the study's public-only and Centralized rows' windows." if split == "test" else
           "held out from the study's test windows (an estimator chosen here is not chosen where it is scored); "
           "public-only and Centralized scored on them too."),
        f"- Public-only {dataset} ppl {math.exp(pub_nll.mean()):.2f}; Centralized {math.exp(cen_nll.mean()):.2f} "
        f"({gain:+.1%}): the gain a row keeps is its Δ over this one.",
        "- Rows (fedlib.privacy.dp_headroom): the exact private energies through the public prefix; the "
        "threshold estimator at the noise of the distributed mechanism's guarantee at ε divided by the data multiplier "
        "(the noise of a federation with that many times the samples); the posterior estimator (--dp-estimator posterior), each "
        "coordinate's posterior mean under the prior fitted to the input's noisy coordinates (post-processing: as private); the oracle linear shrinkage, which reads the "
        "private mean (each coordinate scaled by its own best constant: a reference, not a private estimator and "
        "not a bound).",
        "- Intervals: 95 %, bootstrap over the row's noise draws and the windows.",
        "- **Non-private diagnostic**: this analysis reads the clients' exact private statistics, and its noise is "
        "seeded (simulation: not private). No row here is a DP release; the pool it reads has no finite ε in its "
        "ledger (fedlib.dp.ledger) once this analysis has run on it.",
        "",
    ]
    header = ["Estimator", "ε", "data ×", "samples", "noise draws", f"{dataset.upper()} ppl",
              "Δ vs public [95% CI]", "gain kept [95% CI]", "kept per draw", "coordinates off the prior"]
    rows = [[ESTIMATOR_TITLES[s["estimator"]], "∞" if s["epsilon"] is None else f"{s['epsilon']:g}",
             f"{s['multiplier']:g}", f"{s['samples']:g}", str(s["noise_draws"]), f"{s['ppl']:.2f}",
             change_cell(s["delta"], s["ci"]), kept_cell(s["kept"], s["kept_ci"]),
             percents(s["kept_by_draw"]), f"{s['moved']:.0f}"] for s in summary]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, "\n".join(lines) + "\n")
    csv_path = out.with_suffix(".csv")
    tmp = csv_path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    tmp.replace(csv_path)
    return [out, csv_path]
