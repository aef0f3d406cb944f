"""The secagg analysis's table: membership inference on the sum of m client masks and on its global mask."""

from __future__ import annotations

from pathlib import Path

from fedlib.privacy.tables.common import _attack_row, _block_scope, provenance, _where, _write_tables


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


def write(spec: dict, results: dict) -> list[Path]:
    """Its tables in the bundled report (:func:`fedlib.privacy.audit_report.write_reports`): none
    without its result."""
    if not results.get("secagg"):
        return []
    return secagg_table(results["secagg"], spec, *_where(spec))
