"""The membership_scale analysis's table: the membership attack on the whole mask at realistic sizes,
one row per seed and the seeds pooled."""

from __future__ import annotations

from pathlib import Path

from fedlib.privacy.tables.common import _attack_columns, _game_rows, _load, num, provenance, _write_tables
from fedlib.report import DATASET_TITLES


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
