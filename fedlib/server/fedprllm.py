"""FedPrLLM server: sum the client masks, keep the top-k most-voted per comparison group.

M_hat = sum_i M_i counts, per weight, the clients that want it pruned; the global mask prunes
the k weights with the most votes in each group (layer / row / column / N:M), ties broken by
seeded keys (the reference breaks layer ties randomly and row/column ties by index; a seeded
random order is deterministic and unbiased). Optional weight scaling multiplies surviving
weights by (m - M_hat) / m at application time, so the global file keeps the vote counts.

Schedules (:mod:`fedlib.server.strategy`): ``mode="one-shot"`` is one round over all blocks,
``mode="iterative"`` one round per block. Defences act on the votes, not as another server: a
:class:`VoteHook` may replace each client's bits before they are counted (a local randomizer,
e.g. randomized response) and the counts before the selection, and says what the global file
records in place of the true counts.

The aggregation streams over layers: at any time it holds one layer's counts plus one
client's bits of that layer, whatever the number of clients, and writes each layer's global
mask and counts to the output as it goes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedlib import progress
from fedlib.groups import prune_lowest
from fedlib.maskfile import MaskFile, MaskFileError, MaskWriter
from fedlib.models import LayerInfo
from fedlib.protocol import FEDPRLLM_SCHEDULES
from fedlib.server.robust import ConsensusDistance, client_report, screening_rule
from fedlib.strategy_options import STRATEGY_OPTIONS, STRATEGY_SENDS
from fedlib.server.strategy import LayerAggregator, LayerResult, RoundPlan, Strategy

#: schedule -> the ``method`` prefix of its global files
SCHEDULES = dict(zip(FEDPRLLM_SCHEDULES, ("fedprllm", "fedprllm-iterative")))
MODES = FEDPRLLM_SCHEDULES


def global_mask_from_votes(votes: torch.Tensor, sparsity: float, group: str, seed: int, name: str) -> torch.Tensor:
    """Prune the most-voted weights: lowest of -votes within each group."""
    return prune_lowest(-votes.to(torch.float32), sparsity, group, seed, f"server:{name}")


def planned_sparsity(votes: torch.Tensor, n_clients: int) -> float:
    """A layer's server target when clients allocate sparsity per layer (OWL, BESA): the mean of
    the clients' pruned fractions, sum(votes) / (n * numel). The papers are silent here; a
    uniform server target would discard the allocation the local method planned."""
    return float(votes.sum(dtype=torch.int64)) / (n_clients * votes.numel())


def scale_factors(votes: torch.Tensor, n_clients: int) -> torch.Tensor:
    """(m - M_hat) / m: the FedAvg of the clients' locally pruned weights, relative to W."""
    return (n_clients - votes.to(torch.float32)) / n_clients


class VoteHook:
    """A defence on FedPrLLM's votes; the default changes nothing. Subclasses override what
    they change. ``label`` is appended to the global file's method, ``header_extra()`` goes into
    its metadata."""

    label: str = ""
    #: True when :meth:`client_mask` changes bits (the counts of true and reported bits differ)
    randomizes_clients: bool = False

    def client_mask(self, client_id: str, name: str, mask: torch.Tensor) -> torch.Tensor:
        """What client ``client_id`` reports for layer ``name`` instead of its true ``mask``."""
        return mask

    def counts(self, info: LayerInfo, counts: torch.Tensor, n_clients: int) -> torch.Tensor:
        """The counts the selection sees, from the reported ones (e.g. their noisy law)."""
        return counts

    def recorded_votes(self, info: LayerInfo, observed: torch.Tensor, n_clients: int) -> torch.Tensor:
        """What the global file's ``votes:`` tensor holds (int16): by default the counts seen."""
        return observed

    def finished(self, info: LayerInfo, true_counts: torch.Tensor, observed: torch.Tensor,
                 mask: torch.Tensor) -> None:
        """Called once per layer after the selection, for a defence's own measurements (the true
        counts are the simulation's view, never the server's)."""

    def header_extra(self) -> dict[str, str]:
        return {}


class VoteCount(LayerAggregator):
    """One layer's votes; :meth:`finish` selects the global mask."""

    def __init__(self, strategy: "FedPrLLM", info: LayerInfo, n_clients: int, allocation: str):
        self.strategy, self.info, self.n_clients, self.allocation = strategy, info, n_clients, allocation
        self.true = torch.zeros(info.shape, dtype=torch.int16)
        hook = strategy.hook
        self.reported = torch.zeros(info.shape, dtype=torch.int16) if hook and hook.randomizes_clients else None

    def add(self, client_id: str, mask: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        mask = mask.to("cpu")  # the server counts on the host, whichever device a client masked on
        self.true += mask.to(torch.int16)
        if self.reported is not None:
            self.reported += self.strategy.hook.client_mask(client_id, self.info.name, mask).to(torch.int16)

    def add_counts(self, counts: torch.Tensor) -> None:
        """Votes already summed over clients (what secure aggregation gives the server)."""
        if self.reported is not None:
            raise ValueError(f"{self.info.name}: a hook that randomizes each client's bits needs them one by one")
        self.true += counts.reshape(self.info.shape).to(torch.int16)

    def finish(self) -> LayerResult:
        s, info, n = self.strategy, self.info, self.n_clients
        counts = self.true if self.reported is None else self.reported
        observed = counts if s.hook is None else s.hook.counts(info, counts, n)
        mask = global_mask_from_votes(observed, s.layer_sparsity(info.name, observed, n, self.allocation),
                                      s.group, s.seed, info.name)
        if s.hook is None:
            return LayerResult(mask, observed)
        s.hook.finished(info, self.true, observed, mask)
        return LayerResult(mask, s.hook.recorded_votes(info, observed, n))


@dataclass
class FedPrLLM(Strategy):
    """``group``: server comparison group; ``sparsity``: the server's target (a float, or a
    per-layer mapping); clients whose method allocates per layer (``nonuniform`` mask files:
    OWL, BESA) are followed instead, each layer pruned at the mean of their fractions, unless
    ``follow_client_plan`` is False. ``hook``: a defence on the votes (:class:`VoteHook`).
    ``robust``: a rule of :data:`fedlib.server.robust.RULES` (``"mad"``); the file aggregation
    then counts only the votes of the clients it does not flag (one-shot only)."""

    group: str = "layer"
    sparsity: float | Mapping[str, float] = 0.5
    seed: int = 0
    mode: str = "one-shot"
    follow_client_plan: bool = True
    hook: VoteHook | None = field(default=None, repr=False)
    robust: str | None = None

    name = "fedprllm"
    send = STRATEGY_SENDS["fedprllm"]
    cohort_fields = ("method", "group", "sparsity", "allocation")
    schedules = tuple(SCHEDULES.values())
    options = STRATEGY_OPTIONS["fedprllm"]

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"FedPrLLM mode must be one of {MODES}, got {self.mode!r}")
        if self.robust is not None:
            screening_rule(self.robust)
            if self.mode != "one-shot":
                # each round would screen one block and could exclude other clients, while the
                # global file has one n_clients for every block's weight scaling
                raise ValueError("fedprllm: robust aggregation is one-shot only (each round of iterative "
                                 "FedPrLLM would exclude its own clients)")

    def n_rounds(self, n_blocks: int) -> int:
        return 1 if self.mode == "one-shot" else n_blocks

    def configure_round(self, round_index: int, n_clients: int, n_blocks: int) -> RoundPlan:
        self._check_round(round_index, n_blocks)
        blocks = tuple(range(n_blocks)) if self.mode == "one-shot" else (round_index,)
        return RoundPlan(round_index, (blocks,) * n_clients, self.send)

    def layer_sparsity(self, name: str, votes: torch.Tensor, n_clients: int, allocation: str) -> float:
        """The sparsity layer ``name`` is pruned at (class docstring)."""
        if allocation == "nonuniform" and self.follow_client_plan:
            return planned_sparsity(votes, n_clients)
        return self.sparsity[name] if isinstance(self.sparsity, Mapping) else self.sparsity

    def layer_aggregator(self, info: LayerInfo, n_clients: int, allocation: str = "uniform") -> VoteCount:
        return VoteCount(self, info, n_clients, allocation)

    def open_clients(self, paths: Sequence[Path], fingerprint: str, layers: Sequence[LayerInfo],
                     cohort: Mapping[str, object] | None = None, reference=None) -> tuple[list[MaskFile], dict]:
        """The clients' files, header-checked, and what they agree on (:meth:`check_cohort`);
        ``reference`` decodes version 2 files (:class:`fedlib.maskcode.MagnitudeReference`)."""
        files = [MaskFile(p, fingerprint, layers, whole_model=self.mode == "one-shot", reference=reference)
                 for p in paths]
        return files, self.check_cohort(files, cohort)

    def global_method(self, client_method: str) -> str:
        """The global file's ``method``: the schedule, the clients' method, the hook's label."""
        return f"{SCHEDULES[self.mode]}[{client_method}]{self.hook.label if self.hook else ''}"

    def round_layers(self, layers: Sequence[LayerInfo], round_index: int | None
                     ) -> tuple[list[LayerInfo], list[LayerInfo]]:
        """(layers settled in earlier rounds, layers this round aggregates)."""
        if self.mode == "one-shot":
            if round_index not in (None, 0):
                raise ValueError(f"fedprllm one-shot has one round (0), got round {round_index}")
            return [], list(layers)
        if round_index is None:
            raise ValueError("fedprllm iterative: give the round (round l aggregates block l)")
        self._check_round(round_index, 1 + max(info.block for info in layers))
        return ([info for info in layers if info.block < round_index],
                [info for info in layers if info.block == round_index])

    def open_previous(self, path: Path | None, fingerprint: str, settled: Sequence[LayerInfo],
                      n_clients: int, cohort: Mapping[str, object], round_index: int | None) -> MaskFile | None:
        """The global file of the earlier rounds of an iterative federation: it holds exactly the
        settled blocks' layers, with votes, from the same server settings and number of clients."""
        if not settled:
            if path is not None:
                raise ValueError(f"fedprllm: round {round_index or 0} has no earlier global file to continue")
            return None
        if path is None:
            raise ValueError(f"fedprllm iterative: round {round_index} continues the global file of rounds "
                             f"0..{round_index - 1} (give it as the previous file)")
        previous = MaskFile(path, fingerprint, settled, whole_model=False)
        expected = {"role": "global", "method": self.global_method(cohort["method"]), "group": self.group,
                    "sparsity": self.sparsity, "allocation": cohort["allocation"], "n_clients": n_clients}
        for name, value in expected.items():
            if getattr(previous.header, name) != value:
                raise MaskFileError(path, name, f"expected {value!r} (this round's server and clients), "
                                                f"got {getattr(previous.header, name)!r}")
        if not previous.has_votes():
            raise MaskFileError(path, "votes", "a global file of earlier rounds carries its vote counts")
        return previous

    def aggregate(self, paths: Sequence[Path], fingerprint: str, layers: Sequence[LayerInfo], out: Path,
                  *, round_index: int | None = None, previous: Path | None = None,
                  cohort: Mapping[str, object] | None = None, reference=None, absent: Sequence[str] = ()) -> dict:
        """One round from client files. One-shot: the clients' files cover every layer.
        Iterative round ``l``: they cover block ``l``; the output is ``previous`` (blocks < l)
        plus block ``l``, so the last round's file is the whole global mask. ``reference``:
        the public model's, for clients that send version 2 files. ``absent``: clients of the
        federation whose upload this round lacks, recorded in the global file. The summary's
        ``clients`` is the outlier report (:func:`fedlib.server.robust.client_report`; None when a
        hook randomizes what clients report: the server never sees their true bits)."""
        if isinstance(self.sparsity, Mapping):
            raise ValueError("fedprllm: file aggregation takes one server sparsity (a float)")
        settled, current = self.round_layers(layers, round_index)
        files, agreed = self.open_clients(paths, fingerprint, current, cohort, reference)
        earlier = self.open_previous(previous, fingerprint, settled, len(files), agreed, round_index)
        hook = self.hook or VoteHook()
        if self.robust and hook.randomizes_clients:
            raise ValueError("fedprllm: robust screening needs the clients' own bits, a hook randomizes them")
        rule = screening_rule(self.robust)
        distance = None if hook.randomizes_clients else ConsensusDistance(files)
        kept, extra, screening = files, hook.header_extra(), None
        if self.robust:  # pass 1: every distance before any vote is counted
            for info in current:
                distance.add_layer(info.name)
            screening = rule.screen(distance.distances())
            kept = [f for f in files if not screening.flagged[f.header.client_id]]
            excluded = sorted(f.header.client_id for f in files if screening.flagged[f.header.client_id])
            extra = {**extra, "robust": f"{rule.name}:k={rule.k}", "excluded_clients": json.dumps(excluded)}

        def vote(info: LayerInfo, layer: VoteCount) -> None:  # from the clients' files, one layer at a time
            for f in kept:
                layer.add(f.header.client_id, f.layer_mask(info.name))
            if distance is not None and not self.robust:  # every client voted: the counts are theirs
                distance.add_layer(info.name, counts=layer.true)

        self.write_round(out, fingerprint, settled, current, earlier, agreed, len(kept),
                         sum(f.header.n_samples for f in kept), extra, vote, absent)
        report = None
        if distance is not None:
            screening = screening or rule.screen(distance.distances())
            report = client_report(files, distance, screening, {f.header.client_id for f in kept}, bool(self.robust))
        return {"n_clients": len(files), "n_used": len(kept), "group": self.group, "sparsity": self.sparsity,
                "allocation": agreed["allocation"], "mode": self.mode, "layers": len(current), "clients": report}

    def write_round(self, out: Path, fingerprint: str, settled: Sequence[LayerInfo], current: Sequence[LayerInfo],
                    earlier: MaskFile | None, cohort: Mapping[str, object], n_clients: int, n_samples: int,
                    extra: Mapping[str, str], vote: Callable[[LayerInfo, VoteCount], None],
                    absent: Sequence[str] = ()) -> None:
        """Write a round's global file: the ``settled`` layers copied from ``earlier`` (the global
        file of the earlier rounds), then each layer of ``current`` selected from the votes
        ``vote(info, layer)`` adds to its :class:`VoteCount` (from client files, or the sums
        secure aggregation unmasks), for ``n_clients`` clients of ``cohort`` with ``n_samples``
        samples in all. ``absent``: clients of the federation whose upload this round lacks."""
        if absent:
            extra = {**extra, "absent_clients": json.dumps(sorted(absent))}
        with MaskWriter(
            out, list(settled) + list(current), fingerprint=fingerprint, role="global", client_id="server",
            method=self.global_method(cohort["method"]), group=self.group, sparsity=self.sparsity,
            allocation=cohort["allocation"], n_samples=n_samples, seed=self.seed, n_clients=n_clients, votes=True,
            extra=extra or None,
        ) as writer:
            for info in settled:
                mask = earlier.layer_mask(info.name)
                writer.add(info.name, mask, earlier.layer_votes(info.name, mask))
            for info in progress.track(current, "layer"):  # one layer at a time, the votes to the global file
                layer = self.layer_aggregator(info, n_clients, cohort["allocation"])
                vote(info, layer)
                result = layer.finish()
                writer.add(info.name, result.mask, result.votes)
