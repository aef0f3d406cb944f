"""What every privacy table shares: the paper's figures, number and interval formats, the provenance
lines, the Markdown/CSV/HTML writer, and the cells of a membership attack (AUC, TPR at FPR, the ε lower
bounds with their ceilings) that several analyses' tables show."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from fedlib.report import write_table


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


def _where(spec: dict) -> tuple[Path, str]:
    """The output folder and the file-name suffix of a bundled report's spec."""
    return Path(spec.get("out_dir", "reports")), spec.get("suffix", "")


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


def _save_png(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` atomically (a killed job leaves no half-written plot) and free it."""
    from fedlib.io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    _plt().close(fig)


def _eps_key(value) -> float:
    return math.inf if str(value).lower() in ("inf", "infinity") else float(value)


def _tpr_cell(entry: dict) -> str:
    mark = "" if entry["resolvable"] else " †"
    return f"{pct(entry['tpr'], 1)} {_ci(*entry['tpr_ci'], fmt=lambda x: pct(x, 1))}{mark}"


def _ceiling(entry: dict) -> float:
    """The largest ε lower bound any attack could show with this audit's counts."""
    from fedlib.privacy.membership import epsilon_ceiling

    return epsilon_ceiling(entry["tp"] + entry["fn"], entry["fp"] + entry["tn"], entry["confidence"],
                           entry.get("delta", 0.0))


def _eps_cell(entry: dict) -> str:
    lb = entry.get("epsilon_lb")
    if lb is None:
        return "-"
    return (f"{lb:.2f} (TP {entry['tp']}, FN {entry['fn']}, FP {entry['fp']}, TN {entry['tn']}; "
            f"ceiling {_ceiling(entry):.2f})")


def _attack_columns(fprs) -> list[str]:
    """The columns of :func:`_attack_row` after its label."""
    return ["AUC [95 % CI]"] + [f"TPR @ {f:g} FPR [95 % CI]" for f in fprs] + \
        ["ε lower bound, LR = 1 threshold", "ε lower bound, split threshold"]


def _attack_row(label: str, a: dict, fprs) -> list[str]:
    by_fpr = {e["target_fpr"]: e for e in a["tpr_at_fpr"]}
    return [label, f"{a['auc']:.3f} {_ci(*a['auc_ci'], fmt=lambda x: f'{x:.3f}')}"] + \
        [_tpr_cell(by_fpr[f]) for f in fprs] + [_eps_cell(a["epsilon_lr1"]), _eps_cell(a["epsilon_split"])]


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
