"""Argument helpers that the verbs of ``fedlib`` (:mod:`fedlib.cli`), ``fedlib privacy``
(:mod:`fedlib.privacy_cli`) and ``fedlib zeroshot`` (:mod:`fedlib.evaluate.zeroshot_cli`) share:
the command line's vocabulary (one spelling per concept, the old ones kept for a release).

A leaf of the command line: the sub-CLIs import these from here, not from :mod:`fedlib.cli`
(which imports them to build its parser). Building a parser imports nothing heavy: torch and
the DP mechanism are imported when a verb runs (tests/test_cli.py checks).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from fedlib.protocol import GROUPS, METHODS, client_id


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, where it has one; old spellings are not shown."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and "%(default)" not in text
                and not any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS))):
            text += " (default: %(default)s)"
        return text

    def _format_action_invocation(self, action):
        old = getattr(action, "old_names", ())
        if old:
            action = copy.copy(action)
            action.option_strings = [name for name in action.option_strings if name not in old]
        return super()._format_action_invocation(action)


def verb_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """What every verb's parser has (a subcommand's too, e.g. ``fedlib privacy entropy``): its
    defaults in its help, and ``--debug`` (also accepted before the verb)."""
    p.formatter_class = HelpFormatter
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="on an error, the traceback instead of one line")
    return p


def deprecation(old: str, new: str) -> None:
    """The line an old spelling prints (on stderr: stdout may be a result)."""
    print(f"fedlib: warning: {old} is deprecated and goes in the next release; use {new}", file=sys.stderr)


_RENAMED: dict[type, type] = {}


def _renamed(cls: type) -> type:
    """``cls`` (an argparse action) that prints a deprecation line when called by an old name."""
    if cls not in _RENAMED:
        def __call__(self, parser, namespace, values, option_string=None):
            if option_string in self.old_names:
                deprecation(option_string, self.option_strings[0])
            cls.__call__(self, parser, namespace, values, option_string)

        _RENAMED[cls] = type(f"Renamed{cls.__name__}", (cls,), {"__call__": __call__})
    return _RENAMED[cls]


def renamed(parser, flag: str, *old: str, **kwargs) -> argparse.Action:
    """``parser.add_argument(flag, **kwargs)`` that also accepts each of ``old`` for one more
    release (not shown in help; a deprecation line when used)."""
    action = parser.add_argument(flag, *old, **kwargs)
    if old:
        action.old_names = frozenset(old)
        action.__class__ = _renamed(type(action))
    return action


def old_values(renamed: dict[str, str], parse=str):
    """An argument type that reads each old value of ``renamed`` as its new one (with a
    deprecation line), then parses it with ``parse``."""

    def read(value: str):
        if value in renamed:
            deprecation(repr(value), repr(renamed[value]))
            value = renamed[value]
        return parse(value)

    read.__name__ = getattr(parse, "__name__", "value")  # what argparse's "invalid ... value" names
    return read


def comparison_group(value: str) -> str:
    """A comparison group: layer, row, column or N:M (``2of4`` as the workflow's paths write it)."""
    group = value.replace("of", ":")
    n, sep, m = group.partition(":")
    if group in GROUPS or (sep and n.isdigit() and m.isdigit() and 0 < int(n) < int(m)):
        return group
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(GROUPS)} or N:M such as 2:4, got {value!r}")


def input_file(value: str) -> str:
    """A file the verb reads: checked while the arguments are, before any model loads."""
    if not Path(value).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return value


def client_id_argument(value: str) -> str:
    """``--client-id``: the id a mask or weight file carries, checked by the readers' rule
    (:func:`fedlib.protocol.client_id`) before anything is computed."""
    try:
        return client_id(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_group_argument(parser, role: str, default: str, *old: str) -> argparse.Action:
    """``--local-group`` (what a client compares weights within) or ``--server-group`` (what
    the server's aggregation does: FedPrLLM's comparison group, FedSpaLLM's expansion group)."""
    helps = {"local": "the clients' comparison group: layer, row, column or N:M",
             "server": "the server's group: FedPrLLM's comparison group (layer, row, column or N:M), "
                       "FedSpaLLM's mask expansion group"}
    return renamed(parser, f"--{role}-group", *old, type=comparison_group, default=default, metavar="GROUP",
                   help=helps[role])


def add_method_argument(parser, default: str) -> argparse.Action:
    return parser.add_argument("--method", default=default, choices=METHODS, help="the clients' pruning method")


def add_c4_docs_argument(parser, help_text: str) -> argparse.Action:
    return renamed(parser, "--c4-docs", "--docs", type=int, nargs=2, metavar=("START", "STOP"), help=help_text)


def add_previous_global_argument(parser, help_text: str, *old: str) -> argparse.Action:
    """The server's global file of the earlier rounds, one name wherever a verb reads it."""
    return renamed(parser, "--previous-global", *old, type=input_file, metavar="FILE", help=help_text)


def add_threads_argument(parser) -> argparse.Action:
    return parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")


def parse_data_dir(value: str | None) -> Path | None:
    """``--data-dir``: the offline mirror folder (``auto``: ../shared/data, else resources/data, as the
    workflow's data_dir), or None for the Hugging Face hub (omitted, or ``hub``)."""
    from fedlib.mirror import AUTO, resolve_data_dir

    if value == AUTO:
        value = resolve_data_dir(value, ".")
    return None if value in (None, "", "hub") else Path(value)


def set_threads(args) -> None:
    """torch's threads from ``--threads`` (0 or absent: torch's default)."""
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def add_placement_arguments(p) -> None:
    """``--device`` / ``--dtype`` of every verb that runs a model."""
    p.add_argument("--device", default="auto", help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and activations; statistics that decide masks stay float32/float64")


def add_dp_arguments(p, noise_seed: bool = True) -> None:
    """The DP client mechanism's budget (:mod:`fedlib.dp.gaussian`)."""
    p.add_argument("--dp-epsilon", type=float,
                   help="sample-level (replace-one) DP: clip per-sample Wanda statistics and add Gaussian noise "
                        "calibrated to this epsilon over all blocks (PLD accountant); inf = no DP. Wanda only")
    p.add_argument("--dp-delta", type=float, help="the DP delta (with --dp-epsilon), e.g. 1e-5")
    p.add_argument("--dp-clip", type=float,
                   help="L2 bound on one sample's per-channel squared-norm vector (with --dp-epsilon); normalised and "
                        "distributed: on its deviation from the public text's, as a multiple of the public samples' "
                        "own (rms) deviation")
    p.add_argument("--dp-mechanism", default="gaussian", choices=["gaussian", "normalised", "distributed"],
                   help="gaussian: raw statistics, clamped (fedlib.dp.gaussian); normalised: deviations from the public "
                        "text's statistics through the public mask's prefix, shrunk toward them (--dp-estimator; degrades to the public "
                        "mask; fedlib.dp.public); distributed: their secure sum over --dp-clients clients "
                        "(audits only: fedlib privacy dp-federation simulates a federation)")
    p.add_argument("--dp-public", help="normalised/distributed: the public text (token file) the statistics are "
                                       "normalised by and the public mask is computed on")
    p.add_argument("--dp-basis", type=int, help="normalised/distributed: release the deviations in the public text's "
                                                "K leading token directions instead of every channel (default: every "
                                                "channel)")
    p.add_argument("--dp-clients", type=int, help="distributed: the clients that each add 1/sqrt(K) of the noise")
    p.add_argument("--dp-estimator", choices=["threshold", "posterior"],
                   help="normalised/distributed: how the noisy deviations become the estimate (post-processing, "
                        "recorded in x_dp): threshold (default) soft-thresholds them at the noise's family-wise bound "
                        "(the public mask bit for bit where nothing stands out); posterior takes each one's posterior "
                        "mean under the prior fitted to them (keeps more of a domain's gain)")
    if noise_seed:
        p.add_argument("--dp-unit", choices=["client", "window"],
                       help="client: protect this client's whole contribution, its windows' mean deviation clipped "
                            "once (normalised); window: one calibration window, however the windows were drawn (a "
                            "simulation's or audit's unit: needs --dp-allow-seeded-noise). Default: the unit the "
                            "calibration file's windows were cut by, document or span (fedlib calibration-pool --unit)")
        p.add_argument("--dp-noise-seed", type=int,
                       help="seed the DP noise (a simulation: whoever knows the seed can subtract the noise, so the "
                            "mask is not private; x_dp says noise 'seeded'). Needs --dp-allow-seeded-noise; "
                            "default: the OS's cryptographic generator")
        p.add_argument("--dp-allow-seeded-noise", action="store_true",
                       help="accept --dp-noise-seed (a simulation or test, never a site's release)")


def dp_target_from_args(args, unit=None):
    """``--dp-*`` as a :class:`fedlib.dp.gaussian.DPTarget` (the Gaussian mechanism) or a
    :class:`fedlib.dp.public.PublicDP` (``--dp-mechanism normalised|distributed``), or None
    without ``--dp-epsilon`` (``inf`` = the plain Gaussian path, recorded as no DP). ``unit``:
    the protected unit (:class:`fedlib.dp.unit.ProtectedUnit`; None: one window, the audit's game)."""
    prior_options = {"--dp-public": args.dp_public, "--dp-basis": args.dp_basis, "--dp-clients": args.dp_clients,
                     "--dp-estimator": args.dp_estimator}
    if args.dp_epsilon is None:
        if (args.dp_delta is not None or args.dp_clip is not None or getattr(args, "dp_noise_seed", None) is not None
                or getattr(args, "dp_unit", None) is not None or getattr(args, "dp_allow_seeded_noise", False)
                or args.dp_mechanism != "gaussian" or any(v is not None for v in prior_options.values())):
            raise ValueError("--dp-delta, --dp-clip, --dp-unit, --dp-noise-seed, --dp-mechanism and their options need "
                             "--dp-epsilon")
        return None
    if args.dp_delta is None or args.dp_clip is None:
        raise ValueError("--dp-epsilon needs --dp-delta and --dp-clip")
    if args.dp_mechanism == "gaussian":
        given = [flag for flag, value in prior_options.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: options of --dp-mechanism normalised or distributed")
        from fedlib.dp.gaussian import DPTarget
        from fedlib.dp.unit import ProtectedUnit

        return DPTarget(args.dp_epsilon, args.dp_delta, args.dp_clip, unit or ProtectedUnit())
    from fedlib.data import load_tokens
    from fedlib.dp.distributed import public_dp
    from fedlib.dp.unit import ProtectedUnit

    if args.dp_public is None:
        raise ValueError(f"--dp-mechanism {args.dp_mechanism} needs --dp-public (the public text's token file)")
    return public_dp(args.dp_mechanism, args.dp_epsilon, args.dp_delta, args.dp_clip, args.dp_basis or 0,
                     args.dp_clients, load_tokens(Path(args.dp_public))[0], args.dp_estimator or "threshold",
                     unit or ProtectedUnit())
