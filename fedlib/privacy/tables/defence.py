"""The defence analysis's table and plot: randomized response on mask bits, FedPrLLM top-k on the noisy
votes; perplexity against the per-bit ε, with the membership attacks' figures at each ε."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from fedlib.privacy.tables.common import (
    _block_scope,
    _caption,
    _ceiling,
    _eps_key,
    _load,
    num,
    pct,
    _plt,
    _save_png,
    provenance,
    _size_label,
    _where,
    _write_tables,
)
from fedlib.report import DATASET_TITLES, fmt_ppl


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
        lr1 = a["epsilon_lr1"]
        return [f"{a['auc']:.3f}", llr, f"{num(lr1['epsilon_lb'], 2)} (ceiling {_ceiling(lr1):.2f})"]

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
    _save_png(fig, path)


def write(spec: dict, results: dict) -> list[Path]:
    """Its tables in the bundled report (:func:`fedlib.privacy.audit_report.write_reports`): none
    without its result."""
    if not results.get("defence"):
        return []
    return defence_table(results["defence"], spec, *_where(spec), results.get("membership"),
                         results.get("sensitivity"))
