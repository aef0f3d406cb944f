"""fedlib's client mask vs llmcompressor (the tool a practitioner would use for centralized
Wanda/SparseGPT), side by side in one run (`make bench-peers`).

Both prune the embedded model on the same token ids (C4 calibration windows cut by fedlib's data
loader, written to a token file the peer reads) with the same number of threads. fedlib runs
:func:`fedlib.client.prune_locally` in this process (what `fedlib client-mask` runs); the peer
runs llmcompressor's ``oneshot`` in its own environment (.venv-peers, benchmarks/
peer_llmcompressor.py) on the dense model saved here with ``save_pretrained``; each side is timed
around the pruning call alone (model and tokens already loaded). Runs are interleaved
(fedlib, peer, fedlib, peer, ...) so drifting machine load hits both alike; medians are reported,
and the JSON is rewritten after every repeat (a run cut short keeps what it measured).

Mask agreement: the fraction of decoder-block linear weights that both pruned models leave
nonzero or both set to zero. Perplexity: fedlib's perplexity code on the same WikiText-2 test
windows for the dense model and both pruned weight sets, scored per window, so the two tools'
perplexities are compared paired over the windows: the ratio fedlib / peer with a 95 % t-interval
of the windows' mean log-likelihood difference. "Equal or better" is a non-inferiority test: the
interval's upper end is at most 1 + PPL_MARGIN (fedlib at most 1 % worse, with 95 % confidence).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from common import DATA_DIR, load_bench_model, median, timed, write
from fedlib.client import Pruning, prune_locally
from fedlib.data import calibration_windows, evaluation_windows, save_tokens
from fedlib.evaluate.perplexity import paired_ppl_ratio, perplexities
from fedlib.models import fingerprint, linear_by_name, open_model
from fedlib.runner import BlockDecision

REPO = Path(__file__).resolve().parents[1]
PEER = "llmcompressor"
PEER_SCRIPT = Path(__file__).resolve().parent / "peer_llmcompressor.py"
# fedlib method and comparison group, and the llmcompressor modifier that computes the same thing:
# Wanda compares within each output row; SparseGPT (with its OBS weight update) selects the lowest
# saliencies of each block of 128 columns of the whole layer as the reference does
METHODS = (("wanda", "row", "wanda"), ("sparsegpt_update", "layer", "sparsegpt"))
RECORD_KEYS = ("method", "group", "peer", "peer_method", "fedlib_s", "peer_s", "ratio", "fedlib_seconds",
               "peer_seconds", "agreement", "fedlib_sparsity", "peer_sparsity", "fedlib_ppl", "peer_ppl",
               "ppl_ratio", "ppl_ratio_ci", "goal_met")
TIME_GOAL = 0.85
PPL_MARGIN = 0.01
GOAL = (f"ratio <= {TIME_GOAL} at equal or better ppl: the 95 % paired interval of the ppl ratio fedlib / peer "
        f"ends at most {1 + PPL_MARGIN:g} (non-inferiority, {PPL_MARGIN:.0%} margin)")


def pruned_weights(model: torch.nn.Module, decision: BlockDecision) -> dict[str, torch.Tensor]:
    """Every pruned linear's weight as fedlib's decision leaves it (its update, else masked)."""
    return {name: decision.weights[name] if name in decision.weights
            else linear_by_name(model, name).weight.detach().masked_fill(mask, 0.0)
            for name, mask in decision.masks.items()}


def zero_agreement(ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor]) -> float:
    """The fraction of weights that are zero in both pruned weight sets or nonzero in both.
    Both must hold the same layers with the same shapes (a layer one tool left out is an error,
    not an agreement)."""
    if set(ours) != set(theirs):
        raise ValueError(f"pruned layers differ: only fedlib {sorted(set(ours) - set(theirs))[:3]}, "
                         f"only the peer {sorted(set(theirs) - set(ours))[:3]}")
    same = total = 0
    for name, weight in ours.items():
        if weight.shape != theirs[name].shape:
            raise ValueError(f"{name}: fedlib shape {tuple(weight.shape)}, peer {tuple(theirs[name].shape)}")
        same += int(((weight == 0) == (theirs[name] == 0)).sum())
        total += weight.numel()
    return same / total


def record(method: str, group: str, peer_method: str, fedlib_seconds: list[float], peer_seconds: list[float],
           **figures) -> dict:
    """One method's side-by-side record; ``ratio`` is fedlib's median time over the peer's,
    ``goal_met`` the goal (:data:`GOAL`) on it and on the paired perplexity interval."""
    if len(fedlib_seconds) != len(peer_seconds) or not fedlib_seconds:
        raise ValueError(f"{method}: {len(fedlib_seconds)} fedlib runs vs {len(peer_seconds)} peer runs")
    fedlib_s, peer_s = median(fedlib_seconds), median(peer_seconds)
    result = {"method": method, "group": group, "peer": PEER, "peer_method": peer_method,
              "fedlib_s": fedlib_s, "peer_s": peer_s, "ratio": fedlib_s / peer_s,
              "fedlib_seconds": fedlib_seconds, "peer_seconds": peer_seconds, **figures}
    if "ppl_ratio_ci" in figures:
        result["goal_met"] = result["ratio"] <= TIME_GOAL and figures["ppl_ratio_ci"][1] <= 1 + PPL_MARGIN
    if set(result) != set(RECORD_KEYS):  # the README renderer reads these keys
        raise ValueError(f"{method}: record keys missing {sorted(set(RECORD_KEYS) - set(result))}, "
                         f"unexpected {sorted(set(result) - set(RECORD_KEYS))}")
    return result


def run_peer(python: Path, model_dir: Path, tokens: Path, method: str, args, out: Path,
             weights: Path | None) -> dict:
    command = [str(python), str(PEER_SCRIPT), "--model", str(model_dir), "--tokens", str(tokens),
               "--method", method, "--sparsity", str(args.sparsity), "--threads", str(args.threads),
               "--batch-size", str(args.peer_batch_size), "--out", str(out)]
    if weights is not None:
        command += ["--weights", str(weights)]
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"peer {method} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=8, help="fedlib's (client-mask's default)")
    parser.add_argument("--peer-batch-size", type=int, default=1, help="llmcompressor's (oneshot's default)")
    parser.add_argument("--eval-windows", type=int, default=64, help="16 cannot resolve the 1 %% margin at 97 %% mask agreement")
    parser.add_argument("--peer-python", type=Path, default=REPO / ".venv-peers" / "bin" / "python")
    parser.add_argument("--methods", nargs="*", default=[m for m, _, _ in METHODS])
    args = parser.parse_args()
    if not args.peer_python.is_file():
        raise SystemExit(f"{args.peer_python}: no peer environment (build it with `make bench-peers`)")
    torch.set_num_threads(args.threads)
    model, tokenizer = load_bench_model()
    ids = calibration_windows(tokenizer, "c4", DATA_DIR, args.samples, args.seqlen, 0, (0, 800))
    windows, _ = evaluation_windows(tokenizer, "wikitext2", DATA_DIR, args.seqlen, args.eval_windows)
    methods = [m for m in METHODS if m[0] in args.methods]

    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        tmp = Path(tmp)
        tokens, model_dir = tmp / "calib.safetensors", tmp / "model"
        save_tokens(tokens, ids)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        if open_model(str(model_dir), weights=False).fingerprint() != fingerprint(model):
            raise RuntimeError(f"{model_dir}: the saved dense model is not the model fedlib prunes")
        seconds = {m: ([], []) for m, _, _ in methods}
        quality, versions, load = {}, {}, []
        for rep in range(args.repeats):
            load.append(os.getloadavg()[0])
            decisions, peer_weights = {}, {}
            for method, group, peer_method in methods:
                ours, theirs = seconds[method]
                pruning = Pruning(method, args.sparsity, group, 0, batch_size=args.batch_size)
                ours += timed(lambda: decisions.__setitem__(method, prune_locally(model, ids, pruning)), 1)
                weights = tmp / f"{peer_method}.safetensors" if rep == 0 else None
                result = run_peer(args.peer_python, model_dir, tokens, peer_method, args, tmp / "peer.json", weights)
                theirs.append(result["seconds"])
                versions = result["versions"]
                if weights is not None:
                    peer_weights[method] = load_file(weights)
                print(f"repeat {rep}: {method} fedlib {ours[-1]:.1f} s, {PEER} {peer_method} {theirs[-1]:.1f} s",
                      flush=True)
            if rep == 0:  # the pruned weights are the same every repeat; judge them once
                quality = pruned_quality(model, windows, args.batch_size, decisions, peer_weights)
            # rewritten after every repeat: a run cut short keeps the repeats it finished
            records = [record(method, group, peer_method, *seconds[method], **quality[method])
                       for method, group, peer_method in methods]
            write("peers", {
                "model": "smollm2-135m", "sparsity": args.sparsity, "threads": args.threads,
                "calibration": {"dataset": "c4", "samples": args.samples, "seqlen": args.seqlen},
                "evaluation": {"dataset": "wikitext2", "windows": int(windows.shape[0]), "seqlen": args.seqlen},
                "repeats": rep + 1, "batch_size": {"fedlib": args.batch_size, "peer": args.peer_batch_size},
                "peer_versions": versions, "dense_ppl": quality["dense"],
                "schedule": "interleaved: each repeat runs fedlib then the peer for each method, so the load of "
                            "other jobs sharing the machine hits both alike; medians over repeats",
                "load_average_1min": load, "goal": GOAL,
                "records": records,
            })
    for r in records:
        print(f"{r['method']}: fedlib {r['fedlib_s']:.1f} s vs {PEER} {r['peer_s']:.1f} s, ratio {r['ratio']:.2f}; "
              f"agreement {r['agreement']:.2%}; ppl {r['fedlib_ppl']:.2f} vs {r['peer_ppl']:.2f}, ratio "
              f"{r['ppl_ratio']:.4f} [{r['ppl_ratio_ci'][0]:.4f}, {r['ppl_ratio_ci'][1]:.4f}]; goal "
              f"{'met' if r['goal_met'] else 'NOT met'}")


def pruned_quality(model, windows: torch.Tensor, batch_size: int, decisions: Mapping[str, BlockDecision],
                   peer_weights: Mapping[str, Mapping[str, torch.Tensor]]) -> dict:
    """Per method: mask agreement, measured sparsity and perplexity of both pruned weight sets
    (fedlib's perplexity code for both, every window scored on its own) and their paired ratio;
    and ``dense``, the dense model's perplexity."""
    def evaluate(weights=None):
        variant = None if weights is None else (lambda _block: BlockDecision(masks={}, weights=weights))
        (score,), sparsity = perplexities(model, [windows], batch_size, variant=variant)
        return score["window_nll"], score["ppl"], sparsity

    quality = {"dense": evaluate()[1]}
    for method, decision in decisions.items():
        ours, theirs = pruned_weights(model, decision), peer_weights[method]
        (nll_ours, ppl_ours, sparsity_ours), (nll_peer, ppl_peer, sparsity_peer) = evaluate(ours), evaluate(theirs)
        ratio, ci = paired_ppl_ratio(nll_ours, nll_peer)
        quality[method] = {"agreement": zero_agreement(ours, theirs), "fedlib_sparsity": sparsity_ours,
                           "peer_sparsity": sparsity_peer, "fedlib_ppl": ppl_ours, "peer_ppl": ppl_peer,
                           "ppl_ratio": ratio, "ppl_ratio_ci": ci}
    return quality


if __name__ == "__main__":
    main()
