"""The domain-shift study's report (``fedlib privacy domain-report``; target ``domain``):
reports/domain.{md,csv,png} from the evaluation files of :class:`fedlib.catalog.domain.DomainCatalog`.

Every row is compared with public-only on the same windows and data seed: per window, the
difference of mean NLL; the table's change is exp(mean difference) - 1 over seeds, noise draws and
windows, its 95 % interval a bootstrap that resamples seeds, each resampled seed's noise draws
(DP rows; ``domain.noise_draws``) and windows (so it carries the calibration draw, the noise and
the evaluation windows). A DP row's "gain kept" is its change over the change of its
non-private counterpart (FedPrLLM for per-client mechanisms, Centralized for the distributed one),
on the same resamples; it is shown only where that counterpart beats public text significantly.

Privacy columns, from the DP passes' records: each DP row's noise source ("simulation: not
private" where the study seeded it, :mod:`fedlib.dp.samplers`) and the total ε its data pool
(the clients' text of one data seed) has spent over every release of every sparsity
(:class:`fedlib.dp.ledger.Ledger`); the header states the protected unit and the trust model
(:func:`fedlib.dp.accountant.trust_model`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from fedlib.dp.accountant import trust_model
from fedlib.dp.ledger import Ledger
from fedlib.dp.public import FALSE_KEEP
from fedlib.dp.samplers import SEEDED, SIMULATION_LABEL
from fedlib.report import DATASET_TITLES, fmt_ppl, write_table
from fedlib.studies.paired import BOOTSTRAP, Paired, change_cell, interval, kept_cell, load, percents, window_nll

ROW_TITLES = {"public": "Public text only (ε = 0)", "central": "Centralized in-domain (ceiling)",
              "client_0": "Local-only (client 0 of each seed)", "fedprllm": "FedPrLLM layer",
              "mix": "Public + private mix (Wanda on both)"}


def _mechanism(row: str) -> str | None:
    return row.rsplit("-", 1)[0] if "-" in row else None


def _summaries(spec: dict, kind: str, dataset: str) -> dict:
    """sparsity -> row -> {ppl, guards, delta, ci, draws, per_draw}: the pooled figures of every row
    (a DP row's over its noise draws too; ``draws`` are the bootstrap's, ``per_draw`` the mean Δ of
    each data seed's each noise draw)."""
    by_sparsity: dict[float, list[dict]] = {}
    for cell in spec["evals"][kind]:
        by_sparsity.setdefault(float(cell["sparsity"]), []).append(cell)
    guards = spec["evaluation"]["guards"]
    out = {}
    for sparsity, cells in sorted(by_sparsity.items()):
        cells = sorted(cells, key=lambda c: c["seed"])
        # per seed, row -> the evaluations of its noise draws (one for a row without noise)
        results = [{row: [load(path)] + [load(d["rows"][row]) for d in c.get("draws", []) if row in d["rows"]]
                    for row, path in c["rows"].items()} for c in cells]
        rows = list(cells[0]["rows"])
        public = np.stack([[window_nll(r["public"][0], dataset)] for r in results])
        paired = Paired(len(cells), max(len(v) for r in results for v in r.values()), public.shape[2],
                        np.random.default_rng(0))
        out[sparsity] = {}
        for row in rows:
            nll = np.stack([[window_nll(e, dataset) for e in r[row]] for r in results])
            diff = nll - public
            draws = paired.resampled(diff)
            out[sparsity][row] = {
                "ppl": math.exp(nll.mean()),
                "guards": {g: math.exp(np.mean([e["perplexity"][g]["nll"] for r in results for e in r[row]]))
                           for g in guards},
                "delta": float(diff.mean()), "ci": interval(draws), "draws": draws,
                "per_draw": diff.mean(axis=2),
                "seeds": [c["seed"] for c in cells],
            }
    return out


def _counterpart(summary: dict, row: str, references: dict) -> dict | None:
    """The summary of the row whose gain a DP row's is measured against (per client: FedPrLLM;
    distributed: Centralized)."""
    return summary.get(references.get(_mechanism(row) or "", ""))


def _kept(summary: dict, row: str, references: dict) -> tuple[float, tuple[float, float]] | None:
    """The fraction of its counterpart's gain a DP row keeps, where that gain is significant."""
    ref = _counterpart(summary, row, references)
    if ref is None or not ref["ci"][1] < 0:
        return None
    mine = summary[row]
    return mine["delta"] / ref["delta"], interval(mine["draws"] / ref["draws"])


def kept_per_draw(summary: dict, row: str, references: dict) -> np.ndarray | None:
    """The gain a DP row keeps in each data seed's each noise draw (seeds x draws): its mean Δ there
    over its counterpart's in the same seed. The spread is what one release (a deployment's only
    draw) lives with, which the pooled interval does not show."""
    ref = _counterpart(summary, row, references)
    if ref is None:
        return None
    return summary[row]["per_draw"] / ref["per_draw"].mean(axis=1, keepdims=True)


def per_draw_text(kept: np.ndarray | None, seeds: list) -> str:
    """``kept`` (:func:`kept_per_draw`) as a clause of a goal line; empty with one draw per seed."""
    if kept is None or kept.shape[1] < 2:
        return ""
    return "; kept per noise draw: " + "; ".join(
        f"data seed {seed}: {percents(draws)}" for seed, draws in zip(seeds, kept))


def _audits(spec: dict) -> dict:
    """label -> (proven ε of the audited mechanism, audited lower bound (the larger of LiRA's two),
    the game's ceiling: the largest bound a perfect attack could show with its counts)."""
    from fedlib.privacy.tables.common import _ceiling

    out = {}
    for label, path in spec["membership"].items():
        mia = load(path)
        entries = [mia["attack"][k] for k in ("epsilon_lr1", "epsilon_split") if mia["attack"][k].get("epsilon_lb") is not None]
        out[label] = (mia["dp"]["epsilon"], max((e["epsilon_lb"] for e in entries), default=0.0),
                      max((_ceiling(e) for e in entries), default=0.0))
    return out


def _guarantees(record: dict) -> dict[str, dict]:
    """label -> x_dp of a pass record (a record written before x_dp named its noise: the study's seeded)."""
    return {label: {"noise": SEEDED, **json.loads(r["guarantee"])} for label, r in record["releases"].items()}


def _passes(spec: dict) -> list[tuple[str, dict, int, dict]]:
    """(kind, setting, noise draw, pass record) of every DP pass of the study, each record read once."""
    out = []
    for kind, cells in spec["evals"].items():
        for cell in cells:
            if cell.get("record"):
                paths = [cell["record"]] + [d["record"] for d in cell.get("draws", [])]
                out += [(kind, cell, draw, load(path)) for draw, path in enumerate(paths)]
    return out


def _pool_ledgers(spec: dict, passes: list) -> dict[tuple[str, int, int], Ledger]:
    """(kind, data seed, noise draw) -> the ledger of that pool over every pass on it (every
    detailed sparsity). Noise draws are replicates of the study (a deployment releases one), so
    each has its own ledger. A record without a ledger (written before one release served several
    estimators) had one noisy release per label."""
    by_pool: dict[tuple[str, int, int], list[Ledger]] = {}
    for kind, cell, draw, record in passes:
        if "ledger" in record:
            ledger = Ledger(record["ledger"]["pool"], record["ledger"]["releases"], record["ledger"]["diagnostics"])
        else:
            ledger = Ledger(record["public"])
            for label, header in _guarantees(record).items():
                ledger.add_release(label, header, [header.get("estimator", "threshold")], [])
        by_pool.setdefault((kind, int(cell["seed"]), draw), []).append(ledger)
    pools = {pool: Ledger.merged(f"{pool[0]} s{pool[1]}" + (f" n{pool[2]}" if pool[2] else ""), ledgers)
             for pool, ledgers in by_pool.items()}
    for diagnostic in spec.get("diagnostics", []):
        for (kind, seed, _), ledger in pools.items():
            if (kind, seed) == (diagnostic["kind"], int(diagnostic["seed"])) and Path(diagnostic["path"]).is_file():
                ledger.add_diagnostic(diagnostic["label"], diagnostic["reads"])
    return pools


def _row_guarantees(passes: list) -> dict[tuple[str, float], dict[str, list[dict]]]:
    """(kind, sparsity) -> label -> the x_dp of that row in each data seed and noise draw."""
    out: dict = {}
    for kind, cell, _, record in passes:
        for label, header in _guarantees(record).items():
            out.setdefault((kind, float(cell["sparsity"])), {}).setdefault(label, []).append(header)
    return out


def domain_table(spec: dict) -> list[Path]:
    out_dir = Path(spec["out_dir"])
    dataset, guards = spec["private"], spec["evaluation"]["guards"]
    title = DATASET_TITLES.get(dataset, dataset)
    guard_titles = [DATASET_TITLES.get(g, g) for g in guards]
    audits = _audits(spec)
    dense = {dtype: load(path) for dtype, path in spec["dense"].items()}
    passes = _passes(spec)
    ledgers, guarantees = _pool_ledgers(spec, passes), _row_guarantees(passes)
    columns = ["Clients' text", "Sparsity", "Row", "ε", "noise", "pool ε (all its releases)", f"{title} ppl",
               f"Δ {title} ppl vs public [95% CI]", "gain kept [95% CI]", *[f"{g} ppl" for g in guard_titles],
               "audited ε LB", "audit ceiling", "audit ≤ proven", "audit can fail (ceiling > proven)"]
    rows = []
    for dtype, result in dense.items():
        rows.append(["-", "0%", f"Dense ({dtype})", "-", "-", "-", fmt_ppl(result["perplexity"][dataset]["ppl"]), "-",
                     "-", *[fmt_ppl(result["perplexity"][g]["ppl"]) for g in guards], "-", "-", "-", "-"])
    summaries = {kind: _summaries(spec, kind, dataset) for kind in ("private", "control")}
    worse, checks = [], []
    for kind, by_sparsity in summaries.items():
        text = f"{title} (in-domain)" if kind == "private" else "C4 (negative control)"
        for sparsity, summary in by_sparsity.items():
            for row, s in summary.items():
                mechanism = _mechanism(row)
                eps = row.rsplit("-", 1)[1] if mechanism else ("0" if row == "public" else "∞")
                kept = _kept(summary, row, spec["references"]) if mechanism else None
                audit = audits.get(row) if mechanism else None
                if mechanism and s["ci"][0] > 0:
                    worse.append(f"{text}, {sparsity:.0%}, {spec['titles'][mechanism]} at ε = {eps}")
                noise, pool = "-", "-"
                if mechanism:
                    headers = guarantees.get((kind, sparsity), {}).get(row, [])
                    noise = SIMULATION_LABEL if any(h["noise"] == SEEDED for h in headers) else "secret"
                    pools = [ledger for (k, seed, _), ledger in ledgers.items() if k == kind and seed in s["seeds"]]
                    if any(ledger.diagnostics for ledger in pools):
                        pool = "∞ (non-private diagnostic)"
                    elif pools:
                        pool = f"{max(ledger.dp_epsilon for ledger in pools):.1f}"
                rows.append([
                    text, f"{sparsity:.0%}", spec["titles"].get(mechanism, ROW_TITLES.get(row, row)), eps, noise, pool,
                    fmt_ppl(s["ppl"]), "-" if row == "public" else change_cell(s["delta"], s["ci"]),
                    kept_cell(*kept) if kept else "-",
                    *[fmt_ppl(s["guards"][g]) for g in guards],
                    f"{audit[1]:.2f}" if audit else "-", f"{audit[2]:.2f}" if audit else "-",
                    ("yes" if audit[1] <= audit[0] else "NO") if audit else "-",
                    ("yes" if audit[2] > audit[0] else "no") if audit else "-",
                ])
                if kind == "private" and mechanism and float(eps) <= 8 and kept:
                    checks.append((sparsity, mechanism, float(eps), kept,
                                   per_draw_text(kept_per_draw(summary, row, spec["references"]), s["seeds"])))
    header = _header(spec, summaries, dense, worse, checks, audits) + _privacy_lines(spec, guarantees, ledgers)
    md, csv_path, png = (out_dir / f"domain.{ext}" for ext in ("md", "csv", "png"))
    write_table(md, csv_path, f"When does private data pay? {title} clients against C4 public text", header,
                columns, rows)
    _plot(spec, summaries, png)
    return [md, csv_path, png]


def _header(spec, summaries, dense, worse, checks, audits) -> list[str]:
    from fedlib.provenance import written_by

    dataset = spec["private"]
    title = DATASET_TITLES.get(dataset, dataset)
    first = next(iter(dense.values()))["perplexity"]
    win = first[dataset]
    guards = ", ".join(f"{DATASET_TITLES.get(g, g)} {first[g]['windows']} of {first[g]['total_windows']}"
                       for g in spec["evaluation"]["guards"])
    seeds = sorted({c["seed"] for c in spec["evals"]["private"]})
    noise_draws = 1 + max((len(c.get("draws", [])) for cells in spec["evals"].values() for c in cells), default=0)
    over = "seeds and windows" if noise_draws == 1 else f"seeds, {noise_draws} noise draws per seed (DP rows) and windows"
    c4 = spec.get("eval_c4_docs")
    lines = [
        f"Model: {spec['model']}; config {spec['config']}; written by {written_by()}.",
        f"Clients: {spec['clients']} × {spec['samples']} windows × {spec['seqlen']} tokens of {title} train each "
        f"(IID split of one pool per data seed; seeds {', '.join(map(str, seeds))}). Public text: "
        f"{spec['public_samples']} windows of C4 documents {spec['public_docs'][0]}–{spec['public_docs'][1] - 1}, "
        f"disjoint from every evaluation set (C4 evaluation: documents {c4[0]}–{c4[1] - 1})." if c4 else
        f"Clients: {spec['clients']} × {spec['samples']} windows of {title} train; public text: C4.",
        f"Negative control: the clients hold C4 documents {spec['control_docs'][0]}–{spec['control_docs'][1] - 1} "
        "instead (the public text's distribution): DP must land at public-only." if spec["evals"]["control"] else
        "Negative control: none (domain.control.sparsities is empty).",
        f"Evaluation: {title} test, {'all ' if win['windows'] == win['total_windows'] else ''}{win['windows']} of "
        f"{win['total_windows']} windows × {win['seqlen']} tokens (in-domain); guards with "
        f"fewer windows ({guards}, evenly spaced). Weights and activations in "
        f"{spec['evaluation']['dtype']} (masks computed in float32; the Dense rows show what that dtype changes).",
        "Every mask is Wanda with row comparison; FedPrLLM aggregates with layer comparison. Δ: paired against "
        f"public-only on the same windows and data seed, exp(mean NLL difference) − 1 over {over}; "
        f"95 % interval: bootstrap over {over} ({BOOTSTRAP} resamples).",
        f"DP (replace one protected unit, stated below; δ = {spec['delta']:g}): statistics through the public "
        "mask's prefix, each window's channel energies as deviations from the public text's, clipped to "
        f"{spec['clip']:g} × the public samples' rms deviation (sensitivity 2 × clip: signed), Gaussian noise, "
        "the noisy mean soft-thresholded toward the public prior at the bound that noise alone clears with "
        f"probability {FALSE_KEEP:.1%} over the pass (from the noise level and shapes only; fedlib.dp.public). "
        f"Public basis: the {spec['basis']} leading directions of the public tokens' deviations. Per client: each "
        "client's noisy mask, FedPrLLM over them. Distributed: the clients' sums under SecAgg, each adding 1/√K "
        "of a discrete Gaussian (fedlib.dp.distributed), one Wanda mask from the sum. The proven ε "
        "covers every block (its σ is in the mask files' x_dp).",
        "Gain kept: the DP row's Δ over its counterpart's (per client: FedPrLLM; distributed: Centralized), "
        "shown where that counterpart beats public text significantly.",
    ]
    sizes = spec["membership_sizes"]
    lines.append(f"Audit: LiRA membership game of fedlib privacy membership on each mechanism's masks of "
                 f"{sizes['blocks']} block(s) at {sizes['sparsity']:.0%} ({sizes['targets']} targets, "
                 f"{sizes['population']} {title} windows × {sizes['seqlen']} tokens, {sizes['pairs']} shadow pairs), "
                 "the mechanism accounted over those blocks at the row's ε; its ε lower bound must not exceed the "
                 "proven ε (audit ≤ proven).")
    # the reading, from the figures
    for sparsity, summary in summaries["private"].items():
        parts = []
        for row in ("central", "fedprllm", "mix"):
            if row in summary:
                s = summary[row]
                verdict = "beats" if s["ci"][1] < 0 else ("is worse than" if s["ci"][0] > 0 else "does not differ from")
                parts.append(f"{ROW_TITLES[row].split(' (')[0]} {verdict} public text "
                             f"({change_cell(s['delta'], s['ci'])})")
        lines.append(f"At {sparsity:.0%}, in-domain private data: " + "; ".join(parts) + ".")
    goal = {}
    for sparsity, mechanism, eps, (kept, ci), spread in checks:
        goal.setdefault((sparsity, mechanism), []).append((eps, kept, ci, spread))
    chosen = _validation_choice(spec)
    if chosen:
        lines.append(chosen["line"])
    for (sparsity, mechanism), entries in sorted(goal.items()):
        head = f"Goal (≥ 50 % of the gain at ε ≤ 8), {sparsity:.0%}, {spec['titles'][mechanism]}"
        if chosen and sparsity == chosen["sparsity"]:
            entry = next((e for e in entries if e[0] == chosen["epsilon"]), None)
            if mechanism == chosen["mechanism"] and entry:
                lines.append(f"{head}, chosen on validation (the claim): {goal_verdict(entry[1], entry[2])}: "
                             f"{kept_cell(entry[1], entry[2])} on the test windows at ε = {entry[0]:g}{entry[3]}.")
            else:
                lines.append(f"{head}: not chosen on validation (shown, not claimed).")
            continue
        best = max(entries, key=lambda e: e[1])
        lines.append(f"{head}: {goal_verdict(best[1], best[2])} (best: {kept_cell(best[1], best[2])} "
                     f"at ε = {best[0]:g}{best[3]}).")
    lines.append("Worse than public-only beyond the interval: " + ("; ".join(worse) if worse else "no DP row") + ".")
    over = [label for label, (proven, audited, _) in audits.items() if audited > proven]
    weak = [label for label, (proven, _, ceiling) in audits.items() if ceiling <= proven]
    if audits:
        verdict = "in every row" if not over else f"NOT in {', '.join(over)}"
        if weak and len(weak) == len(audits):
            verdict += ("; but no audit here can fail: each game's ceiling (the largest bound a perfect attack could "
                        "show with its counts) is at most its row's proven ε, so these rows say nothing of the "
                        "mechanism (fedlib privacy release-audit sizes games that can)")
        elif weak:
            verdict += f"; the audit cannot fail in {', '.join(weak)} (ceiling ≤ proven ε)"
        else:
            verdict += "; every game's ceiling exceeds its proven ε"
        lines.append(f"Audited ε ≤ proven ε: {verdict}.")
    return lines


def goal_verdict(kept: float, ci: tuple[float, float], goal: float = 0.5) -> str:
    """The goal's verdict on a share of the gain kept and its paired-bootstrap interval: "met" only
    where the interval clears the goal, so a point estimate that one noise draw lifts over it is
    not read as a guarantee."""
    if ci[0] >= goal:
        return "met"
    if kept >= goal:
        return "met at the point, not beyond its interval"
    return "not met"


def _validation_choice(spec) -> dict | None:
    """The claim's row, chosen where the study does not score (``spec["choice"]``, the headroom
    analysis on validation windows): among the estimators the study releases, at data × 1 and an ε
    of the study's ≤ 8, the one with the lowest Δ vs public-only there. None without a choice."""
    choice = spec.get("choice")
    if not choice:
        return None
    from fedlib.studies.headroom import headroom_summary, paired_record

    record, public, central = paired_record(choice["headroom"], choice["public"], choice["central"], spec["private"])
    if record.get("split") != "validation":
        raise ValueError(f"{choice['headroom']}: scored on {record.get('split', 'test')} windows; a choice is made on "
                         "validation windows")
    epsilons = {float(e) for e in spec["epsilons"] if float(e) <= 8}
    candidates = [s for s in headroom_summary(record, public, central) if s["multiplier"] == 1
                  and s["estimator"] in choice["mechanisms"] and s["epsilon"] is not None and s["epsilon"] in epsilons]
    if not candidates:
        raise ValueError(f"{choice['headroom']}: no variant at data × 1 and ε in {sorted(epsilons)} of an estimator "
                         f"the study releases ({', '.join(choice['mechanisms'])}): nothing to choose from")
    best = min(candidates, key=lambda s: s["delta"])
    scores = "; ".join(f"{s['estimator']} at ε = {s['epsilon']:g}: {change_cell(s['delta'], s['ci'])}" for s in candidates)
    line = (f"Chosen on held-out windows: the {best['estimator']} estimator ({spec['titles'][choice['mechanisms'][best['estimator']]]}) "
            f"at ε = {best['epsilon']:g}, the lowest Δ vs public-only on {record['windows']} {spec['private'].upper()} "
            f"validation windows (headroom analysis on data seed {choice['seed']}, {best['noise_draws']} noise draws; "
            f"{scores}), reading no test window; the goal is claimed for that row alone.")
    return {"mechanism": choice["mechanisms"][best["estimator"]], "epsilon": best["epsilon"],
            "sparsity": float(choice["sparsity"]), "line": line}


def _privacy_lines(spec, guarantees, ledgers) -> list[str]:
    """The protected unit, the noise source, each pool's ledger and the trust model, from the records."""
    headers = [h for by_label in guarantees.values() for hs in by_label.values() for h in hs]
    if not headers:
        return []
    units = sorted({(h.get("unit", "window"), h.get("windows_per_unit", 1)) for h in headers})
    lines = ["Protected unit: " + "; ".join(
        f"{unit} (at most {k} window{'s' if k > 1 else ''} each)" if unit != "window" else
        "one calibration window (windows drawn at random offsets overlap: no text unit is protected at this ε)"
        for unit, k in units) + "."]
    if any(h["noise"] == SEEDED for h in headers):
        lines.append(f"Noise: seeded from the data seed (a simulation of the clients' secrets): every DP row is "
                     f"{SIMULATION_LABEL}; a site's release draws its noise from the OS (fedlib.dp.samplers).")
    if any(draw for _, _, draw in ledgers):
        lines.append("Noise draws: replicates of the study, each its own seeded world (a deployment releases one), "
                     "so a pool's ε is counted per draw, not summed over them.")
    for (kind, seed, draw), ledger in sorted(ledgers.items()):
        estimators = sum(len(r["estimators"]) for r in ledger.releases)
        lines.append(f"Ledger, {kind} pool of data seed {seed}{f', noise draw {draw}' if draw else ''}: "
                     f"{len(ledger.releases)} noisy releases "
                     f"({estimators} estimator masks as post-processing) compose to ε = {ledger.dp_epsilon:.1f} at "
                     f"δ = {ledger.delta:.1g} (RDP); each row's ε is its own release's."
                     + "".join(f" Non-private diagnostic on this pool: the {d['label']} (reads {d['reads']}; not DP), "
                               "so the pool has no finite ε in all." for d in ledger.diagnostics))
    clients = spec["clients"]
    seen = {}
    for by_label in guarantees.values():
        for label, hs in by_label.items():
            seen.setdefault(label, hs[0])
    shared = [f"{label}: " + ", ".join([f"one dropout {m['one_dropout']:.1f}"] +
                                       [f"c = {c}: {e:.1f}" for c, e in m["collusion"].items()])
              for label, m in ((label, trust_model(h)) for label, h in sorted(seen.items())) if m["collusion"]]
    lines.append(f"Trust model: an honest-but-curious coordinator and all {clients} clients honest (the ε column). "
                 "Per-client rows rest on each client's own noise (collusion changes nothing); the secure sum's ε "
                 "when one client drops out or the coordinator colludes with c clients (their noise known): "
                 + ("; ".join(shared) if shared else "no secure-sum row") + ".")
    return lines


def _plot(spec: dict, summaries: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedlib.plots import DPI, figure_size

    first = f"{spec['mechanisms'][0]}-{float(spec['epsilons'][0]):g}"
    panels = [(kind, sp) for kind in ("private", "control") for sp, summary in summaries[kind].items()
              if first in summary]
    width, height = figure_size(len(panels))
    fig, axes = plt.subplots(1, len(panels), figsize=(width / DPI, height / DPI), squeeze=False)
    eps = [float(e) for e in spec["epsilons"]]
    for ax, (kind, sparsity) in zip(axes[0], panels):
        summary = summaries[kind][sparsity]
        for row, style in (("central", "k--"), ("fedprllm", "b:"), ("mix", "g-.")):
            if row in summary:
                ax.axhline(100 * math.expm1(summary[row]["delta"]), linestyle=style[1:], color=style[0],
                           label=ROW_TITLES[row].split(" (")[0])
        ax.axhline(0.0, color="grey", linewidth=1, label="public only")
        for mechanism in spec["mechanisms"]:
            keys = [f"{mechanism}-{e:g}" for e in eps]
            y = [100 * math.expm1(summary[k]["delta"]) for k in keys]
            lo = [y_ - 100 * math.expm1(summary[k]["ci"][0]) for y_, k in zip(y, keys)]
            hi = [100 * math.expm1(summary[k]["ci"][1]) - y_ for y_, k in zip(y, keys)]
            ax.errorbar(eps, y, yerr=[lo, hi], marker="o", capsize=3, label=spec["titles"][mechanism])
        ax.set_xscale("log", base=2)
        ax.set_xticks(eps, [f"{e:g}" for e in eps])
        ax.set_xlabel("ε (δ = %g)" % spec["delta"])
        ax.set_ylabel(f"Δ {DATASET_TITLES.get(spec['private'], spec['private'])} ppl vs public (%)")
        ax.set_title(f"{'in-domain' if kind == 'private' else 'C4 control'}, {sparsity:.0%} sparsity", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
