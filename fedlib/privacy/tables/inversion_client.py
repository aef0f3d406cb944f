"""The inversion_client analysis's table: inverting clients' uploaded masks to their whole calibration
sets, per client and over clients."""

from __future__ import annotations

import statistics
from pathlib import Path

from fedlib.privacy.tables.common import _ci, _load, pct, provenance, _write_tables


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
