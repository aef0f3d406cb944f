"""Byzantine-robust FedPrLLM: screen the clients by their distance to the consensus, count only
the votes of those the rule keeps; and the per-client outlier report of every aggregation.

A Byzantine client can send any mask that passes the file checks: an inverted one (the
complement within each row is still exactly 50 % per row), a random one, one computed on
garbage. Plain vote counting gives it one vote per weight like everyone else, so ``f`` such
clients move every weight's count by up to ``f`` and decide every weight near the selection
threshold. (Measured on the embedded model, that is less harmful than it sounds: 2 to 6 of 16
clients sending inverted, random or garbage-data masks change 0.6-3.6 % of the global bits and
do not raise the WikiText-2 perplexity, because the weights a minority can flip are the
marginal ones. What screening adds is a bound on how far from the others any counted mask
may be, whatever it aims at.)
What a careful server can do with binary masks and no trusted data:

Distance to the consensus (:class:`ConsensusDistance`)
    Per layer and client ``i``, the consensus is the *leave-one-out majority mask*: a weight is
    pruned in it when more than half of the other ``n - 1`` clients pruned it (``2·(C - m_i) >
    n - 1``, ``C`` the layer's vote counts); a weight the others split exactly evenly counts half
    a disagreement whatever ``i`` sent. ``i``'s distance is its disagreements summed over the
    layers, divided by the weights compared (a fraction of the model: big layers weigh more).
    Leaving ``i`` out keeps a client from voting for itself (which matters with few clients);
    the majority, unlike the mean of the others' masks, is not moved by a minority of attackers,
    so the honest clients' distances stay where they would be without them. It is elementwise on
    the counts, so it costs no selection and does not depend on the server's group. On the
    embedded model (16 IID clients, Wanda 50 % row) honest clients disagree with it on 3-5 % of
    the weights; an inverted mask on about 96 %, a random one on 50 %, a Wanda mask computed on
    uniform random tokens on 8-9 % (benchmarks/bench_byzantine.py).
Rule ``mad`` (:class:`MedianMAD`)
    ``z_i = (d_i - median(d)) / (1.4826 · MAD(d))``, the robust z-score (1.4826·MAD estimates
    the standard deviation of normal data; median and MAD tolerate up to half the clients being
    arbitrary). Flagged: ``z_i > k``, ``k = 3.5`` (Iglewicz and Hoaglin's cut-off for the
    modified z-score). One-sided: being closer to the consensus than the others is no evidence
    of an attack. At least half the clients are never flagged (their distance is at most the
    median). When more than half the clients are exactly at the median (MAD = 0: e.g. identical
    masks), differences below :data:`MIN_SPREAD` of the weights are not counted as evidence.
    With ``robust="mad"`` the server counts the votes of the clients kept only: ``n`` is their
    number (so weight scaling's ``(m - M_hat) / m`` uses the right ``m``, and a non-uniform
    allocation's planned sparsity is their mean), and the global file names the rule and the
    excluded clients (``x_robust``, ``x_excluded_clients``).
What an adaptive attacker does, and what this cannot bound
    Knowing the rule, an attacker keeps its distance under the threshold, median + 3.5 robust
    standard deviations (about 5 % of the weights on the embedded model, against the honest
    clients' 3-5 %): it spends that small budget where it hurts, e.g. on the weights whose
    honest counts sit at the selection threshold, or on a whole small layer (inverting a
    576×192 ``k_proj`` costs 0.1 % of the weights). A kept client still has one vote per
    weight, as in plain FedPrLLM; the rule bounds how many weights it can push, not which ones.
    An attacker that knows an honest client's mask can also frame it: the complement votes
    against that client on every weight, which turns the others' majority against it wherever
    they are close to a tie; with few clients that can get the honest client flagged (it costs
    that client's votes; at most half the clients are ever flagged).
    It cannot bound: attackers at or above half the clients (the median is then theirs), and
    before that, a large minority that sits together at a moderate distance: it inflates the
    MAD (6 garbage-data clients of 16 are at z 2.6-2.9, none flagged, where 2 or 4 are at
    z >= 5.8; 6 inverted or random ones, far out, are all flagged);
    attackers that compute honest-looking masks on chosen data (a mask computed on real but
    skewed text is as close to the consensus as an honest non-IID client's: the server sees
    masks, not data); Sybils (many identities, one operator), which need authentication; and
    it flags an honest client whose data differ more from the others' than an attacker's would
    (false positives are the price: among 10 to 16 IID honest clients the measurement flags
    none, largest z 2.2).

The outlier report (:func:`client_report`) is written beside every ``fedlib aggregate`` output,
robust or not: per client file, its distance, robust z-score, whether the rule flags it and
whether its votes were used. The distances need each layer's counts before each client's bits,
so every client's layer is read twice (one client's layer in memory at a time); the robust
server reads it a third time to count the kept votes after all distances are known.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

CONSENSUS = "leave-one-out majority mask (half a disagreement where the other clients split evenly)"
#: 1.4826 · MAD estimates the standard deviation of normally distributed data
MAD_TO_SIGMA = 1.4826
#: the least spread the rule assumes (a fraction of the weights): with MAD = 0, a client that
#: differs from the median distance by less than k times this is not flagged
MIN_SPREAD = 1e-4


class ConsensusDistance:
    """Each client's disagreements with the leave-one-out majority mask, accumulated layer by
    layer (module docstring). ``files`` are open client files (``header.client_id``,
    ``layer_mask(name)``)."""

    def __init__(self, files: Sequence):
        self.files = list(files)
        # in half weights, so ties stay integers: the distances are exact ratios of integers
        self.half_disagreements = {f.header.client_id: 0 for f in self.files}
        self.compared = {f.header.client_id: 0 for f in self.files}

    def add_layer(self, name: str, senders: Sequence | None = None, counts: torch.Tensor | None = None) -> None:
        """Layer ``name`` of the ``senders`` (default: every file). ``counts``: the layer's vote
        counts over exactly those senders when the caller already has them; otherwise they are
        counted here (one read of each sender's layer). Each sender's layer is then read again."""
        senders = self.files if senders is None else list(senders)
        n = len(senders)
        if n < 2:  # no other client to compare with
            return
        if counts is None:
            counts = senders[0].layer_mask(name).to(torch.int16)
            for f in senders[1:]:
                counts += f.layer_mask(name)
        counts = counts.reshape(-1).long()
        # a client's half-disagreements on a weight depend only on its bit and the count: from
        # per-count tables, a client's total is the layer's cost of keeping every weight plus,
        # over the weights it pruned, the difference (one multiply-add over its bits)
        values = torch.arange(n + 1)
        kept_cost = _half_disagreements(2 * values, n, pruned=False)
        pruned_cost = _half_disagreements(2 * (values - 1), n, pruned=True)
        all_kept = int((torch.bincount(counts, minlength=n + 1) * kept_cost).sum())
        extra_if_pruned = (pruned_cost - kept_cost).to(torch.int8)[counts]
        for f in senders:
            mask = f.layer_mask(name).reshape(-1)
            cid = f.header.client_id
            self.half_disagreements[cid] += all_kept + int((extra_if_pruned * mask).sum())
            self.compared[cid] += mask.numel()

    def distances(self) -> dict[str, float | None]:
        """client id -> fraction of its compared weights that disagree (None: never compared)."""
        return {cid: (half / (2 * self.compared[cid]) if self.compared[cid] else None)
                for cid, half in self.half_disagreements.items()}


def _half_disagreements(twice_others: torch.Tensor, n: int, pruned: bool) -> torch.Tensor:
    """Half-disagreements (0, 1 or 2) of a client's bit with the majority of the other ``n - 1``
    clients, ``twice_others`` being twice the number of them that pruned the weight."""
    majority = twice_others > n - 1
    disagree = ~majority if pruned else majority
    return torch.where(twice_others == n - 1, 1, torch.where(disagree, 2, 0))


@dataclass(frozen=True)
class Screening:
    """A rule's verdict on one aggregation's clients."""

    rule: str
    k: float
    median: float | None
    mad: float | None
    #: the spread z-scores are measured in: max(1.4826 · MAD, MIN_SPREAD)
    scale: float | None
    #: distances above this are flagged
    threshold: float | None
    z: dict[str, float | None]
    flagged: dict[str, bool]


@dataclass(frozen=True)
class MedianMAD:
    """Flag ``z > k`` with the robust z-score of the distances (module docstring)."""

    k: float = 3.5
    name: ClassVar[str] = "mad"

    def __post_init__(self):
        if not self.k > 0:
            raise ValueError(f"robust rule {self.name}: k must be > 0 (got {self.k}); k <= 0 could flag every client")

    def screen(self, distances: Mapping[str, float | None]) -> Screening:
        scored = [d for d in distances.values() if d is not None]
        if not scored:
            return Screening(self.name, self.k, None, None, None, None,
                             {cid: None for cid in distances}, {cid: False for cid in distances})
        median = statistics.median(scored)
        mad = statistics.median(abs(d - median) for d in scored)
        scale = max(MAD_TO_SIGMA * mad, MIN_SPREAD)
        z = {cid: None if d is None else (d - median) / scale for cid, d in distances.items()}
        flagged = {cid: v is not None and v > self.k for cid, v in z.items()}
        return Screening(self.name, self.k, median, mad, scale, median + self.k * scale, z, flagged)


#: robust rules by name (``FedPrLLM(robust=...)``, ``fedlib aggregate --robust``)
RULES = {MedianMAD.name: MedianMAD}
#: the rule of the report when the server is not robust
DEFAULT_RULE = MedianMAD.name


def screening_rule(name: str | None):
    """The rule ``name`` (None: the report's default rule)."""
    if name is None:
        name = DEFAULT_RULE
    if name not in RULES:
        raise ValueError(f"robust rule {name!r}: expected one of {sorted(RULES)}")
    return RULES[name]()


def client_report(files: Iterable, distance: ConsensusDistance, screening: Screening, used: set[str],
                  robust: bool) -> dict:
    """The outlier report of one aggregation: per client file, its distance to the consensus,
    robust z-score, whether the rule flags it and whether its votes were counted."""
    files = list(files)
    distances = distance.distances()
    return {
        "consensus": CONSENSUS,
        "rule": screening.rule,
        "k": screening.k,
        "robust": robust,
        "median_distance": screening.median,
        "mad": screening.mad,
        "scale": screening.scale,
        "threshold": screening.threshold,
        "n_clients": len(files),
        "n_used": sum(f.header.client_id in used for f in files),
        "clients": [
            {"client_id": f.header.client_id, "path": str(f.path), "distance": distances[f.header.client_id],
             "weights_compared": distance.compared[f.header.client_id], "z": screening.z[f.header.client_id],
             "flagged": screening.flagged[f.header.client_id], "used": f.header.client_id in used}
            for f in files
        ],
    }
