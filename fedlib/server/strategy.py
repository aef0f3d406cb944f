"""The server protocol every strategy follows, round by round (in the spirit of Flower's
``configure_fit`` / ``aggregate_fit``).

A federation is a sequence of rounds. In round ``t`` the server *configures*: it tells each
client which decoder blocks to prune and what to send (:meth:`Strategy.configure_round` ->
:class:`RoundPlan`). Then it *aggregates*, one prunable linear at a time: every client that
pruned the layer adds its upload to the layer's aggregator (:meth:`Strategy.layer_aggregator`),
and :meth:`LayerAggregator.finish` gives the layer's global mask, the vote counts and (FedSpaLLM)
the global weights. Holding one layer's aggregator at a time is what lets a server of 7B models
run in a few GB whatever the number of clients.

The three federations of the papers are three schedules of the same protocol:

* one-shot FedPrLLM: one round, every client prunes every block and sends masks;
* iterative FedPrLLM: one round per block; round ``l`` is block ``l``, whose global mask is
  broadcast before clients continue to block ``l + 1``;
* FedSpaLLM: ``T`` rounds; each client prunes the blocks the layer sampling assigns it
  (Eq. 8, Algorithm 1) and sends weights and masks.

The simulation drivers (:mod:`fedlib.federation`) and ``fedlib aggregate`` (client files) both go
through these methods, so a strategy's rule is written once. A new strategy is one module with a
:class:`Strategy` subclass, plus one line in :data:`fedlib.server.STRATEGIES` and its name and
settings in :data:`fedlib.protocol.STRATEGIES` and :data:`fedlib.strategy_options.STRATEGY_OPTIONS` (the
command line is built without importing torch): the command line offers it (``--strategy``)
with its :attr:`Strategy.options`, and the workflow's server rule
runs it for a path that names it (``{strategy}_oneshot_{group}``, strategies that aggregate
client mask files). The schedules its global files name belong to the file format's vocabulary
(:data:`fedlib.protocol.SCHEDULES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from fedlib.maskfile import PAYLOAD, MaskFile, MaskFileError
from fedlib.models import LayerInfo
from fedlib.strategy_options import Option


@dataclass(frozen=True)
class RoundPlan:
    """What the server asks of the clients in one round."""

    round: int
    #: per client: the decoder blocks it prunes in this round
    blocks: tuple[tuple[int, ...], ...]
    #: "mask" (FedPrLLM) or "weights+mask" (FedSpaLLM)
    send: str

    def as_dict(self) -> dict:
        return {"round": self.round, "send": self.send, "blocks": [list(b) for b in self.blocks]}


@dataclass
class LayerResult:
    """One layer of the global model: ``mask`` (True = pruned), ``votes`` (clients that pruned
    each weight, or what the strategy records in their place) and, for strategies that
    aggregate weights, ``weight`` (0 where pruned)."""

    mask: torch.Tensor
    votes: torch.Tensor
    weight: torch.Tensor | None = None


class LayerAggregator:
    """One layer's aggregation: uploads in, global layer out."""

    def add(self, client_id: str, mask: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def finish(self) -> LayerResult:
        raise NotImplementedError


class Strategy:
    """Base class of server strategies (module docstring)."""

    name: ClassVar[str] = ""
    #: what clients send: "mask" or "weights+mask"
    send: ClassVar[str] = "mask"
    #: header fields every client of one aggregation must share (the model fingerprint and
    #: layers are checked against the server's model when each file is opened)
    cohort_fields: ClassVar[tuple[str, ...]] = ("method", "group", "sparsity")
    #: what the ``method`` of this strategy's global files starts with (the mask file reader
    #: refuses other global methods: :mod:`fedlib.maskfile`)
    schedules: ClassVar[tuple[str, ...]] = ()
    #: its own settings on the command line (``group``, ``sparsity`` and ``seed`` are every strategy's)
    options: ClassVar[tuple[Option, ...]] = ()

    def n_rounds(self, n_blocks: int) -> int:
        raise NotImplementedError

    def configure_round(self, round_index: int, n_clients: int, n_blocks: int) -> RoundPlan:
        raise NotImplementedError

    def layer_aggregator(self, info: LayerInfo, n_clients: int, allocation: str = "uniform") -> LayerAggregator:
        """The aggregator of layer ``info`` for ``n_clients`` uploads of clients whose local
        method allocates sparsity ``allocation`` (``uniform``, or ``nonuniform``: OWL, BESA)."""
        raise NotImplementedError

    def aggregate(self, paths: Sequence[Path], fingerprint: str, layers: Sequence[LayerInfo], out: Path,
                  **options) -> dict:
        """One round from client files: read the uploads in ``paths`` layer by layer and write the
        global file ``out``. Returns a summary; its ``clients`` is the outlier report
        (:func:`fedlib.server.robust.client_report`), which ``fedlib aggregate`` writes beside ``out``.
        Every strategy takes the option ``cohort``: the values of :attr:`cohort_fields` the clients
        must have (:meth:`check_cohort`)."""
        raise NotImplementedError

    def _check_round(self, round_index: int, n_blocks: int) -> None:
        if not 0 <= round_index < self.n_rounds(n_blocks):
            raise ValueError(f"{self.name}: round {round_index} outside 0..{self.n_rounds(n_blocks) - 1}")

    def check_cohort(self, files: Sequence[MaskFile], expected: Mapping[str, object] | None = None) -> dict:
        """Clients of one aggregation: role ``client``, the payload :attr:`send` says, distinct
        ids, and one value of each of :attr:`cohort_fields`, which is returned. A field's value
        is ``expected[field]`` when the server was told it (``fedlib aggregate --client-method``
        ...), else the value of a strict majority of the files: the order of the files never
        decides who is wrong. The error names every file that disagrees, the field and both
        values."""
        if not files:
            raise ValueError(f"{self.name}: aggregation needs at least one client file")
        expected = dict(expected or {})
        unknown = sorted(set(expected) - set(self.cohort_fields))
        if unknown:
            raise ValueError(f"{self.name}: the cohort is defined by {', '.join(self.cohort_fields)}, not {unknown}")
        senders: dict[str, list[Path]] = {}
        for f in files:
            if f.header.role != "client":
                raise MaskFileError(f.path, "role", f"expected 'client', got {f.header.role!r}")
            if (f.header.payload == PAYLOAD) != (self.send == "weights+mask"):
                holds = "weights and masks" if f.header.payload == PAYLOAD else "masks only"
                raise MaskFileError(f.path, "x_payload", f"{self.name} clients send {self.send}, this file holds {holds}")
            senders.setdefault(f.header.client_id, []).append(f.path)
        for client_id, paths in senders.items():
            if len(paths) > 1:  # which one is the impostor, no file can tell: all are named
                raise MaskFileError(_paths(paths), "client_id", f"{client_id!r} is in {len(paths)} files; "
                                                                "the clients of one aggregation have distinct ids")
        cohort = {}
        agree = f"the clients of one aggregation agree on {', '.join(self.cohort_fields)}"
        for name in self.cohort_fields:
            holders: dict[object, list[Path]] = {}
            for f in files:
                holders.setdefault(getattr(f.header, name), []).append(f.path)
            if name in expected:
                value, source = expected[name], "the server expects"
            else:
                value, majority = max(holders.items(), key=lambda item: len(item[1]))
                if 2 * len(majority) <= len(files):
                    split = "; ".join(f"{v!r} in {_paths(p)}" for v, p in holders.items())
                    raise MaskFileError(_paths([f.path for f in files]), name,
                                        f"no majority among the {len(files)} clients ({split}): {agree}")
                source = f"{len(majority)} of the {len(files)} clients (e.g. {majority[0]}) have"
            odd = [(v, p) for v, paths in holders.items() if v != value for p in paths]
            if odd:
                (first_value, first_path), rest = odd[0], odd[1:]
                also = f" (also disagreeing: {'; '.join(f'{p} has {v!r}' for v, p in rest)})" if rest else ""
                raise MaskFileError(first_path, name, f"{first_value!r}, but {source} {value!r}{also}: {agree}")
            cohort[name] = value
        return cohort


def _paths(paths: Sequence[Path]) -> str:
    return ", ".join(str(p) for p in paths)
