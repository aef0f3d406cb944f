"""The membership_shared analysis's table: the shared-shadow membership games per size and seed, pooled."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlib.privacy.tables.common import _ci, _eps_cell, _load, num, pct, provenance, _write_tables
from fedlib.report import DATASET_TITLES


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
