"""How many evaluation windows Table 1 needs to rank its rows, and what a window costs.

On the masks of `make run` (the workflow's ``results/``, default config), the variants Table 1
compares are scored on ``--windows`` evenly spaced windows per dataset (more than `make run`
evaluates), one process, 1 thread, each window's mean NLL kept. For each comparison (FedPrLLM
layer vs Local-only, each row vs Centralized) the per-window paired differences give their mean,
their standard deviation, and the half-width of the 95 % t interval that n windows would give
(t(0.975, n-1) · sd / √n), so the window count that resolves a difference of that size can be
read off. Cost: CPU seconds per window and variant (process time, so other jobs on the machine
inflate it less than wall time), measured around each variant's evaluation.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import yaml
from scipy import stats

from common import DATA_DIR, write

N_PROJECTED = (8, 16, 24, 32, 64)


def half_width(sd: float, n: int) -> float:
    """The 95 % t interval's half-width of a mean of n paired differences with this sd."""
    return float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n))


def comparison(variant_nll: np.ndarray, reference_nll: np.ndarray) -> dict:
    d = np.asarray(variant_nll, dtype=np.float64) - np.asarray(reference_nll, dtype=np.float64)
    sd = float(d.std(ddof=1))
    return {"mean": float(d.mean()), "sd": sd, "windows": int(d.size),
            "half_width": {str(n): half_width(sd, n) for n in N_PROJECTED},
            "resolved_at": {str(n): abs(float(d.mean())) > half_width(sd, n) for n in N_PROJECTED}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=32, help="evenly spaced windows per dataset")
    args = parser.parse_args()

    import torch

    from fedlib.catalog import Catalog
    from fedlib.config_check import with_schema_defaults
    from fedlib.data import evaluation_windows
    from fedlib.evaluate.perplexity import perplexities
    from fedlib.models import load_tokenizer, open_model
    from fedlib.pruned import PrunedModel

    torch.set_num_threads(1)
    config = with_schema_defaults(yaml.safe_load(open("config.yaml")))
    catalog = Catalog(config)
    setting = catalog.setting()
    ev = config["evaluation"]
    model = f"resources/models/{config['model']['name']}"
    handle, tokenizer = open_model(model), load_tokenizer(model)
    windows = {d: evaluation_windows(tokenizer, d, DATA_DIR, ev["seqlen"], args.windows,
                                     tuple(ev["c4_docs"]) if d == "c4" else None)[0] for d in ev["datasets"]}
    local = catalog.local_only_labels(setting[1])
    labels = ["centralized", *local, "fedprllm_oneshot_layer_noscale", "fedprllm_oneshot_row_noscale"]
    nll, cpu = {}, {}
    for label in labels:
        mask, _ = catalog.variant_source(*setting, label)
        variant = PrunedModel(handle, mask)
        start = time.process_time()
        scores, _ = perplexities(handle, list(windows.values()), ev.get("batch_size", 1), variant=variant.decision)
        cpu[label] = time.process_time() - start
        nll[label] = {d: np.array(s["window_nll"]) for d, s in zip(windows, scores)}
        print(f"{label}: {cpu[label]:.0f} CPU-s, " + ", ".join(f"{d} ppl {math.exp(v.mean()):.2f}"
                                                              for d, v in nll[label].items()), flush=True)
    local_mean = {d: np.mean([nll[label][d] for label in local], axis=0) for d in windows}
    comparisons = {d: {"FedPrLLM (layer) vs Local-only": comparison(nll["fedprllm_oneshot_layer_noscale"][d], local_mean[d]),
                       "FedPrLLM (layer) vs Centralized": comparison(nll["fedprllm_oneshot_layer_noscale"][d],
                                                                     nll["centralized"][d]),
                       "FedPrLLM (row) vs Centralized": comparison(nll["fedprllm_oneshot_row_noscale"][d],
                                                                   nll["centralized"][d]),
                       "Local-only vs Centralized": comparison(local_mean[d], nll["centralized"][d])}
                   for d in windows}
    total = sum(w.shape[0] for w in windows.values())
    write("eval_windows", {
        "config": "config.yaml", "setting": "/".join(setting), "windows_per_dataset": args.windows,
        "make_run_windows": ev["windows"], "seqlen": ev["seqlen"], "threads": 1, "variants": labels,
        "cpu_seconds": cpu, "cpu_seconds_per_window": float(np.median([c / total for c in cpu.values()])),
        "comparisons": comparisons,
    })


if __name__ == "__main__":
    main()
