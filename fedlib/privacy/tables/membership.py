"""The membership analysis's table and ROC plot: LiRA on shadow masks, also under randomized response;
AUC, TPR at low FPR and the ε lower bounds with the game's ceiling."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlib.privacy.tables.common import (
    _attack_columns,
    _attack_row,
    _block_scope,
    _caption,
    num,
    pct,
    _plt,
    _save_png,
    provenance,
    _s,
    _size_label,
    _where,
    _write_tables,
)


def membership_table(res: dict, spec: dict, out_dir: Path, suffix: str) -> list[Path]:
    from fedlib.privacy.membership import audit_ceilings, separated_auc_bound

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
    ceilings = audit_ceilings(n_m, n_n, res["confidence"])
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
        f"largest bound any attack could show is {ceilings['lr1']:.2f} (LR = 1) and {ceilings['split']:.2f} "
        "(split): more targets raise the ceiling (each cell's 'ceiling', fedlib.privacy.membership.epsilon_ceiling).",
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
    _save_png(fig, path)


def write(spec: dict, results: dict) -> list[Path]:
    """Its tables in the bundled report (:func:`fedlib.privacy.audit_report.write_reports`): none
    without its result."""
    if not results.get("membership"):
        return []
    return membership_table(results["membership"], spec, *_where(spec))
