"""Argument helpers that the verbs of ``fedlib`` (:mod:`fedlib.cli`), ``fedlib privacy``
(:mod:`fedlib.privacy_cli`) and ``fedlib zeroshot`` (:mod:`fedlib.evaluate.zeroshot_cli`) share.

A leaf of the command line: the sub-CLIs import these from here, not from :mod:`fedlib.cli`
(which imports them to build its parser). Building a parser imports nothing heavy: torch and
the DP mechanism are imported when a verb runs.
"""

from __future__ import annotations

from pathlib import Path


def parse_data_dir(value: str | None) -> Path | None:
    """``--data-dir``: the offline mirror folder, or None for the Hugging Face hub (omitted, or ``hub``)."""
    return None if value in (None, "", "hub") else Path(value)


def set_threads(args) -> None:
    """torch's threads from ``--threads`` (0 or absent: torch's default)."""
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def add_placement_arguments(p) -> None:
    """``--device`` / ``--dtype`` of every verb that runs a model."""
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N (default auto)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and activations; statistics that decide masks stay float32/float64")


def add_dp_arguments(p, noise_seed: bool = True) -> None:
    """The DP client mechanism's budget (:mod:`fedlib.privacy.dp`)."""
    p.add_argument("--dp-epsilon", type=float,
                   help="sample-level (replace-one) DP: clip per-sample Wanda statistics and add Gaussian noise "
                        "calibrated to this epsilon over all blocks (PLD accountant); inf = no DP. Wanda only")
    p.add_argument("--dp-delta", type=float, help="the DP delta (with --dp-epsilon), e.g. 1e-5")
    p.add_argument("--dp-clip", type=float,
                   help="L2 bound on one sample's per-channel squared-norm vector (with --dp-epsilon)")
    if noise_seed:
        p.add_argument("--dp-noise-seed", type=int,
                       help="the DP noise's seed: a secret, never written to the mask file (whoever knows it can "
                            "remove the noise); default: fresh OS randomness. Give it only to reproduce a run")


def dp_target_from_args(args):
    """``--dp-epsilon/--dp-delta/--dp-clip`` as a :class:`fedlib.privacy.dp.DPTarget`, or None
    without ``--dp-epsilon`` (``inf`` = the plain mechanism, recorded as no DP)."""
    if args.dp_epsilon is None:
        if args.dp_delta is not None or args.dp_clip is not None or getattr(args, "dp_noise_seed", None) is not None:
            raise ValueError("--dp-delta, --dp-clip and --dp-noise-seed need --dp-epsilon")
        return None
    from fedlib.privacy.dp import DPTarget

    if args.dp_delta is None or args.dp_clip is None:
        raise ValueError("--dp-epsilon needs --dp-delta and --dp-clip")
    return DPTarget(args.dp_epsilon, args.dp_delta, args.dp_clip)
