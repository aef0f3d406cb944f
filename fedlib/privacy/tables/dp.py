"""The dp analysis's tables: the DP client mechanism's proven against audited ε (with each audit's
ceiling), and its privacy-utility table and plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fedlib.privacy.tables.common import (
    _block_scope,
    _caption,
    _ceiling,
    _eps_key,
    _load,
    num,
    _plt,
    _save_png,
    provenance,
    _write_tables,
)
from fedlib.report import DATASET_TITLES, fmt_ppl


def dp_table(spec: dict) -> list[Path]:
    """``privacy_dp<suffix>.{md,csv,html}``: per privacy setting of the DP client mechanism
    (:mod:`fedlib.dp.gaussian`) the proven ε (the clients' mask files), the ε lower bound the
    membership attack audits on DP masks of the same mechanism, whether it stays below the
    proven one, and the perplexity of the FedPrLLM global model of the DP clients. ``spec``:
    {"context", "out_dir", "suffix", "datasets", "settings": {ε: {"client_mask", "eval",
    "membership"}}} (ε "inf": the same clients without DP)."""
    from fedlib.maskfile import read_header

    rows, first_eval, first_mia, guarantees = [], None, None, []
    for eps in sorted(spec["settings"], key=_eps_key, reverse=True):
        files = spec["settings"][eps]
        header = read_header(Path(files["client_mask"]))
        ev, mia = _load(files["eval"]), _load(files["membership"])
        first_eval, first_mia = first_eval or ev, first_mia or mia
        dp = json.loads(header.extra["dp"]) if "dp" in header.extra else None
        guarantees += [dp] if dp else []
        attack = mia["attack"]
        audited = [attack["epsilon_lr1"].get("epsilon_lb"), attack["epsilon_split"].get("epsilon_lb")]
        known = [a for a in audited if a is not None]
        proven = dp["epsilon"] if dp else math.inf
        if dp and mia.get("dp", {}).get("epsilon") != dp["epsilon"]:
            raise ValueError(f"{files['membership']}: audits ε={mia.get('dp', {}).get('epsilon')}, the mask files "
                             f"prove ε={dp['epsilon']}")
        ceilings = [_ceiling(attack[k]) if attack[k].get("epsilon_lb") is not None else None
                    for k in ("epsilon_lr1", "epsilon_split")]
        rows.append([
            f"{proven:g}" if dp else "∞ (no DP)", f"{dp['delta']:g}" if dp else "-", f"{dp['clip']:g}" if dp else "-",
            f"{dp['sigma']:.4g}" if dp else "0", str(dp["releases"]) if dp else "-",
            num(audited[0], 2), num(audited[1], 2), " / ".join(num(c, 2) for c in ceilings), f"{attack['auc']:.3f}",
            ("yes" if max(known, default=0.0) <= proven else "NO") if dp else "-",
            ("yes" if max(c for c in ceilings if c is not None) > proven else "no") if dp else "-",
        ] + [fmt_ppl(ev["perplexity"][ds]["ppl"]) for ds in spec["datasets"]])
    win = first_eval["perplexity"][spec["datasets"][0]]
    n_clients = first_eval["applied"].get("n_clients") if isinstance(first_eval.get("applied"), dict) else None
    header_lines = provenance(spec["context"], first_eval.get("model_fingerprint")) + [
        "Mechanism (fedlib.dp.gaussian): every client clips each calibration sample's per-channel squared-norm "
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
        *([guarantee_line(guarantees)] if guarantees else []),
        "Ceiling: the largest bound any attack, however strong, could show with the audit's counts "
        "(fedlib.privacy.membership.epsilon_ceiling: a perfect attack's TPR = 1, FPR = 0 under the same "
        "Clopper–Pearson construction). Where it is below the proven ε ('audit can fail': no), 'audit ≤ proven' "
        "holds for any mechanism, broken or not, and says nothing about this one.",
    ]
    columns = ["proven ε", "δ", "clip", "σ (noise multiplier)", "releases", "audited ε LB (LR=1)",
               "audited ε LB (split)", "ceiling (LR=1 / split)", "MIA AUC", "audit ≤ proven",
               "audit can fail (ceiling > proven)"] + \
        [f"{DATASET_TITLES.get(ds, ds)} ppl" for ds in spec["datasets"]]
    tables = _write_tables(Path(spec["out_dir"]), "dp", spec.get("suffix", ""),
                           "DP client masks (sample-level, Gaussian, PLD-accounted) — proven vs audited ε, and utility",
                           header_lines, columns, rows)
    tables += release_audit_table(spec, first_eval.get("model_fingerprint")) if "release_audit" in spec else []
    return tables + (dp_utility_table(spec) if "utility" in spec else [])


def _unit(header: dict) -> str:
    from fedlib.dp.unit import WINDOW

    kind, k = header.get("unit", WINDOW), int(header.get("windows_per_unit", 1))
    if kind == WINDOW:
        return ("one calibration window (the audit's unit: windows drawn at random offsets overlap, so it protects "
                "no sentence, document or span; fedlib.dp.unit)")
    return f"one {kind} (at most {k} window{'' if k == 1 else 's'} each)"


def guarantee_line(headers: list[dict]) -> str:
    """What the DP rows' mask files record (their ``x_dp``): the protected unit, where the noise
    came from (seeded: "simulation: not private") and the trust model their ε holds under."""
    from fedlib.dp.accountant import trust_model
    from fedlib.dp.samplers import SEEDED, SIMULATION_LABEL

    units = sorted({_unit(h) for h in headers})
    seeded = any(h.get("noise") == SEEDED for h in headers)
    noise = (f"seeded ({SIMULATION_LABEL}: the table's clients seed their noise so that it repeats, and anyone "
             "can regenerate it; a site's `fedlib client-mask` draws it from the OS's cryptographic source)"
             if seeded else "secret (the OS's cryptographic source)")
    dropout = {trust_model(h)["one_dropout"] == h["epsilon"] for h in headers}
    trust = ("a client's own noise protects its mask: a client dropping out or a coordinator colluding with other "
             "clients leaves its ε unchanged" if dropout == {True} else "see fedlib.dp.accountant.trust_model")
    return (f"Guarantee as the DP mask files record it (x_dp): protected unit {', '.join(units)}, replace-one "
            f"neighbours; noise {noise}. Trust model: honest-but-curious coordinator, all clients honest; {trust} "
            "(fedlib.dp.accountant.trust_model).")


#: the release audit's mechanisms as its table names them
RELEASE_MECHANISMS = {"honest": "honest client (fedlib.dp.gaussian)",
                      "understated": "control: sensitivity understated {factor:g}×",
                      "no-noise": "control: sampler adds no noise"}


def release_audit_table(spec: dict, fingerprint: str | None) -> list[Path]:
    """``privacy_dp_release<suffix>.{md,csv,html}``: the white-box audit of one release of the DP
    client mechanism (:mod:`fedlib.privacy.stages.dp_release`) and of its two positive controls,
    per claimed ε: the exact ε of the audited release, the audited lower bound, the game's
    ceiling, and the verdict (:func:`fedlib.privacy.stages.dp_release.release_audit_with_controls`)."""
    record = _load(spec["release_audit"])
    rows = []
    for row in record["rows"]:
        audit, guarantee = row["audit"], json.loads(row["guarantee"])
        rows.append([
            f"{row['claimed']['epsilon']:g}", RELEASE_MECHANISMS[row["mechanism"]].format(factor=record["factor"]),
            f"{guarantee['sigma']:.4g}", f"{row['noise_std']:.4g}", f"{row['shift']:.4g}",
            "∞" if row["pair_epsilon"] is None else f"{row['pair_epsilon']:.3g}",
            f"{audit['epsilon_lb']:.2f}", f"{row['ceiling']:.2f}",
            f"TP {audit['tp']}, FN {audit['fn']}, FP {audit['fp']}, TN {audit['tn']}", row["verdict"],
        ])
    header_lines = provenance(spec["context"], fingerprint) + [
        f"What is audited: one of the mechanism's releases, the noisy sum of the clipped per-sample statistics of "
        f"decoder block 0's attention input, drawn {record['trials']} times per world through the mechanism's own "
        "noise path (fedlib.dp.gaussian.noisy_release). The neighbours: the two of "
        f"{record['population']} calibration-length windows ({record['tokens']} tokens) whose clipped statistics are "
        "farthest apart ('shift'; the sensitivity allows √2·clip). σ is the guarantee's noise multiplier over every "
        "block's releases (the released mechanism), the noise std what the audited release actually drew with.",
        "Exact ε of the release: what the audited release costs the pair, one Gaussian of sensitivity 'shift' and "
        "that noise std (Balle & Wang's δ(ε), fedlib.dp.gaussian.gaussian_epsilon; ∞ without noise). No sound audit "
        "of this release goes above it. Bound: the ε lower bound (Clopper–Pearson, threshold chosen on half the "
        "trials, counted on the other half, at the mechanism's δ); ceiling: the largest bound a perfect attack could "
        "show with these counts. One release of many: an honest client's release costs far less than its whole-mask "
        "ε, and a broken client can be caught here only where this one release alone costs more than the claim.",
        f"Positive controls, which the audit must catch: the same client with its noise calibrated to a sensitivity "
        f"{record['factor']:g} times too small, and the honest client over a sampler that returns zeros. Verdicts: "
        "'within claim' / 'CLAIM REFUTED' (honest), 'caught' / 'NOT CAUGHT' (controls: NOT CAUGHT means the audit "
        "missed a breakage its release shows), 'invisible in one release' (a control whose audited release costs at "
        "most the claim: its breakage is spread over releases this audit does not attack, so no audit of this "
        "release can catch it), 'cannot fail' (ceiling ≤ claimed ε: no attack at this game size "
        "could refute the claim, the row says nothing about the mechanism; the ceiling grows with the log of the "
        "trials, so claims of tens of ε are out of reach of any feasible audit).",
    ]
    columns = ["claimed ε", "mechanism", "σ (noise multiplier)", "noise std of the release", "shift",
               "exact ε of the release (pair)", "audited ε LB", "ceiling", "counts (evaluated half)", "verdict"]
    return _write_tables(Path(spec["out_dir"]), "dp_release", spec.get("suffix", ""),
                         "DP client mechanism: white-box audit of one release, with positive controls",
                         header_lines, columns, rows)


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
    curves, guarantees = [], []  # (label, [(ε, ppl)]) for the plot; the DP rows' x_dp
    for fed in u["federations"]:
        size = f"{fed['clients']} × {fed['samples']} × {seqlen} ({fed['data']})"
        points, plain = [], None
        for eps in sorted(fed["settings"], key=_eps_key, reverse=True):
            files = fed["settings"][eps]
            header = read_header(Path(files["client_mask"]))
            dp = json.loads(header.extra["dp"]) if "dp" in header.extra else None
            guarantees += [dp] if dp else []
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
        "Privacy–utility of the sample-level DP client mechanism (fedlib.dp.gaussian, as in privacy_dp): per DP "
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
        *([guarantee_line(guarantees)] if guarantees else []),
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
    _save_png(fig, path)
