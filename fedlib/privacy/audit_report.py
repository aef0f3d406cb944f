"""Report tables (Markdown + CSV) and plots (PNG) of the privacy audit.

:func:`write_reports` takes a spec (built by ``workflow/rules/privacy.smk``)::

    {"context": {model, config, config_hash, seed, lines},   # as report_context()
     "out_dir": "reports", "suffix": "" | "_full", "size": "run" | "full",
     "entropy": JSON, "similarity": JSON, "sensitivity": JSON, "membership": JSON,
     "inversion": JSON, "secagg": JSON,
     "defence": {"records": {eps: JSON}, "evals": {eps: JSON}, "clean_eval": JSON,
                 "dense_eval": JSON, "datasets": [...], "group": "layer"}}

and writes ``privacy_<analysis><suffix>.md/.csv/.html`` for every analysis present, plus
``privacy_entropy_layers<suffix>.csv`` (every layer), ``privacy_membership_roc<suffix>.png``
and ``privacy_defence<suffix>.png``. Every table header starts with the provenance lines
of the other tables (model + fingerprint, config + hash, seed, the fedlib version and commit that
wrote it, the setting) and then says exactly what was computed, with its sizes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

import numpy as np

from fedlib.io import atomic_path, write_text_atomic
from fedlib.report import DATASET_TITLES, fmt_ppl, write_table

#: the paper's figures (FedPrLLM App. C, LLaMA-7B, Wanda, 50 %), quoted in the tables
PAPER = {
    "mask_bits": 1.0,
    "fp16_bits": 13.75,
    "similarity_hamming": 0.0496,
    "sensitivity_hamming": 0.0496,
    "claimed_epsilon": 0.05,
    "mia_target_hamming": 0.0323,
    "inversion_tokens": 0.02,
}

TYPE_ORDER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _load(path) -> dict:
    return json.loads(Path(path).read_text())


def pct(x, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f} %"


def num(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ci(lo, hi, fmt=pct) -> str:
    return f"[{fmt(lo)}, {fmt(hi)}]"


def _types(names) -> list[str]:
    return [t for t in TYPE_ORDER if t in names] + sorted(t for t in names if t not in TYPE_ORDER)


def _cell(text: str, limit: int = 160) -> str:
    """Text safe for a Markdown table cell: no pipes or newlines, truncated."""
    text = (text or "").replace("|", "¦").replace("\r", "").replace("\n", " ⏎ ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def provenance(context: dict, fingerprint: str | None) -> list[str]:
    """The provenance lines every report table starts with (as fedlib.report.provenance_lines)."""
    from fedlib.provenance import written_by

    config_hash = f" (sha256 {context['config_hash']})" if context.get("config_hash") else ""
    return [
        f"Model: {context.get('model', '?')} (fingerprint {(fingerprint or '?')[:16]})",
        f"Config: {context.get('config', '?')}{config_hash}; seed {context.get('seed')}; written by {written_by()}",
        *context.get("lines", []),
    ]



def _write_tables(out_dir: Path, analysis: str, suffix: str, title: str, header, columns, rows) -> list[Path]:
    """reports/privacy_<analysis><suffix>.{md,csv,html}: the HTML page is what the Snakemake report shows."""
    paths = [out_dir / f"privacy_{analysis}{suffix}.{ext}" for ext in ("md", "csv", "html")]
    write_table(*paths[:2], title, header, columns, rows, html_path=paths[2])
    return paths

def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _block_scope(blocks: int | None) -> str:
    if blocks is None:
        return "all decoder blocks"
    return "decoder block 0" if blocks == 1 else f"decoder blocks 0..{blocks - 1}"


def _size_label(spec: dict) -> str:
    return "full audit (target privacy_full)" if spec.get("size") == "full" else \
        "reduced audit (part of `make run`; target privacy_full has the full sizes)"


# --------------------------------------------------------------------------- entropy


def entropy_table(res: dict, spec: dict, out_dir: Path, suffix: str) -> list[Path]:
    layers = res["layers"]
    m = res["n_clients"]

    def agg(rows, label):
        n = sum(r["numel"] for r in rows)
        w = lambda key: sum(r[key] * r["numel"] for r in rows) / n  # noqa: E731
        ens = w("ensemble_bits") if m >= 2 else None
        mb, fb = w("mask_bits"), w("fp16_bits")
        return [label, f"{n:,}", pct(w("mask_density")), num(mb), num(fb),
                str(max(r["fp16_distinct"] for r in rows)), pct(mb / fb, 1), pct(1 - mb / fb, 1),
                num(ens, 4) if ens is not None else "-"]

    rows = []
    paper_layer = [r for r in layers if r["block"] == 0 and r["type"] == "q_proj"]
    if paper_layer:
        rows.append(agg(paper_layer, f"Block 0 q_proj ({paper_layer[0]['name']}; the paper's layer)"))
    by_type = {}
    for r in layers:
        by_type.setdefault(r["type"], []).append(r)
    for t in _types(by_type):
        rows.append(agg(by_type[t], f"{t}, all {len(by_type[t])} blocks"))
    rows.append(agg(layers, f"Whole model ({len(layers)} linears; element-weighted mean of per-layer entropies)"))
    rows.append(["Whole model, one pooled fp16 histogram", f"{res['total_entries']:,}", "-", "-",
                 num(res["fp16_pooled_bits"]), str(res["fp16_pooled_distinct"]), "-", "-", "-"])
    rows.append(["Paper: LLaMA-7B block-0 q_proj (fp16 weights)", "16,777,216", "50.00 %", num(PAPER["mask_bits"]),
                 num(PAPER["fp16_bits"]), "-", "7.3 %", "92.7 %", "-"])
    header = provenance(spec["context"], res["model_fingerprint"]) + [
        _size_label(spec),
        f"Mask: client {res['client_ids'][0]}'s shared mask file ({res['method']}, {res['group']} comparison, "
        f"{res['sparsity']:.0%}, from its {res['n_samples']} calibration samples); on the wire it takes "
        f"{res['file_bits_per_entry']:.3f} bits per weight (packed file incl. header).",
        "Bits/entry are zero-order empirical entropies (each entry an independent draw from the tensor's "
        "histogram): mask = H(density); fp16 = entropy of the float16 bit-pattern histogram (65,536 patterns).",
        f"Across clients = mean over entries of H(fraction of the {m} clients pruning it), each client on a "
        "disjoint random shard: the part of a mask that varies with the private data (0 = all clients agree).",
        f"Weights are cast to float16 from the model's float32 parameters ({res['fp16_pooled_distinct']:,} distinct "
        "fp16 values over the model). The embedded SmolLM2 is dequantized from 4-bit Q4_1 (16 levels per block of "
        "32 weights, with a per-block scale and minimum), so its weights carry fewer distinct values than "
        "genuinely trained fp16 weights; compare with the paper's LLaMA-7B row with that in mind.",
        "Neither figure is a privacy measure: a mask is mostly a function of the public weights, and the small "
        "data-dependent part spread over ~10^8 bits is what the membership and inversion attacks exploit.",
    ]
    columns = ["Layers", "Entries", "Mask density", "Mask bits/entry", "fp16 bits/entry", "fp16 distinct values",
               "Mask / fp16", "Reduction", "Across clients bits/entry"]
    tables = _write_tables(out_dir, "entropy", suffix, "Privacy audit 1: entropy of a shared mask vs the fp16 weights", header, columns, rows)
    per_layer = out_dir / f"privacy_entropy_layers{suffix}.csv"
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["layer", "type", "block", "entries", "mask_density", "mask_bits", "fp16_bits",
                     "fp16_distinct", "across_clients_bits"])
    for r in layers:
        writer.writerow([r["name"], r["type"], r["block"], r["numel"], f"{r['mask_density']:.6f}",
                         f"{r['mask_bits']:.6f}", f"{r['fp16_bits']:.6f}", r["fp16_distinct"],
                         "" if r["ensemble_bits"] is None else f"{r['ensemble_bits']:.6f}"])
    write_text_atomic(per_layer, buffer.getvalue())
    return tables + [per_layer]


# --------------------------------------------------------------------------- similarity


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


# --------------------------------------------------------------------------- sensitivity


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


# --------------------------------------------------------------------------- membership


def _tpr_cell(entry: dict) -> str:
    mark = "" if entry["resolvable"] else " †"
    return f"{pct(entry['tpr'], 1)} {_ci(*entry['tpr_ci'], fmt=lambda x: pct(x, 1))}{mark}"


def _eps_cell(entry: dict) -> str:
    lb = entry.get("epsilon_lb")
    if lb is None:
        return "-"
    return f"{lb:.2f} (TP {entry['tp']}, FN {entry['fn']}, FP {entry['fp']}, TN {entry['tn']})"


def _attack_columns(fprs) -> list[str]:
    """The columns of :func:`_attack_row` after its label."""
    return ["AUC [95 % CI]"] + [f"TPR @ {f:g} FPR [95 % CI]" for f in fprs] + \
        ["ε lower bound, LR = 1 threshold", "ε lower bound, split threshold"]


def _attack_row(label: str, a: dict, fprs) -> list[str]:
    by_fpr = {e["target_fpr"]: e for e in a["tpr_at_fpr"]}
    return [label, f"{a['auc']:.3f} {_ci(*a['auc_ci'], fmt=lambda x: f'{x:.3f}')}"] + \
        [_tpr_cell(by_fpr[f]) for f in fprs] + [_eps_cell(a["epsilon_lr1"]), _eps_cell(a["epsilon_split"])]


def membership_table(res: dict, spec: dict, out_dir: Path, suffix: str) -> list[Path]:
    from fedlib.privacy.membership import epsilon_lower_bound, separated_auc_bound

    fprs = res["fprs"]
    a = res["attack"]
    rows = [_attack_row("LiRA, no defence", a, fprs)]
    for r in res["rr"]:
        rows.append(_attack_row(f"LiRA vs randomized response, ε = {r['epsilon']:g} per bit "
                                f"(flip prob. {r['flip_probability']:.3f})", r, fprs))
        if "llr" in r:
            rows.append(_attack_row(f"Per-bit likelihood ratio knowing the noise, ε = {r['epsilon']:g} per bit",
                                    r["llr"], fprs))
    s = res["signal_strength"]
    n_m, n_n = a["n_members"], a["n_nonmembers"]
    scope = _block_scope(res["blocks"])
    best = epsilon_lower_bound(n_m, 0, 0, n_n, res["confidence"])
    half = epsilon_lower_bound(n_m - n_m // 2, 0, 0, n_n - n_n // 2, res["confidence"])
    unresolved = [f"{f:g}" for f, e in zip(fprs, a["tpr_at_fpr"]) if not e["resolvable"]]
    header = provenance(spec["context"], res["model_fingerprint"]) + [
        _size_label(spec),
        f"What the attack observes: the client's {res['method']} mask ({res['group']}, {res['sparsity']:.0%}) of "
        f"{scope} only ({res['observed_layers']} linears, {res['observed_bits']:,} bits), computed from its "
        f"{res['samples']} calibration samples of {res['seqlen']} tokens (shorter than the workflow's calibration "
        "samples, to make shadow masks affordable on a CPU). These bits are part of the full mask, so any bound "
        "found here is also a lower bound for releasing the full mask of the same client computation.",
        f"Game: {res['targets']} targets from a population of {res['population']} C4 windows; per target one "
        f"member data set (target + {res['samples'] - 1} random other{_s(res['samples'] - 1)}) and one non-member "
        f"data set "
        f"({res['samples']} random other{_s(res['samples'])}): {n_m} members, {n_n} non-members. The attacker knows the public "
        f"model, the method and the population; per target it computes {res['pairs']} shadow pairs (R + target, "
        f"R + other): {res['direction_pairs']} give the direction in which the target moves the mask, "
        f"{res['fit_pairs']} fit the in/out Gaussians of the statistic <direction, mask> (variance pooled over "
        "targets). Score = log-likelihood ratio (LiRA, Carlini et al. 2022).",
        f"Intervals: AUC 95 % bootstrap (1000 resamples); at perfect separation (AUC = 1) the bootstrap is "
        f"degenerate, so the lower end is the exact bound {separated_auc_bound(n_m, n_n, res['confidence']):.3f} "
        f"(Clopper–Pearson for {min(n_m, n_n)} of {min(n_m, n_n)} disjoint member/non-member pairs won, each pair "
        "an independent trial won with probability AUC; fedlib.privacy.membership.separated_auc_bound). "
        f"TPR 95 % Clopper–Pearson over the {n_m} members. "
        + (f"† FPR {', '.join(unresolved)} not resolvable: with {n_n} non-members the smallest non-zero FPR "
           f"is {1 / n_n:.3g}, so the TPR shown is at FPR = 0. " if unresolved else "")
        + "The target FPR is met in-sample (threshold chosen on the same scores).",
        f"ε lower bound (Jagielski et al. 2020; δ = 0; Clopper–Pearson {res['confidence']:.0%}): any ε-DP release "
        "would force TPR ≤ e^ε·FPR and 1−FPR ≤ e^ε·(1−TPR). 'LR = 1': the a-priori threshold score 0 on all "
        f"scores; 'split': threshold chosen on half the targets, bound on the other half. With these counts the "
        f"largest bound any attack could show is {best:.2f} (LR = 1) and {half:.2f} (split): more targets "
        "raise the ceiling.",
        f"The paper's 'signal strength' on the same masks: target Hamming {pct(s['target_hamming'], 3)} "
        f"(mask of R + target vs R + other, mean over {res['targets'] * res['pairs']} pairs) vs natural "
        f"{pct(s['natural_hamming'], 3)} (different data sets, {s['natural_pairs']} pairs): ratio "
        f"{num(s['ratio'], 2)} (paper: 3.23 % / 4.96 % = 0.65). A ratio below 1 does not hide the target: the "
        "attack uses the direction of the change, which the attacker can compute, not its size.",
        "Under randomized response every figure is a lower bound on the leakage: the attacks are non-adaptive "
        "(a fixed statistic, not optimised against the mechanism). LiRA fits its Gaussians on noised shadows; "
        f"the per-bit likelihood ratio knows the noise: sum over bits of log P(reported bit | member) / "
        f"P(reported bit | non-member), per-bit pruning rates from all {res['pairs']} shadow pairs "
        "(Jeffreys-smoothed) pushed through the flip probability (fedlib.privacy.defence.rr_bit_llr), "
        "on its own noise draw.",
    ]
    columns = ["Attack"] + _attack_columns(fprs)
    tables = _write_tables(out_dir, "membership", suffix, "Privacy audit 4: membership inference against a client's shared mask", header, columns, rows)
    png = out_dir / f"privacy_membership_roc{suffix}.png"
    _roc_plot(res, spec, png)
    return tables + [png]


def _caption(spec: dict, fingerprint: str, extra: str) -> str:
    c = spec["context"]
    from fedlib.provenance import written_by

    return (f"{c.get('model')} (fingerprint {fingerprint[:12]}); config {c.get('config')}; seed {c.get('seed')}; "
            f"{written_by()}. {extra}")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _roc_plot(res: dict, spec: dict, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.8))
    curves = [("no defence", res["attack"])] + [(f"RR ε={r['epsilon']:g}", r) for r in res["rr"]]
    n_neg = res["attack"]["n_nonmembers"]
    floor = 1.0 / (2 * n_neg)
    for label, a in curves:
        fpr, tpr = np.asarray(a["roc_fpr"]), np.asarray(a["roc_tpr"])
        axes[0].plot(fpr, tpr, label=f"{label} (AUC {a['auc']:.3f})")
        axes[1].step(np.maximum(fpr, floor), np.maximum(tpr, floor), where="post", label=label)
    for ax in axes:
        ax.plot([floor, 1], [floor, 1], "k:", lw=1, label="chance")
        ax.set_xlabel("False positive rate (non-members called members)")
        ax.set_ylabel("True positive rate (members detected)")
    axes[0].set_title("ROC (linear)")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlim(floor, 1)
    axes[1].set_ylim(floor, 1.05)
    axes[1].set_title(f"ROC (log-log; FPR below 1/{n_neg} not measurable)")
    axes[0].legend(fontsize=7, loc="lower right")
    scope = _block_scope(res["blocks"])
    caption = _caption(spec, res["model_fingerprint"],
                       f"LiRA on the client's {res['method']} mask of {scope} ({res['observed_bits']:,} bits), "
                       f"{res['samples']} samples × {res['seqlen']} tokens; {res['targets']} targets, "
                       f"{res['pairs']} shadow pairs each; {res['attack']['n_members']} members / {n_neg} non-members.")
    fig.text(0.01, 0.01, caption, fontsize=7, wrap=True, va="bottom")
    fig.suptitle("Membership inference against a shared pruning mask")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


# --------------------------------------------------------------------------- inversion


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


# --------------------------------------------------------------------------- defence


def _eps_key(value) -> float:
    return math.inf if str(value).lower() in ("inf", "infinity") else float(value)


def defence_table(d: dict, spec: dict, out_dir: Path, suffix: str, membership: dict | None,
                  sensitivity: dict | None) -> list[Path]:
    records = {_eps_key(k): _load(v) for k, v in d["records"].items()}
    evals = {_eps_key(k): _load(v) for k, v in d["evals"].items()}
    clean = _load(d["clean_eval"])
    dense = _load(d["dense_eval"]) if d.get("dense_eval") else None
    datasets = d["datasets"]
    mia = {}
    if membership is not None:
        mia[math.inf] = membership["attack"]
        for r in membership["rr"]:
            mia[float(r["epsilon"])] = r

    def ppl(result, ds):
        return result["perplexity"][ds]["ppl"] if ds in result.get("perplexity", {}) else None

    def mia_cells(eps):
        a = mia.get(eps)
        if a is None:
            return ["-", "-", "-"]
        llr = f"{a['llr']['auc']:.3f}" if "llr" in a else "-"
        return [f"{a['auc']:.3f}", llr, num(a["epsilon_lr1"]["epsilon_lb"], 2)]

    first = next(iter(records.values()))
    n_bits = first["bits_per_client"]
    rows = []
    if dense is not None:
        rows.append(["Dense (no pruning)", "-", "-", "-", "-", "-"] + [fmt_ppl(ppl(dense, ds)) for ds in datasets]
                    + ["-", "-", "-"])
    rows.append(["∞ (no noise: the Table 1 global mask)", "0", "0", "-", "0", "0"]
                + [fmt_ppl(ppl(clean, ds)) for ds in datasets] + mia_cells(math.inf))
    for eps in sorted(records, reverse=True):
        rec, ev = records[eps], evals[eps]
        rows.append([f"{eps:g}", f"{rec['flip_probability']:.4f}", f"{rec['flip_probability'] * n_bits:,.0f}",
                     f"{eps * n_bits:.3g}", pct(rec["global_hamming_vs_clean"], 3), num(rec["debiased_count_mae"], 3)]
                    + [fmt_ppl(ppl(ev, ds)) for ds in datasets] + mia_cells(eps))
    win = clean["perplexity"][datasets[0]]
    delta = None
    if sensitivity is not None and sensitivity["blocks"] is None:
        delta = statistics.mean(nb["changed_bits"] for nb in sensitivity["neighbours"])
    mscope = ""
    if membership is not None:
        mscope = _block_scope(membership["blocks"])
    header = provenance(spec["context"], clean.get("model_fingerprint")) + [
        _size_label(spec),
        f"Mechanism (client side): each of the {first['n_clients']} clients flips every bit of its mask "
        "independently with probability q = 1/(1+e^ε) before sending it (randomized response): each single bit "
        f"is ε-locally-DP. A client mask has {n_bits:,} bits, so the whole mask is (n·ε)-DP by composition "
        "(column 'whole-mask ε')"
        + (f"; per sample, one sample changed Δ ≈ {delta:,.0f} bits in privacy_sensitivity, and group privacy "
           "gives only Δ·ε — with Δ measured, not bounded, even that is not a guarantee" if delta else "")
        + ". The per-bit ε is the only ε stated here.",
        f"Server: FedPrLLM, {first['group']} comparison, top-k on the noisy vote counts at {first['sparsity']:.0%}. "
        "Top-k on debiased counts (c − m·q)/(p − q) is the same (increasing affine map; checked on block 0: "
        f"{'identical' if all(r['topk_debiased_equal'] for r in records.values()) else 'DIFFERENT'}); weight "
        "scaling would use the debiased counts, which the global mask files carry as votes. Noisy counts are "
        f"sampled exactly from their distribution ({first['sampling']}); measured flip rate at the smallest ε: "
        f"{records[min(records)]['flip_rate_measured']:.4f} (expected {records[min(records)]['flip_probability']:.4f}).",
        f"Perplexity: {', '.join(DATASET_TITLES.get(ds, ds) for ds in datasets)}, {win['windows']} of "
        f"{win['total_windows']} windows × {win['seqlen']} tokens (the Table 1 evaluation windows).",
        (f"MIA columns: the attacks of privacy_membership (masks of {mscope}, {membership['samples']} samples × "
         f"{membership['seqlen']} tokens) on masks under the same per-bit ε: LiRA's AUC, the AUC of the per-bit "
         "likelihood ratio that knows the noise, and LiRA's ε lower bound (LR = 1). Both are non-adaptive "
         "attacks, so each AUC is a lower bound on the leakage, not a measure of the protection."
         if membership is not None else "MIA columns: not computed."),
    ]
    columns = ["ε per bit", "Flip prob. q", "Flipped bits per client (expected)", "Whole-mask ε (composition)",
               "Global mask vs noise-free (Hamming)", "Debiased count MAE (votes)"] + \
        [f"{DATASET_TITLES.get(ds, ds)} ppl" for ds in datasets] + \
        ["MIA AUC, LiRA (lower bound)", "MIA AUC, noise-aware per-bit LR (lower bound)", "MIA ε lower bound"]
    tables = _write_tables(out_dir, "defence", suffix, "Privacy audit 6: randomized response on mask bits — privacy vs utility", header, columns, rows)
    png = out_dir / f"privacy_defence{suffix}.png"
    _defence_plot(records, evals, clean, dense, datasets, mia, spec, png, first, membership)
    return tables + [png]


def _defence_plot(records, evals, clean, dense, datasets, mia, spec, path, first, membership) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    finite = sorted(records)
    eps_m = sorted(e for e in mia if math.isfinite(e))
    every = sorted(set(finite) | set(eps_m))
    inf_x = max(every + [1.0]) * 4  # where ε = ∞ (no noise) is drawn
    for ds in datasets:
        xs = finite + [inf_x]
        ys = [evals[e]["perplexity"][ds]["ppl"] for e in finite] + [clean["perplexity"][ds]["ppl"]]
        line, = ax.plot(xs, ys, "o-", label=f"{DATASET_TITLES.get(ds, ds)} perplexity")
        if dense is not None and ds in dense.get("perplexity", {}):
            ax.axhline(dense["perplexity"][ds]["ppl"], ls=":", lw=1, color=line.get_color(),
                       label=f"{DATASET_TITLES.get(ds, ds)} dense model")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ε per mask bit (randomized response); right-most point: no noise (ε = ∞)")
    ax.set_ylabel("Perplexity of the global model (log scale)")
    ax.set_xticks(every + [inf_x])
    ax.set_xticklabels([f"{e:g}" for e in every] + ["∞"])
    from matplotlib.ticker import NullLocator, ScalarFormatter

    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="y", which="minor", labelsize=7)
    handles, labels = ax.get_legend_handles_labels()
    if mia:
        ax2 = ax.twinx()
        ax2.plot(eps_m + [inf_x], [mia[e]["auc"] for e in eps_m] + [mia[math.inf]["auc"]], "s--",
                 color="tab:red", label="membership attack AUC (right axis)")
        ax2.set_ylim(0.45, 1.02)
        ax2.set_ylabel("Membership-inference ROC AUC (0.5 = chance)")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=8, loc="center left")
    win = clean["perplexity"][datasets[0]]
    extra = (f"FedPrLLM {first['group']} top-k over {first['n_clients']} clients at {first['sparsity']:.0%}; "
             f"perplexity on {win['windows']} windows × {win['seqlen']} tokens per dataset.")
    if membership is not None:
        scope = _block_scope(membership["blocks"])
        extra += (f" AUC: LiRA on masks of {scope}, {membership['targets']} targets, "
                  f"{membership['samples']} samples × {membership['seqlen']} tokens.")
    fig.text(0.01, 0.01, _caption(spec, clean.get("model_fingerprint", "?"), extra), fontsize=7, wrap=True,
             va="bottom")
    ax.set_title("Privacy–utility: randomized response on shared mask bits")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


# --------------------------------------------------------------------------- secure aggregation


def secagg_table(res: dict, spec: dict, out_dir: Path, suffix: str) -> list[Path]:
    fprs = res["fprs"]
    labels = {"votes": "sum of the m masks (secure aggregation's output; the global file's votes)",
              "global": f"global mask bits only (FedPrLLM {res['server_group']} top-k of the sum)"}
    rows = []
    for c in res["cohorts"]:
        for view in ("votes", "global"):
            a = c[view]
            rows.append([str(c["m"])] + _attack_row(labels[view], a, fprs)[:-1])
    first = res["cohorts"][0]["votes"]
    n_m, n_n = first["n_members"], first["n_nonmembers"]
    header = provenance(spec["context"], res["model_fingerprint"]) + [
        "Secure aggregation (fedlib.server.secagg) shows the server only the sum of the m clients' masks, the same "
        "vote counts a published global mask file carries as its votes tensors; a model pruned with the global "
        "mask shows only its bits. The attack of privacy_membership, rerun on those two views per cohort size m.",
        f"What is observed: {_block_scope(res['blocks'])} ({res['observed_layers']} linears, "
        f"{res['observed_bits']:,} bits); every client's {res['method']} mask ({res['group']}, {res['sparsity']:.0%}) "
        f"comes from {res['samples']} samples of {res['seqlen']} tokens. The target's client is one of the m; the "
        f"other m − 1 are drawn from a pool of {res['pool']} clients, each with {res['samples']} random non-target "
        "C4 windows (one pool reused across targets).",
        f"Game: {res['targets']} targets from a population of {res['population']} C4 windows, one member and one "
        f"non-member observation per target and m ({n_m} members, {n_n} non-members). The attacker knows the "
        f"model, the method and the population: {res['direction_pairs']} shadow pairs per target give the target's "
        f"direction (single masks); {res['fit_pairs']} more, each summed with m − 1 masks of its own pool of "
        f"{res['pool']} clients ({res['draws']} draws), fit the in/out Gaussians of the statistic (variance pooled "
        "over targets). m = 1 is the single-mask attack. A non-adaptive attack: each figure is a lower bound.",
        f"Intervals: AUC 95 % bootstrap; at perfect separation the exact bound "
        f"(fedlib.privacy.membership.separated_auc_bound). TPR 95 % Clopper–Pearson over the {n_m} members; † "
        f"target FPR below 1/{n_n}: the TPR shown is at FPR = 0. ε lower bound: LR = 1 threshold, Clopper–Pearson "
        f"{res['confidence']:.0%}.",
    ]
    columns = ["m (clients summed)", "What the server sees", "AUC [95 % CI]"] + \
        [f"TPR @ {f:g} FPR [95 % CI]" for f in fprs] + ["ε lower bound, LR = 1 threshold"]
    return _write_tables(out_dir, "secagg", suffix,
                         "Privacy audit 7: membership inference against the aggregate (secure aggregation)",
                         header, columns, rows)


# --------------------------------------------------------------------------- entry point


def write_reports(spec: dict) -> list[Path]:
    """Every table (and plot) the spec has results for; returns the written paths."""
    out_dir = Path(spec.get("out_dir", "reports"))
    suffix = spec.get("suffix", "")
    written: list[Path] = []
    similarity = _load(spec["similarity"]) if spec.get("similarity") else None
    membership = _load(spec["membership"]) if spec.get("membership") else None
    sensitivity = _load(spec["sensitivity"]) if spec.get("sensitivity") else None
    if spec.get("entropy"):
        written += entropy_table(_load(spec["entropy"]), spec, out_dir, suffix)
    if similarity is not None:
        written += similarity_table(similarity, spec, out_dir, suffix)
    if sensitivity is not None:
        written += sensitivity_table(sensitivity, spec, out_dir, suffix, similarity)
    if membership is not None:
        written += membership_table(membership, spec, out_dir, suffix)
    if spec.get("inversion"):
        written += inversion_table(_load(spec["inversion"]), spec, out_dir, suffix)
    if spec.get("defence"):
        written += defence_table(spec["defence"], spec, out_dir, suffix, membership, sensitivity)
    if spec.get("secagg"):
        written += secagg_table(_load(spec["secagg"]), spec, out_dir, suffix)
    return written


# --------------------------------------------------------------------------- DP client mechanism


def _game_rows(label: str, games: list[dict], scores: tuple[str, str], extra) -> list[list[str]]:
    """One row per game (seed) and one of the games' scores pooled (LiRA scores are
    log-likelihood ratios, comparable across games); ``extra(game)`` is the last cell."""
    from fedlib.privacy.stages.membership import attack_summary

    rows, positives, negatives, aucs = [], [], [], []
    for res in games:
        a = res["attack"]
        positives += res[scores[0]]
        negatives += res[scores[1]]
        aucs.append(a["auc"])
        rows.append([label, str(res["seed"]), f"{a['n_members']} / {a['n_nonmembers']}"]
                    + _attack_row("", a, res["fprs"])[1:] + [extra(res)])
    last = games[-1]
    pooled = attack_summary(positives, negatives, last["fprs"], last["confidence"], seed=0)
    spread = f" (per-seed AUC mean {np.mean(aucs):.3f}, sd {np.std(aucs, ddof=1):.3f})" if len(aucs) > 1 else ""
    rows.append([label, f"pooled, {len(aucs)} seed{_s(len(aucs))}{spread}", f"{len(positives)} / {len(negatives)}"]
                + _attack_row("", pooled, last["fprs"])[1:] + ["-"])
    return rows


def membership_scale_table(spec: dict) -> list[Path]:
    """``privacy_membership_scale.{md,csv,html}``: the LiRA membership attack of
    privacy_membership on the client's whole mask at the sizes clients use, one game per seed
    and the games pooled per size. ``spec``: {"context", "out_dir", "sizes": [{"samples",
    "seqlen", "results": [membership JSON per seed]}]}."""
    rows, first = [], None
    for size in spec["sizes"]:
        games = []
        for path in size["results"]:
            res = _load(path)
            if (res["samples"], res["seqlen"], res["blocks"]) != (size["samples"], size["seqlen"], None):
                raise ValueError(f"{path}: a game of {res['samples']} x {res['seqlen']} tokens on blocks "
                                 f"{res['blocks']}, expected {size['samples']} x {size['seqlen']} on the whole mask")
            first = first or res
            games.append(res)
        rows += _game_rows(f"{size['samples']} × {size['seqlen']}", games, ("scores_members", "scores_nonmembers"),
                           lambda res: num(res["signal_strength"]["ratio"], 2))
    g = first
    fprs = g["fprs"]
    header = provenance(spec["context"], g["model_fingerprint"]) + [
        "Target privacy_membership_scale (not part of `make run`): the membership attack of privacy_membership "
        f"(LiRA on the direction in which a target moves the mask) against the client's whole {g['method']} mask "
        f"({g['group']}, {g['sparsity']:.0%}; all decoder blocks, {g['observed_layers']} linears, "
        f"{g['observed_bits']:,} bits), with client data sets of the sizes in the first column "
        f"(samples × tokens per sample, {DATASET_TITLES.get(spec.get('dataset'), spec.get('dataset', '?'))} windows).",
        f"Each seed is one game: {g['targets']} targets (one member and one non-member data set each) from a "
        f"population of {g['population']} windows, {g['pairs']} shadow pairs per target "
        f"({g['direction_pairs']} direction, {g['fit_pairs']} fit); the seed draws the data sets and shadows and is "
        "the masks' tie-break seed. 'pooled': every seed's scores together (LiRA scores are log-likelihood ratios, "
        "comparable across games); the targets are the population's first rows in every game, so the seeds vary "
        "the data sets around them, not the target texts.",
        "Intervals as in privacy_membership: AUC 95 % bootstrap, and at perfect separation the exact lower bound "
        "from the disjoint member/non-member pairs; TPR 95 % Clopper–Pearson († FPR below the resolution "
        "1/non-members: the TPR shown is at FPR 0); ε lower bounds (δ = 0) at the a-priori threshold LR = 1 and "
        "at a threshold chosen on half of the scores. Few targets per game cap the ε bound any attack could show.",
        "Hamming ratio: the paper's 'signal strength' (mask of R + target vs R + other, over masks of different "
        "data sets).",
    ]
    columns = ["Client data (samples × tokens)", "Seed", "Members / non-members"] + _attack_columns(fprs) + \
        ["Target / natural Hamming"]
    return _write_tables(Path(spec["out_dir"]), "membership_scale", "",
                         "Membership inference against a client's whole mask at realistic sizes, per seed",
                         header, columns, rows)


def membership_shared_table(spec: dict) -> list[Path]:
    """``privacy_membership_shared.{md,csv,html}``: the shared-shadow membership game
    (:mod:`fedlib.privacy.stages.membership_shared`) per size and seed, and the seeds pooled per
    size. ``spec``: {"context", "out_dir", "dataset", "sizes": [{"samples", "seqlen", "population",
    "shadows", "clients", "results": [membership-shared JSON per seed]}]}."""
    from fedlib.privacy.stages.membership import attack_summary
    from fedlib.privacy.stages.membership_shared import pair_summary

    keys = ("samples", "seqlen", "population", "shadows", "clients")
    rows, first = [], None

    def row(label, seed, masks, pairs, attack, effect):
        by_fpr = {e["target_fpr"]: e for e in pairs["tpr_at_fpr"]}
        return [label, seed, masks, f"{pairs['n_members']} / {pairs['n_nonmembers']}",
                f"{pairs['auc']:.3f} {_ci(*pairs['auc_ci'], fmt=lambda x: f'{x:.3f}')}"] + \
            [f"{pct(by_fpr[f]['tpr'], 1)} {_ci(*by_fpr[f]['tpr_ci'], fmt=lambda x: pct(x, 1))}"
             f"{'' if by_fpr[f]['resolvable'] else ' †'}" for f in fprs] + \
            [f"{attack['n_members']} / {attack['n_nonmembers']}" if attack else "-",
             _eps_cell(attack["epsilon_lr1"]) if attack else "-", _eps_cell(attack["epsilon_split"]) if attack else "-",
             effect]

    for size in spec["sizes"]:
        games = []
        for path in size["results"]:
            res = _load(path)
            found, expected = {k: res[k] for k in keys}, {k: size[k] for k in keys}
            if found != expected:
                raise ValueError(f"{path}: a game of {found}, the table expects {expected}")
            games.append(res)
        first = first or games[0]
        fprs = first["fprs"]
        label = f"{size['samples']} × {size['seqlen']}"
        masks = f"{size['shadows']} / {size['clients']} (of {size['population']})"
        scores, labels, designated, member = [], [], [], []
        for res in games:
            rows.append(row(label, str(res["seed"]), masks, res["pairs"], res["attack"],
                            num(res["effect_size"]["mean"], 2)))
            s, lab = np.asarray(res["scores"]), np.asarray(res["client_labels"], dtype=bool)
            scores.append(s)
            labels.append(lab)
            designated += s[np.arange(s.shape[0]), res["designated"]].tolist()
            member += res["designated_member"]
        if len(games) > 1:
            d, m = np.asarray(designated), np.asarray(member, dtype=bool)
            pooled_attack = attack_summary(d[m], d[~m], fprs, first["confidence"]) if m.any() and (~m).any() else None
            effects = [g["effect_size"]["mean"] for g in games if g["effect_size"]["mean"] is not None]
            spread = f"{np.mean(effects):.2f} (sd {np.std(effects, ddof=1):.2f})" if len(effects) > 1 else "-"
            rows.append(row(label, f"pooled, {len(games)} seeds", f"{len(games)} × {masks}",
                            pair_summary(np.concatenate(scores), np.concatenate(labels), fprs, first["confidence"]),
                            pooled_attack, spread))
    g = first
    fprs = g["fprs"]
    dataset = DATASET_TITLES.get(spec.get("dataset"), spec.get("dataset", "?"))
    header = provenance(spec["context"], g["model_fingerprint"]) + [
        "Target privacy_membership_shared (not part of `make run`): membership inference against the client's whole "
        f"{g['method']} mask ({g['group']}, {g['sparsity']:.0%}; all decoder blocks, {g['observed_layers']} linears) "
        f"at the client sizes of the first column (samples × tokens per sample, {dataset} windows), with shadow masks "
        "shared by every target (fedlib.privacy.stages.membership_shared).",
        "Game, one per size and seed: a population of N windows (third column); the attacker computes the shadow "
        "masks of random partitions of the population into data sets (every window in as many); the client computes "
        "the client masks, each with a designated target that a fair coin puts in its data set or not (the other "
        "windows at random). Every window is a target of every client mask. The seed draws the data sets and is "
        "the masks' tie-break seed. 'pooled': every seed's masks together (scores are log-likelihood ratios).",
        "Attack (model-based LiRA): the attacker computes each window's per-channel sum of squared inputs to every "
        "linear through the recursion of the population's own mask, x_j = its ratio to the population mean minus 1, "
        "and scores a mask by the sum over columns of x_j times the fraction of rows keeping column j; per target, "
        "Gaussians fitted on the shadows with and without it (variance pooled over targets); score = log-likelihood "
        "ratio. A non-adaptive attack: each figure is a lower bound on the leakage.",
        "Pairs: every (client mask, window) pair; their AUC and TPR intervals are 95 % bootstraps over client masks "
        "(pairs of one mask are dependent, masks are independent given the shadows); at perfect separation the "
        "AUC's lower end is the exact bound over one member/non-member pair per mask. † the target FPR is below "
        "1/non-members: the TPR shown is at FPR 0. Designated trials: one independent trial per client mask; the ε "
        "lower bounds (δ = 0, Clopper–Pearson 95 %) use only them, at the a-priori threshold LR = 1 and at a "
        "threshold chosen on half of them, so few client masks cap the ε any attack could show here.",
        "Effect size: per target, (mean statistic on shadows with it − mean without) / pooled sd, averaged over "
        "the targets.",
    ]
    columns = ["Client data (samples × tokens)", "Seed", "Shadow / client masks (population)",
               "Pairs: members / non-members", "AUC, pairs [95 % CI]"] + \
        [f"TPR @ {f:g} FPR, pairs [95 % CI]" for f in fprs] + \
        ["Designated trials: members / non-members", "ε lower bound, LR = 1 threshold",
         "ε lower bound, split threshold", "Effect size (sd)"]
    return _write_tables(Path(spec["out_dir"]), "membership_shared", "",
                         "Membership inference against a client's whole mask, shadows shared by every target",
                         header, columns, rows)


def attribute_table(spec: dict) -> list[Path]:
    """``privacy_attribute.{md,csv,html}``: attribute inference (:mod:`fedlib.privacy.stages.attribute`)
    per property, one game per seed and the games pooled. ``spec``: {"context", "out_dir", "dataset",
    "properties": [{"label", "results": [attribute JSON per seed]}]}."""
    if not spec["properties"]:
        raise ValueError("privacy.attribute names no property (domain null, no terms): no game to report")
    rows, first = [], None
    for prop in spec["properties"]:
        games = [_load(path) for path in prop["results"]]
        first = first or games[0]
        for path, res in zip(prop["results"], games):
            sizes = {k: res[k] for k in ("samples", "seqlen", "blocks", "trials", "pairs")}
            expected = {k: first[k] for k in sizes}
            if sizes != expected:
                raise ValueError(f"{path}: a game of {sizes}, the table's first game has {expected}")
        rows += _game_rows(prop["label"], games, ("scores_with", "scores_without"),
                           lambda res: f"{pct(res['pair_hamming'])} ({res['attacker_rows']['with']} + "
                                       f"{res['client_rows']['with']} / {res['attacker_rows']['without']} + "
                                       f"{res['client_rows']['without']})")
    g = first
    fprs = g["fprs"]
    dataset = DATASET_TITLES.get(spec.get("dataset"), spec.get("dataset", "?"))
    header = provenance(spec["context"], g["model_fingerprint"]) + [
        "Target privacy_attribute (not part of `make run`): attribute inference against the client's "
        f"{g['method']} mask ({g['group']}, {g['sparsity']:.0%}; {_block_scope(g['blocks'])}, {g['observed_layers']} "
        f"linears, {g['observed_bits']:,} bits). Does the client's data set of {g['samples']} × {g['seqlen']} "
        f"tokens hold a window with the property: a window of another domain among {dataset} windows, or a "
        f"{dataset} window containing the term (whole word, any case)?",
        f"Each seed is one game of {g['trials']} client data sets with the property ({g['samples'] - 1} window{_s(g['samples'] - 1)} "
        f"without it + one with it) and {g['trials']} without ({g['samples']} windows without it). Windows of both "
        "kinds are split at random into the attacker's half and the client's half: the attacker knows the model, "
        f"the method and its own windows of both kinds, never the client's. It computes {g['pairs']} shadow pairs "
        f"R + a / R + b (R: {g['samples'] - 1} window{_s(g['samples'] - 1)} without the property, a one with it, b one more without): "
        f"{g['direction_pairs']} give the direction mean(with) − mean(without), {g['fit_pairs']} the Gaussians of "
        "the statistic <direction, mask>; score = log-likelihood ratio. The seed draws the halves, data sets and "
        "shadows and is the masks' tie-break seed; 'pooled': every seed's scores together.",
        "Intervals as in privacy_membership: AUC 95 % bootstrap (exact lower bound at perfect separation); TPR "
        "95 % Clopper–Pearson († FPR below the resolution 1/data sets without the property: the TPR shown is at "
        "FPR 0). The two data sets of a trial differ in one window, so the ε lower bounds (δ = 0; a-priori "
        "threshold LR = 1, and a threshold chosen on half of the scores) bound the sample-level ε of the mask; "
        "a non-adaptive attack with few shadows: the AUCs are lower bounds on what an attacker can reach.",
        "Pair Hamming: mean fraction of mask bits that differ between a shadow pair's R + a and R + b; in "
        "brackets the windows with the property (attacker + client) / without (attacker + client).",
    ]
    columns = ["Property", "Seed", "With / without"] + _attack_columns(fprs) + ["Pair Hamming (windows)"]
    return _write_tables(Path(spec["out_dir"]), "attribute", "",
                         "Attribute inference against a client's mask: a domain or a term in its data, per seed",
                         header, columns, rows)


def _mean_cell(values) -> str:
    """Mean over clients with its 95 % t interval (the mean alone for one client)."""
    from fedlib.stats import t_interval

    if len(values) < 2:
        return pct(values[0], 1)
    mean, lo, hi = t_interval(values)
    return f"{pct(mean, 1)} {_ci(max(lo, 0.0), min(hi, 1.0), lambda x: pct(x, 1))}"  # a mean rate lies in [0, 1]


#: the bag an inversion-client result scores: the gradient stage's, and after the moves
STAGES = ("gradient_bag_overlap", "bag_overlap")


def inversion_client_table(spec: dict) -> list[Path]:
    """``privacy_inversion_client.{md,csv,html}``: the server inverts clients' uploaded block-0 q/k/v
    masks to the bag of all their calibration tokens (:func:`fedlib.privacy.stages.inversion.client_inversion`),
    per client and as the mean over clients. ``spec``: {"context", "out_dir", "priors": {name: label},
    "results": [inversion-client JSON per client]}."""
    results = [_load(path) for path in spec["results"]]
    if not results:
        raise ValueError("privacy.inversion_client names no client: nothing to report")
    first = results[0]
    same = ("layers", "sparsity", "group", "seed", "steps", "refine_moves", "candidates", "init_prior")
    for path, res in zip(spec["results"], results):
        if sorted(res["unigram_bag_overlap"]) != sorted(spec["priors"]):
            raise ValueError(f"{path}: priors {sorted(res['unigram_bag_overlap'])}, the table has "
                             f"{sorted(spec['priors'])}")
        differ = {k: (res[k], first[k]) for k in same if res[k] != first[k]}
        if differ:
            raise ValueError(f"{path}: {differ} (this file's, the first file's): one table is one attack")
    priors = list(spec["priors"])
    init = first["init_prior"]
    rows = []
    for res in results:
        upload = "yes" if all(res["upload_is_bag_mask"].values()) else "NO: " + ", ".join(
            n.rsplit(".", 1)[-1] for n, same_mask in res["upload_is_bag_mask"].items() if not same_mask)
        rows.append([res["client_id"], f"{res['tokens']:,} ({res['distinct_tokens']:,})", upload,
                     pct(res["gradient_bag_overlap"], 1), f"{pct(res['bag_overlap'], 1)} ({res['moves']})",
                     *[pct(res["unigram_bag_overlap"][p], 1) for p in priors],
                     *[f"{100 * (res[key] - res['unigram_bag_overlap'][init]):+.1f} pp" for key in STAGES],
                     f"{pct(res['mask_agreement'], 3)} / {pct(res['baseline_agreement'], 3)}"])
    if len(results) > 1:
        from fedlib.stats import t_interval

        gains = []
        for key in STAGES:
            mean, lo, hi = t_interval([r[key] - r["unigram_bag_overlap"][init] for r in results])
            gains.append(f"{100 * mean:+.1f} pp [{100 * lo:+.1f}, {100 * hi:+.1f}]")
        rows.append([f"mean of {len(results)} clients [95 % t interval]", "", "",
                     _mean_cell([r["gradient_bag_overlap"] for r in results]),
                     _mean_cell([r["bag_overlap"] for r in results]),
                     *[_mean_cell([r["unigram_bag_overlap"][p] for r in results]) for p in priors], *gains,
                     f"{pct(statistics.mean(r['mask_agreement'] for r in results), 3)} / "
                     f"{pct(statistics.mean(r['baseline_agreement'] for r in results), 3)}"])
    layers = ", ".join(n.rsplit(".", 1)[-1] for n in first["layers"])
    header = provenance(spec["context"], first["model_fingerprint"]) + [
        "Target privacy_inversion_client (not part of `make run`): an honest-but-curious server inverts each "
        f"client's uploaded mask file (Wanda, {first['group']}, {first['sparsity']:.0%}; the layers {layers} of "
        f"decoder block 0) back to its whole calibration set: {first['samples']} × {first['seqlen']} = "
        f"{first['tokens']:,} tokens per client, clients of the setting above.",
        "The server knows the public model, the settings in the file's header and T; the input of block 0's q/k/v "
        "is each token's normalised embedding, before any position enters, so the mask is a function of the bag of "
        "T tokens only. 'Upload = bag masks' checks that on the real files: the Wanda masks of the shard's tokens "
        "taken as one bag equal the uploaded ones, bit for bit.",
        f"Attack (fedlib.privacy.inversion): histogram relaxation started at the '{spec['priors'][init]}' unigram "
        f"prior, {first['steps']} Adam steps on the relaxed masks of the three layers, rounded to T tokens ('gradient "
        f"stage'); then at most {first['refine_moves']} exact one-count moves between the bag and the "
        f"{first['candidates']:,} tokens of highest soft probability, each chosen among the moves the relaxed loss "
        "ranks best and kept only if it raises the exact mask agreement (in brackets: the moves kept).",
        "Bag recovery = multiset overlap / T. Unigram guess: the bag of T tokens a public unigram distribution "
        "predicts (rounded T·p), i.e. what the server guesses without the mask; the attack's gain is over the guess "
        "of the prior it starts from. Mask agreement: 1 − Hamming of the decoded bag's masks against the upload / "
        "of T random tokens. The mean row's intervals are 95 % t intervals over the clients (each client's "
        "data is independent), cut to [0, 1] for rates.",
    ]
    columns = ["Client", "T tokens (distinct)", "Upload = bag masks", "Bag recovered: gradient stage",
               "Bag recovered: after the moves (moves)",
               *[f"Unigram guess: {spec['priors'][p]}" for p in priors],
               *[f"Attack − unigram guess ({spec['priors'][init]}): {stage}" for stage in ("gradient stage", "after the moves")],
               "Mask agreement: attack / random tokens"]
    return _write_tables(Path(spec["out_dir"]), "inversion_client", "",
                         "Inverting clients' uploaded masks to their whole calibration sets", header, columns, rows)


def dp_table(spec: dict) -> list[Path]:
    """``privacy_dp<suffix>.{md,csv,html}``: per privacy setting of the DP client mechanism
    (:mod:`fedlib.privacy.dp`) the proven ε (the clients' mask files), the ε lower bound the
    membership attack audits on DP masks of the same mechanism, whether it stays below the
    proven one, and the perplexity of the FedPrLLM global model of the DP clients. ``spec``:
    {"context", "out_dir", "suffix", "datasets", "settings": {ε: {"client_mask", "eval",
    "membership"}}} (ε "inf": the same clients without DP)."""
    from fedlib.maskfile import read_header

    rows, first_eval, first_mia = [], None, None
    for eps in sorted(spec["settings"], key=_eps_key, reverse=True):
        files = spec["settings"][eps]
        header = read_header(Path(files["client_mask"]))
        ev, mia = _load(files["eval"]), _load(files["membership"])
        first_eval, first_mia = first_eval or ev, first_mia or mia
        dp = json.loads(header.extra["dp"]) if "dp" in header.extra else None
        attack = mia["attack"]
        audited = [attack["epsilon_lr1"].get("epsilon_lb"), attack["epsilon_split"].get("epsilon_lb")]
        known = [a for a in audited if a is not None]
        proven = dp["epsilon"] if dp else math.inf
        if dp and mia.get("dp", {}).get("epsilon") != dp["epsilon"]:
            raise ValueError(f"{files['membership']}: audits ε={mia.get('dp', {}).get('epsilon')}, the mask files "
                             f"prove ε={dp['epsilon']}")
        rows.append([
            f"{proven:g}" if dp else "∞ (no DP)", f"{dp['delta']:g}" if dp else "-", f"{dp['clip']:g}" if dp else "-",
            f"{dp['sigma']:.4g}" if dp else "0", str(dp["releases"]) if dp else "-",
            num(audited[0], 2), num(audited[1], 2), f"{attack['auc']:.3f}",
            ("yes" if max(known, default=0.0) <= proven else "NO") if dp else "-",
        ] + [fmt_ppl(ev["perplexity"][ds]["ppl"]) for ds in spec["datasets"]])
    win = first_eval["perplexity"][spec["datasets"][0]]
    n_clients = first_eval["applied"].get("n_clients") if isinstance(first_eval.get("applied"), dict) else None
    header_lines = provenance(spec["context"], first_eval.get("model_fingerprint")) + [
        "Mechanism (fedlib.privacy.dp): every client clips each calibration sample's per-channel squared-norm "
        "vector to L2 norm `clip`, sums, adds Gaussian noise (std σ·√2·clip) to every distinct linear input's "
        "statistic in every block, then prunes with Wanda as usual. Sample-level DP, replace-one neighbours; "
        "σ calibrated to (ε, δ) over all releases by dp-accounting's PLD accountant.",
        f"Utility: FedPrLLM global mask (layer comparison, top-k of the votes) of {spec.get('clients', n_clients)} "
        f"DP clients × {spec.get('samples_per_client', '?')} samples × {spec.get('seqlen', '?')} tokens; "
        f"perplexity on {win['windows']} of {win['total_windows']} windows × {win['seqlen']} tokens.",
        f"Audit: the LiRA membership attack of privacy_membership on the DP client's masks of "
        f"{_block_scope(first_mia['blocks'])} ({first_mia['targets']} targets, {first_mia['samples']} samples × "
        f"{first_mia['seqlen']} tokens, {first_mia.get('pairs', '?')} shadow pairs each), each mask with its own "
        "noise; its ε lower bounds at the mechanism's δ (LR = 1 threshold; split threshold) must not exceed the "
        "proven ε (column 'audit ≤ proven'). The proven ε there is the accountant's over those blocks' releases.",
    ]
    columns = ["proven ε", "δ", "clip", "σ (noise multiplier)", "releases", "audited ε LB (LR=1)",
               "audited ε LB (split)", "MIA AUC", "audit ≤ proven"] + \
        [f"{DATASET_TITLES.get(ds, ds)} ppl" for ds in spec["datasets"]]
    tables = _write_tables(Path(spec["out_dir"]), "dp", spec.get("suffix", ""),
                           "DP client masks (sample-level, Gaussian, PLD-accounted) — proven vs audited ε, and utility",
                           header_lines, columns, rows)
    return tables + (dp_utility_table(spec) if "utility" in spec else [])


def dp_utility_table(spec: dict) -> list[Path]:
    """``privacy_dp_utility<suffix>.{md,csv,html,png}``: perplexity against the proven
    sample-level ε, per DP federation (the setting's clients, and clients with more samples),
    beside the ε = 0 model pruned on public text alone and randomized response on mask bits
    (privacy_defence), whose whole-mask ε is the bits per client times the per-bit ε.
    ``spec["utility"]``: {"federations": [{"clients", "samples", "data", "settings": {ε:
    {"client_mask", "eval"}}}], "public": {"eval", "text", "mask"}, "randomized_response":
    {"records", "evals", "clients"}, "dense_eval"}."""
    from fedlib.maskfile import read_header

    u, datasets, seqlen = spec["utility"], spec["datasets"], spec["seqlen"]
    ds = datasets[0]

    def ppl(result):
        return result["perplexity"][ds]["ppl"]

    dense = _load(u["dense_eval"])
    public = _load(u["public"]["eval"])
    public_header = read_header(Path(u["public"]["mask"]))
    rows = [["Dense (no pruning)", "-", "-", "-", fmt_ppl(ppl(dense)), "-"]]
    curves = []  # (label, [(ε, ppl)]) for the plot
    for fed in u["federations"]:
        size = f"{fed['clients']} × {fed['samples']} × {seqlen} ({fed['data']})"
        points, plain = [], None
        for eps in sorted(fed["settings"], key=_eps_key, reverse=True):
            files = fed["settings"][eps]
            header = read_header(Path(files["client_mask"]))
            dp = json.loads(header.extra["dp"]) if "dp" in header.extra else None
            if (dp is None) != (_eps_key(eps) == math.inf) or (dp and dp["epsilon"] != _eps_key(eps)):
                raise ValueError(f"{files['client_mask']}: the mask file proves ε={dp and dp['epsilon']}, "
                                 f"the table expects ε={eps}")
            value = ppl(_load(files["eval"]))
            plain = value if dp is None else plain
            points.append((_eps_key(eps), value))
            rows.append(["Gaussian DP on Wanda's statistics" if dp else "no DP", size,
                         f"{dp['epsilon']:g}" if dp else "∞", f"{dp['sigma']:.4g}" if dp else "0",
                         fmt_ppl(value), f"{value / plain:.3g}×"])
        curves.append((f"{fed['clients']} clients × {fed['samples']} samples", points))
    rows.append([f"Wanda on public text only ({public_header.n_samples} windows, calibration documents)",
                 "no private data", "0", "-", fmt_ppl(ppl(public)), "-"])
    rr = u["randomized_response"]
    rr_points = []
    for eps in sorted(rr["records"], key=_eps_key, reverse=True):
        record, value = _load(rr["records"][eps]), ppl(_load(rr["evals"][eps]))
        whole = _eps_key(eps) * record["bits_per_client"]
        rr_points.append((whole, value))
        rows.append([f"Randomized response, per-bit ε = {_eps_key(eps):g} (privacy_defence)",
                     f"{record['n_clients']} × {spec['samples_per_client']} × {seqlen} (the setting)",
                     f"{whole:.3g} (bits per client × per-bit ε)", "-", fmt_ppl(value), "-"])
    win = dense["perplexity"][ds]
    header_lines = provenance(spec["context"], dense.get("model_fingerprint")) + [
        "Privacy–utility of the sample-level DP client mechanism (fedlib.privacy.dp, as in privacy_dp): per DP "
        "federation (clients × samples per client × tokens), the FedPrLLM global model (layer comparison, top-k "
        f"of the votes) at each proven ε (δ = {spec['delta']:g}, clip {spec['clip']:g}; σ calibrated over every "
        "block's releases).",
        "The noise is the same per statistic whatever the data set's size, while the clipped signal grows with "
        "the number of samples: larger clients lose less at the same ε.",
        "ε = 0 baseline: the server prunes with Wanda on public text alone (a draw of its own from the calibration "
        "documents, disjoint from the evaluation documents, which may share documents with the clients' draws; as "
        "many windows as the largest federation's private data). A DP mechanism is worth its noise only where it "
        "beats this row.",
        "Randomized response flips each uploaded mask bit (privacy_defence, the setting's clients): its per-bit ε "
        "composes to the ε shown over a client's whole mask, the only sample-level guarantee it gives.",
        f"Perplexity: {DATASET_TITLES.get(ds, ds)}, {win['windows']} of {win['total_windows']} windows × "
        f"{win['seqlen']} tokens (the Table 1 evaluation windows); last column: against the same federation "
        "without DP.",
    ]
    columns = ["Mechanism", "Clients × samples × tokens", "Proven sample-level ε", "σ (noise multiplier)",
               f"{DATASET_TITLES.get(ds, ds)} ppl", "ppl / no DP"]
    out_dir, suffix = Path(spec["out_dir"]), spec.get("suffix", "")
    tables = _write_tables(out_dir, "dp_utility", suffix, "DP client masks: perplexity against the proven ε",
                           header_lines, columns, rows)
    png = out_dir / f"privacy_dp_utility{suffix}.png"
    _dp_utility_plot(curves, ppl(public), rr_points, dense, spec, png,
                     f"FedPrLLM layer top-k at {public_header.sparsity:.0%}; {DATASET_TITLES.get(ds, ds)} perplexity "
                     f"on {win['windows']} windows × {win['seqlen']} tokens; δ = {spec['delta']:g}.")
    return tables + [png]


def _dp_utility_plot(curves, public, rr_points, dense_eval, spec, path, extra) -> None:
    from matplotlib.ticker import NullLocator

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    finite = sorted({e for _, pts in curves for e, _ in pts if math.isfinite(e)} | {e for e, _ in rr_points})
    inf_x = max(finite + [1.0]) * 10  # where ε = ∞ (no DP) is drawn
    for label, pts in curves:
        pts = sorted(pts)
        ax.plot([inf_x if math.isinf(e) else e for e, _ in pts], [v for _, v in pts], "o-",
                label=f"Gaussian DP, {label}")
    if rr_points:
        ax.plot(*zip(*sorted(rr_points)), "s--", color="tab:red", label="randomized response on mask bits")
    ax.axhline(public, ls="--", lw=1, color="tab:green", label="ε = 0: Wanda on public text only")
    ax.axhline(dense_eval["perplexity"][spec["datasets"][0]]["ppl"], ls=":", lw=1, color="black", label="dense model")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(finite + [inf_x])
    ax.set_xticklabels([f"{e:.3g}" for e in finite] + ["∞"], fontsize=7)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("Proven sample-level ε (replace-one); right-most point: no DP")
    ax.set_ylabel("Perplexity of the global model (log scale)")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("Privacy–utility of DP client masks")
    fig.text(0.01, 0.01, _caption(spec, dense_eval.get("model_fingerprint", "?"), extra), fontsize=7, wrap=True,
             va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
