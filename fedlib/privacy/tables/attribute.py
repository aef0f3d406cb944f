"""The attribute analysis's table: attribute inference games per property and seed, pooled."""

from __future__ import annotations

from pathlib import Path

from fedlib.privacy.tables.common import (
    _attack_columns,
    _block_scope,
    _game_rows,
    _load,
    pct,
    provenance,
    _s,
    _write_tables,
)
from fedlib.report import DATASET_TITLES


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
