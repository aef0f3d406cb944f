"""``fedlib privacy <analysis>``: the privacy audit's command line (argument parsing only).

Kept apart from :mod:`fedlib.privacy.audit` so that building the ``fedlib`` parser does not
import torch; the analyses themselves live there (see its docstring).

    fedlib privacy entropy      --model M --out X.json CLIENT_MASKS...
    fedlib privacy similarity   --model M --out X.json [--seeds 1 2 ...] CLIENT_MASKS...
    fedlib privacy sensitivity  --model M --calib D.safetensors --replacements R.safetensors... --out X.json
    fedlib privacy membership   --model M --population P.safetensors --targets T --blocks B --out X.json
    fedlib privacy inversion    --model M --texts T16.safetensors ... --out X.json
    fedlib privacy rr-aggregate --model M --epsilon E --group layer --out G.mask.safetensors --record X.json MASKS...
    fedlib privacy report       --spec JSON
"""

from __future__ import annotations

import argparse
import math

HELP = "privacy audit of shared masks: entropy, similarity, sensitivity, membership, inversion, defence"


def _epsilon(value: str) -> float:
    if value.lower() in ("inf", "infinity", "none"):
        return math.inf
    try:
        eps = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"ε must be a number >= 0 or inf, got {value!r}") from None
    if not eps >= 0:
        raise argparse.ArgumentTypeError(f"ε must be >= 0 or inf, got {value}")
    return eps


def _blocks(value: str) -> int | None:
    if value.lower() in ("none", "null", "all"):
        return None
    blocks = int(value)
    if blocks < 1:
        raise argparse.ArgumentTypeError(f"--blocks must be >= 1 or 'all', got {value}")
    return blocks


def _pruning_args(p, blocks: bool = False) -> None:
    p.add_argument("--method", default="wanda")
    p.add_argument("--sparsity", type=float, default=0.5)
    p.add_argument("--group", default="row", help="the clients' comparison group")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=0)
    from fedlib.cli import add_placement_arguments

    add_placement_arguments(p)
    if blocks:
        p.add_argument("--blocks", type=_blocks, default=None,
                       help="masks of decoder blocks 0..B-1 only ('all' = the whole model)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="analysis", required=True)

    p = sub.add_parser("entropy", help="bits per entry of client masks vs fp16 weights")
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("masks", nargs="+", help="client mask files (the first is 'the' client mask)")

    p = sub.add_parser("similarity", help="Hamming distances between masks from disjoint calibration sets")
    p.add_argument("--model", required=True)
    _pruning_args(p)
    p.add_argument("--seeds", type=int, nargs="*", help="also compute masks from calibration draws with these seeds")
    p.add_argument("--seed-samples", type=int, default=32, help="samples per seeded draw")
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--dataset", default="c4", choices=["c4", "wikitext2", "ptb"])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--docs", type=int, nargs=2, metavar=("START", "STOP"))
    p.add_argument("--out", required=True)
    p.add_argument("masks", nargs="*", help="client mask files to compare pairwise")

    p = sub.add_parser("sensitivity", help="Hamming distance between masks of data sets differing in one sample")
    p.add_argument("--model", required=True)
    _pruning_args(p, blocks=True)
    p.add_argument("--calib", required=True, help="token file of the data set D (e.g. a client's shard)")
    p.add_argument("--replacements", nargs="+", required=True, help="token files of samples not in D")
    p.add_argument("--neighbours", type=int, default=2)
    p.add_argument("--base-mask", help="the client's shared mask file for D (checked), instead of recomputing it")
    p.add_argument("--out", required=True)

    p = sub.add_parser("membership", help="LiRA membership inference on shadow masks; AUC, TPR@FPR, ε lower bound")
    p.add_argument("--model", required=True)
    _pruning_args(p, blocks=True)
    p.add_argument("--population", required=True, help="token file: targets are its first rows, the rest fill data sets")
    p.add_argument("--targets", type=int, default=32)
    p.add_argument("--samples", type=int, default=2, help="samples in the client's data set")
    p.add_argument("--pairs", type=int, default=4, help="shadow (in, out) pairs per target: half direction, half fit")
    p.add_argument("--epsilons", type=_epsilon, nargs="*", default=[],
                   help="also attack masks under randomized response with these per-bit ε")
    p.add_argument("--fprs", type=float, nargs="+", default=[0.01, 0.001])
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--out", required=True)

    p = sub.add_parser("inversion", help="reconstruct calibration tokens from block-0 q_proj masks")
    p.add_argument("--model", required=True)
    p.add_argument("--texts", nargs="+", required=True, help="token files; rows of T tokens are the private texts")
    p.add_argument("--per-length", type=int, default=1, help="texts per token file")
    p.add_argument("--sparsity", type=float, default=0.5)
    p.add_argument("--group", default="row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--restarts", type=int, default=1)
    p.add_argument("--prior-tokens", nargs="*", help="public token files: unigram baseline (and prior)")
    p.add_argument("--use-prior", action="store_true", help="initialise the attack's logits at the unigram prior")
    p.add_argument("--tiny-lengths", type=int, nargs="*", default=[1, 2, 3])
    p.add_argument("--tiny-steps", type=int, default=200)
    p.add_argument("--time-limit", type=float, default=None, help="seconds per text for the gradient stage")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)

    p = sub.add_parser("rr-aggregate",
                       help="defence: randomized response on client mask bits, FedPrLLM top-k on the noisy votes")
    p.add_argument("--model", required=True)
    p.add_argument("--epsilon", type=_epsilon, required=True, help="per-bit ε ('inf' = no noise)")
    p.add_argument("--group", default="layer", help="server comparison group")
    p.add_argument("--sparsity", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-client", action="store_true",
                   help="flip every client's bits (slow) instead of sampling the noisy counts exactly")
    p.add_argument("--clean-global", help="the noise-free global mask file (fedlib aggregate) to compare with")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True, help="global mask file")
    p.add_argument("--record", required=True, help="JSON: flip rates, distance to the noise-free global mask")
    p.add_argument("masks", nargs="+")

    p = sub.add_parser("report", help="write the privacy report tables (Markdown + CSV) and plots from results")
    p.add_argument("--spec", required=True, help="JSON: context, output names and result files per analysis")


def run(args) -> None:
    from fedlib.privacy.audit import COMMANDS

    COMMANDS[args.analysis](args)
