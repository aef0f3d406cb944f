"""The inversion analysis's table: calibration tokens reconstructed from block-0 q_proj masks."""

from __future__ import annotations

import statistics
from pathlib import Path

from fedlib.privacy.tables.common import _cell, pct, provenance, _s, _size_label, _where, _write_tables


def _inversion_summary(rows: list[dict]) -> str:
    """What this run's attack recovered, per text length (mean over its texts), against the
    unigram guess (the bag of the T most likely tokens of public text)."""
    parts = []
    for t in sorted({r["tokens"] for r in rows}):
        at = [r for r in rows if r["tokens"] == t]
        bag = statistics.mean(r["bag_overlap"] for r in at)
        guesses = [r["unigram_bag_overlap"] for r in at if r.get("unigram_bag_overlap") is not None]
        guess = f"unigram guess {pct(statistics.mean(guesses), 1)}" if guesses else "no unigram guess computed"
        parts.append(f"T = {t}: {pct(bag, 1)} of the bag of tokens recovered ({guess}; "
                     f"{len(at)} text{_s(len(at))})")
    return "Measured in this run: " + "; ".join(parts) + "."


def inversion_table(res: dict, spec: dict, out_dir: Path, suffix: str) -> list[Path]:
    rows = []
    for r in res["rows"] + res["tiny"]:
        rows.append([
            "SmolLM2 (this model)" if r["model"] == "real" else r["model"], str(r["tokens"]), str(r["text_index"] + 1),
            pct(r["mask_agreement"], 3), pct(r["baseline_agreement"], 3), pct(r["position_match"], 1),
            pct(r["bag_overlap"], 1), pct(r.get("unigram_bag_overlap"), 1),
            _cell(r.get("target_text") or str(r["target_tokens"])), _cell(r.get("text") or str(r["decoded_tokens"])),
        ])
    rows.append(["Paper: LLaMA-7B, gradient inversion", "-", "-", "-", "-", "-", "< 2 %", "-",
                 "your Apple AirPods and EarPods. Easy & hassle free installation…",
                 "jdeuxTvekirection Readlarzug hecho pertelled h threat todos…"])
    lengths = sorted({r["tokens"] for r in res["rows"]})
    header = provenance(spec["context"], res["model_fingerprint"]) + [
        _size_label(spec),
        f"Threat model: an honest-but-curious server with the public model, the method (Wanda, {res['group']}, "
        f"{res['sparsity']:.0%}), the tie-break seed and the number of tokens T receives one client's block-0 "
        f"q_proj mask computed from a private text of T tokens (T = {', '.join(map(str, lengths))}; C4 calibration "
        f"windows) and searches for tokens whose mask matches "
        f"(fedlib.privacy.inversion: histogram relaxation, {res['steps']} Adam steps, {res['restarts']} "
        f"restart{_s(res['restarts'])}, "
        "then discrete refinement"
        + ("; logits initialised at the public unigram prior" if res.get("use_prior") else "") + ").",
        "The block-0 q/k/v input is the normalised embedding of each token, before any position enters: the mask "
        "is a function of the bag of tokens only, so exact-position recovery is impossible by construction and "
        "bag-of-tokens recovery (multiset overlap / T) is the ceiling.",
        _inversion_summary(res["rows"]),
        "Random-token agreement is the baseline mask agreement of T random tokens: masks are mostly set by the "
        "public weights, so even unrelated text agrees on most bits. The tiny model (vocabulary 32, hidden 64) is "
        "the case where the mask does hold the text: recovery is exact.",
    ]
    columns = ["Model", "T tokens", "Text", "Mask agreement (attack)", "Mask agreement (random tokens)",
               "Exact-position recovery", "Bag-of-tokens recovery", "Unigram guess (bag)",
               "Original", "Reconstructed (bag, in the attack's order)"]
    tables = _write_tables(out_dir, "inversion", suffix, "Privacy audit 5: inverting a client's mask back to its text", header, columns, rows)
    return tables


def write(spec: dict, results: dict) -> list[Path]:
    """Its tables in the bundled report (:func:`fedlib.privacy.audit_report.write_reports`): none
    without its result."""
    if not results.get("inversion"):
        return []
    return inversion_table(results["inversion"], spec, *_where(spec))
