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
:class:`Strategy` subclass, plus one line in :data:`fedlib.server.STRATEGIES` (and the config
schema's enum when the workflow should offer it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from fedlib.maskfile import MaskFile, MaskFileError
from fedlib.models import LayerInfo


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
        (:func:`fedlib.server.robust.client_report`), which ``fedlib aggregate`` writes beside ``out``."""
        raise NotImplementedError

    def _check_round(self, round_index: int, n_blocks: int) -> None:
        if not 0 <= round_index < self.n_rounds(n_blocks):
            raise ValueError(f"{self.name}: round {round_index} outside 0..{self.n_rounds(n_blocks) - 1}")

    def check_cohort(self, files: Sequence[MaskFile]) -> None:
        """Clients of one aggregation: role ``client``, distinct ids, and the same
        :attr:`cohort_fields`; the error names the odd file, the field and both values."""
        if not files:
            raise ValueError(f"{self.name}: aggregation needs at least one client file")
        seen: dict[str, Path] = {}
        for f in files:
            if f.header.role != "client":
                raise MaskFileError(f.path, "role", f"expected 'client', got {f.header.role!r}")
            if f.header.client_id in seen:
                raise MaskFileError(f.path, "client_id", f"{f.header.client_id!r} also sent {seen[f.header.client_id]}")
            seen[f.header.client_id] = f.path
        first = files[0].header
        for f in files[1:]:
            for name in self.cohort_fields:
                if getattr(f.header, name) != getattr(first, name):
                    raise MaskFileError(
                        f.path, name, f"{getattr(f.header, name)!r}, but {first.path} has {getattr(first, name)!r}: "
                        f"the clients of one aggregation agree on {', '.join(self.cohort_fields)}")
