"""Each server strategy's own settings, as ``fedlib configure`` / ``fedlib aggregate`` offer them
(:attr:`fedlib.server.strategy.Strategy.options`).

A leaf beside :mod:`fedlib.protocol`: the command line is built from these without importing
the strategies (torch); tests/test_protocol.py keeps them equal to the registered strategies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedlib.protocol import FEDPRLLM_SCHEDULES, ROBUST_RULES, ROUNDINGS, SAMPLERS


@dataclass(frozen=True)
class Option:
    """A setting of one strategy that ``fedlib configure`` / ``fedlib aggregate`` offer as
    ``--<flag>`` (the field's name unless ``flag`` says otherwise): the strategy's dataclass
    field, what the help says, and how argparse reads it (``many``: one or more values, given to
    the strategy as a tuple). ``aggregation_only``: it changes the aggregation, not the round
    plan, so only ``fedlib aggregate`` offers it. ``old``: earlier spellings of the flag;
    ``old_values``: (old, new) spellings of its values. An option not given keeps the
    strategy's default."""

    field: str
    help: str
    type: Callable[[str], object] | None = None
    choices: tuple[str, ...] | None = None
    many: bool = False
    aggregation_only: bool = False
    flag: str | None = None
    old: tuple[str, ...] = ()
    old_values: tuple[tuple[str, str], ...] = ()


#: each strategy's own settings (:attr:`fedlib.server.strategy.Strategy.options`), declared here
#: so that the command line is built without importing the strategies (torch)
STRATEGY_OPTIONS: dict[str, tuple[Option, ...]] = {
    "fedprllm": (
        Option("mode", "one round over every block (default), or one round per block", choices=FEDPRLLM_SCHEDULES,
               flag="schedule", old=("--mode",), old_values=(("oneshot", "one-shot"), ("fedprllm-iterative", "iterative"))),
        Option("robust", "count only the votes of the clients this rule does not flag; rules "
                         "(fedlib.server.robust): mad = distance to the leave-one-out majority mask above "
                         "median + 3.5 * 1.4826 MAD. Default: every client's votes",
               choices=ROBUST_RULES, aggregation_only=True),
    ),
    "fedspallm": (
        Option("rounds", "number of rounds T", type=int),
        Option("resources", "per client, the fraction of the blocks it prunes per round (layer sampling)",
               type=float, many=True),
        Option("sampler", "layer sampler", choices=SAMPLERS),
        Option("rounding", "expansion target, Eq. 7 (ceil)", choices=ROUNDINGS, aggregation_only=True),
    ),
}

#: what each strategy's clients send (:attr:`fedlib.server.strategy.Strategy.send`), declared here so
#: that the workflow picks the strategies its server rule runs (those of client mask files) without torch
STRATEGY_SENDS: dict[str, str] = {"fedprllm": "mask", "fedspallm": "weights+mask"}
