"""DP Wanda masks that degrade to the public mask (issue 29): per-sample statistics normalised
by public text's, clipped, noised, and shrunk toward the public prior.

Why. The Gaussian mechanism of :mod:`fedlib.dp.gaussian` clips each sample's raw per-channel
energy vector, so a few outlier channels use up the clip, and it clamps the noisy sums at 0,
which prunes whole columns: at any useful ε its masks are far worse than Wanda on public text
alone. Here the public text is the prior and the private data only corrects it.

Public prefix. The server (or the client itself) runs plain Wanda on public text; its masks are
the *public mask*. A client's statistics of block b, private and public alike, are taken through
blocks < b pruned by the public mask, which depends on public data only. So every release is
non-adaptive, one pass yields the masks of every ε, the same public text gives every client the
same prior, and the release of a block does not depend on the earlier releases (a distributed
sum needs no round per block: one round in all).

Statistic. For release r (a block input that one or more linears read,
:func:`fedlib.dp.gaussian.input_key`) with public per-token channel energy p_j (Wanda's
mean x_j^2 on the public text), sample s with T tokens and channel energies v_s[j] gives the
relative deviation u_s[j] = v_s[j] / (T p_j) - 1, or its coefficients B u_s in a public basis B
(``basis`` = k rows, :func:`public_basis`). u_s is L2-clipped to C_r = ``clip`` x (the rms norm of
the public samples' own u), a data-independent scale. u_s is signed: the replace-one sensitivity
of the sum is 2 C_r (two clipped vectors can point in opposite directions), not sqrt(2) C_r as
for the non-negative vectors of :mod:`fedlib.dp.gaussian`. The noise is N(0, (sigma 2 C_r)^2) per
coordinate.

Estimate (post-processing; ``estimator`` in ``x_dp``). With n samples, the noisy mean deviation
d = (sum + noise) / n is turned into the estimate one of two ways.

``threshold`` (the default): d is soft-thresholded coordinate by coordinate toward 0 (the public value): d_j -> sign(d_j)
max(|d_j| - lambda, 0), lambda = z s, s = sigma 2 C_r / n the noise's std and z the normal
quantile that every coordinate the pass releases (all blocks' inputs) stays below under noise
alone with probability 1 - ``FALSE_KEEP`` = 99.9 % (Bonferroni over the coordinates). lambda depends on
the noise level and the shapes only. So where the private data carries no deviation that stands
out of the noise, the mask is the public mask bit for bit (with probability >= 99.9 % over
the noise), and where it does, a coordinate moves by its excess over lambda: a domain's deviation sits
in few channels, and those are the ones that clear the threshold first. The channel energy is then
m_j = p_j max(1 + d_j, 0) (in a basis, 1 + B^T d); the clamp is post-processing. Without noise
(lambda = 0, no clip) m is the private mean energy exactly. (A Gaussian-prior shrinkage
tau^2 / (tau^2 + s^2) with tau the public samples' per-sample spread, this module's first
estimator, let the noise through as n grows and made masks worse than public-only at epsilon = 8
in the domain study; the threshold does not.) With a basis the noise in each channel falls by
sqrt(d/k) on average (B^T spreads k noisy coordinates over d channels), at the price of the part
of the deviation outside the basis; and B^T spreads the deviation it keeps over every channel its
directions mix (a domain's deviation sits in few channels, which no public basis predicts on
SmolLM2).

``posterior``: first a test of the whole input: unless sum_j (d_j / s)^2 exceeds the chi-square
quantile that noise alone stays below with probability 1 - ``FALSE_KEEP`` / (the pass's releases)
(Bonferroni over the inputs), the input keeps the public value. So where the private data carry
no deviation, the mask is the public mask bit for bit with probability >= 99.9 %, as with the
threshold. An input that passes gets each coordinate's posterior mean given d_j = mu_j + N(0, s^2),
under the prior on mu that best explains all of the input's noisy coordinates: a discrete prior on ``PRIOR_GRID``
points spanning them (and 0), its weights the nonparametric maximum-likelihood estimate, fitted by
``PRIOR_ITERATIONS`` EM steps (Kiefer & Wolfowitz 1956; Jiang & Zhang 2009, "General maximum
likelihood empirical Bayes"). It reads only d and s. Where the threshold keeps the few coordinates
far above the noise, the posterior shrinks each coordinate by how often values like it are signal,
so the many moderate deviations that carry most of a domain's gain pass in part. In the domain
study (PTB clients, n = 1024, distributed sum at epsilon = 8, 50 %) the threshold keeps 28 % of the
in-domain gain and the posterior 67 % (``fedlib.privacy.dp_headroom``); held out (chosen on PTB
validation, scored on PTB test over 2 data seeds x 3 noise draws) the posterior keeps 43 % [28 %, 56 %],
one release 21-63 % (``config/domain_heldout.yaml``). The test is what keeps it
from hurting where there is nothing to find: without it, on C4 clients at epsilon = 8 (each input's
signal about 3 % of the noise per coordinate) the fitted prior let a few percent of the noise
through and the mask was 1 % worse than the public one in PTB perplexity.

Accounting: ``releases`` Gaussian mechanisms of noise multiplier sigma (std / sensitivity), PLD
as in :mod:`fedlib.dp.gaussian`; the public text and the public mask are constants. The distributed
mechanism (the sum of every client's statistic under secure aggregation, each client adding
1/sqrt(K) of the noise) is in :mod:`fedlib.dp.distributed` (which imports this module, not
the reverse; :func:`fedlib.dp.distributed.public_dp` builds either); both run in :func:`federation_pass`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from fedlib.client import Pruning, decide_block, resolve_method
from fedlib.methods.base import LayerPruner
from fedlib.methods.wanda import WandaPruner, wanda_scores
from fedlib.dp.gaussian import (
    ACCOUNTANT,
    NEIGHBOURS,
    RELEASE_FIELDS,
    calibrate_sigma,
    count_releases,
    input_key,
)
from fedlib.dp.samplers import SEEDED, NoiseSource
from fedlib.dp.unit import CLIENT, ProtectedUnit
from fedlib.runner import BlockDecision, BlockRunner

#: the mechanisms of this module's family (``x_dp``'s ``mechanism``)
NORMALISED = "normalised"
#: replace-one sensitivity of a sum of vectors clipped to C that may point anywhere: 2 C
SIGNED_SENSITIVITY = 2.0
#: the chance that noise alone moves any coordinate of a pass off the public prior
FALSE_KEEP = 1e-3
#: header fields of a normalised mechanism's ``x_dp``, in the writer's order
NORMALISED_FIELDS = ("mechanism", "epsilon", "delta", "clip", "basis", "sensitivity", "sigma", "accountant",
                     "neighbours", "releases", "public", "estimator", *RELEASE_FIELDS)
#: how a noisy mean deviation becomes the estimate (``x_dp``'s ``estimator``; module docstring)
THRESHOLD, POSTERIOR = "threshold", "posterior"
ESTIMATORS = (THRESHOLD, POSTERIOR)
#: the posterior estimator's prior: support points (plus 0) and EM iterations
PRIOR_GRID, PRIOR_ITERATIONS = 201, 300
#: channels whose public energy is below this fraction of the layer's largest are normalised
#: by that floor (a dead channel would divide by 0)
SCALE_FLOOR = 1e-12


def tokens_digest(ids: torch.Tensor) -> str:
    """What names a public text in a header: its windows, tokens and a SHA-256 of the ids."""
    ids = ids.to(torch.int64).contiguous()
    digest = hashlib.sha256(ids.numpy().tobytes()).hexdigest()
    return f"{ids.shape[0]}x{ids.shape[1]}:sha256:{digest}"


# --------------------------------------------------------------------------- the public prior


@dataclass
class PublicPrior:
    """What the public text says about one release: channel energies ``scale`` (p, float64),
    the optional ``basis`` (k x d, orthonormal rows) and ``unit``, the public samples' rms
    representation norm (the clip's unit)."""

    scale: torch.Tensor
    basis: torch.Tensor | None
    unit: float

    def represent(self, energies: torch.Tensor, tokens: int) -> torch.Tensor:
        """Per-sample energies (samples, d) of samples of ``tokens`` tokens -> their
        representations (samples, d or k): relative deviations from the public energies."""
        floor = self.scale.clamp_min(SCALE_FLOOR * float(self.scale.max()))
        u = energies / (tokens * floor) - 1.0
        return u if self.basis is None else u @ self.basis.T

    def energies(self, mean_deviation: torch.Tensor) -> torch.Tensor:
        """Channel energies m = p max(1 + deviation, 0) from a mean deviation in the
        representation (the clamp is post-processing: a channel's energy is never negative)."""
        ratio = 1.0 + (mean_deviation if self.basis is None else mean_deviation @ self.basis)
        return self.scale * ratio.clamp_min(0.0)

    @property
    def dim(self) -> int:
        """Coordinates of the representation: the basis size, or every channel."""
        return int(self.scale.numel() if self.basis is None else self.basis.shape[0])


def public_basis(token_gram: torch.Tensor, token_sum: torch.Tensor, tokens: int, scale: torch.Tensor,
                 k: int) -> torch.Tensor:
    """The k leading principal directions (rows, unit norm, sign fixed) of the public tokens'
    relative deviations x_t^2 / p - 1: a domain's mean deviation is a mix of token kinds, so it
    lies mostly where single tokens vary, which public text shows (a per-sample basis only sees
    how whole documents vary)."""
    mean = token_sum / tokens
    floor = scale.clamp_min(SCALE_FLOOR * float(scale.max()))
    cov = (token_gram / tokens - torch.outer(mean, mean)) / torch.outer(floor, floor)
    values, vectors = torch.linalg.eigh((cov + cov.T) / 2)
    top = vectors[:, torch.argsort(values, descending=True, stable=True)[:k]].T.contiguous()
    signs = torch.sign(top.gather(1, top.abs().argmax(dim=1, keepdim=True)))
    return top * signs


class PublicWanda(WandaPruner):
    """Plain Wanda on the public text (the public mask, bit for bit what ``client-mask``
    computes), keeping what the prior needs: each sample's channel energies and, for a basis,
    the tokens' second moments. Linears that read one input share one collector."""

    def __init__(self, layer, layer_name: str, basis: int = 0):
        super().__init__(layer, layer_name)
        self.stats = {"samples": [], "gram": None, "sum": None, "tokens": 0, "basis": basis}

    def adopt_statistics(self, other) -> bool:
        if not isinstance(other, PublicWanda):
            return False
        self.stats = other.stats
        self.sq_sum, self.n_tokens = other.sq_sum, None  # scores() reads the leader's
        self._leader = other
        return True

    def add_batch(self, inp: torch.Tensor) -> None:
        super().add_batch(inp)
        x = inp.detach().to("cpu", torch.float64)
        self.stats["samples"].append((x * x).sum(dim=1))
        self.stats["seqlen"] = int(x.shape[1])
        if self.stats["basis"]:
            sq = inp.detach().to("cpu", torch.float32).reshape(-1, inp.shape[-1]).square()
            gram = (sq.T @ sq).double()
            self.stats["gram"] = gram if self.stats["gram"] is None else self.stats["gram"] + gram
            total = sq.sum(dim=0).double()
            self.stats["sum"] = total if self.stats["sum"] is None else self.stats["sum"] + total
            self.stats["tokens"] += sq.shape[0]

    def mean_sq_input(self) -> torch.Tensor:
        leader = getattr(self, "_leader", None)
        return leader.mean_sq_input() if leader is not None else super().mean_sq_input()

    def prior(self, k: int = 0) -> PublicPrior:
        """The prior of this input, in a public basis of ``k`` directions (0: every channel)."""
        leader = getattr(self, "_leader", self)
        scale = leader.sq_sum / leader.n_tokens
        energies = torch.cat(self.stats["samples"])
        if energies.shape[0] < 2:
            raise ValueError(f"{self.layer_name}: the public prior needs at least 2 public samples, got "
                             f"{energies.shape[0]}")
        basis = None
        if k:
            if k > self.stats["basis"]:
                raise ValueError(f"{self.layer_name}: a basis of {k} directions, the collector kept moments for "
                                 f"{self.stats['basis']}")
            basis = public_basis(self.stats["gram"], self.stats["sum"], self.stats["tokens"], scale,
                                 min(k, scale.numel()))
        prior = PublicPrior(scale, basis, 0.0)
        rep = prior.represent(energies, self.stats["seqlen"])
        prior.unit = float(rep.pow(2).sum(dim=1).mean().sqrt())
        if not prior.unit > 0:
            raise ValueError(f"{self.layer_name}: the public samples do not vary (all equal): no clip scale")
        return prior


@dataclass(frozen=True)
class View:
    """One representation a pass computes: a basis size, a clip (x the public scale) and, for
    the distributed mechanism, the integer grid (None: float sums only)."""

    basis: int
    clip: float
    grid: int | None = None
    #: each client's mean deviation clipped once (a client unit), not each window
    per_client: bool = False

    @classmethod
    def of(cls, guarantee) -> "View":
        return cls(guarantee.basis, guarantee.clip, getattr(guarantee, "grid", None), guarantee.unit == CLIENT)


class Deviations:
    """One view's sum of a client's clipped deviations, float64 and (``sum``, ``grid_sum``) on
    the grid: each window's clipped, or (``view.per_client``) the client's mean deviation
    clipped once. ``units``: the rows summed (windows, or 1 for the client)."""

    def __init__(self, prior: PublicPrior, view: View):
        self.prior, self.view, self.bound = prior, view, view.clip * prior.unit
        self._rows = torch.zeros(prior.dim, dtype=torch.float64)  # per_client: the unclipped sum
        self._grid = torch.zeros(prior.dim, dtype=torch.int64) if view.grid else None
        self.n_samples = 0

    def add(self, energies: torch.Tensor, tokens: int) -> None:
        rep = self.prior.represent(energies, tokens)
        self.n_samples += rep.shape[0]
        if self.view.per_client:
            self._rows += rep.sum(dim=0)
            return
        rep = clip_rows(rep, self.bound)
        self._rows += rep.sum(dim=0)
        if self._grid is not None:
            self._grid += to_grid(rep, self.bound, self.view.grid).sum(dim=0)

    def _client_row(self) -> torch.Tensor:
        return clip_rows((self._rows / max(self.n_samples, 1))[None], self.bound)

    @property
    def sum(self) -> torch.Tensor:
        return self._client_row()[0] if self.view.per_client else self._rows

    @property
    def grid_sum(self) -> torch.Tensor | None:
        if self._grid is None or not self.view.per_client:
            return self._grid
        return to_grid(self._client_row(), self.bound, self.view.grid)[0]

    @property
    def units(self) -> int:
        return 1 if self.view.per_client else self.n_samples


def to_grid(rows: torch.Tensor, bound: float, grid: int) -> torch.Tensor:
    """Clipped rows (norm <= ``bound``) as integer steps of bound / grid, rounded to nearest."""
    return torch.round(rows * (grid / bound)).to(torch.int64)


class ClippedDeviations(LayerPruner):
    """A client's per-sample channel energies of one input, as every view's clipped
    deviations (:class:`Deviations`). Linears that read one input share one collector's sums.
    Collects only; masks come from :class:`EstimatedWanda`."""

    def __init__(self, layer, layer_name: str, views: Mapping[View, PublicPrior]):
        super().__init__(layer, layer_name)
        self.views = {view: Deviations(prior, view) for view, prior in views.items()}

    def adopt_statistics(self, other) -> bool:
        if not isinstance(other, ClippedDeviations):
            return False
        self.views = other.views
        return True

    def add_batch(self, inp: torch.Tensor) -> None:
        x = inp.detach().to("cpu", torch.float64)
        energies = (x * x).sum(dim=1)
        for deviations in self.views.values():
            deviations.add(energies, x.shape[1])


def clip_rows(rows: torch.Tensor, bound: float) -> torch.Tensor:
    """Each row scaled down to L2 norm ``bound`` if it is longer (``inf``: unchanged)."""
    if math.isinf(bound):
        return rows
    norms = rows.norm(dim=1, keepdim=True)
    return rows * torch.where(norms > bound, bound / norms.clamp_min(torch.finfo(torch.float64).tiny),
                              torch.ones_like(norms))


class EstimatedWanda(LayerPruner):
    """Wanda's score from given channel energies (the DP estimate)."""

    def __init__(self, layer, layer_name: str, energies: torch.Tensor):
        super().__init__(layer, layer_name)
        self.energies = energies

    def scores(self) -> torch.Tensor:
        return wanda_scores(self.layer.weight.detach().float().cpu(), self.energies.to(torch.float32))


@dataclass(frozen=True)
class PassShape:
    """What a pass releases in all, which the estimators' family-wise bounds are taken over: its
    ``coordinates`` (the threshold's) and its ``releases``, one per block input (the posterior's test)."""

    coordinates: int
    releases: int


def shrunk_energies(prior: PublicPrior, noisy_sum: torch.Tensor, n_samples: int, noise_std: float,
                    shape: PassShape, estimator: str = THRESHOLD) -> torch.Tensor:
    """The channel energies estimated from a noisy sum of ``n_samples`` clipped deviations with
    noise of std ``noise_std`` per coordinate (module docstring), by :func:`estimate_deviation`."""
    return prior.energies(estimate_deviation(estimator, noisy_sum / n_samples, noise_std / n_samples, shape))


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"DP estimator {estimator!r}: known {', '.join(ESTIMATORS)}")


def estimate_deviation(estimator: str, noisy_mean: torch.Tensor, std: float, shape: PassShape) -> torch.Tensor:
    """One input's mean deviation estimated from ``noisy_mean`` (noise of std ``std`` per
    coordinate; 0 is the public value), family-wise over what the pass releases (``shape``):
    ``threshold`` soft-thresholds each coordinate at the bound of the noise over every coordinate
    (:func:`noise_threshold`); ``posterior`` keeps the public value unless the input as a whole
    stands out of the noise (:func:`stands_out`), else takes each coordinate's posterior mean
    (:func:`posterior_mean`). Without noise, the mean itself."""
    check_estimator(estimator)
    if std == 0:
        return noisy_mean
    if estimator == POSTERIOR:
        if not stands_out(noisy_mean, std, shape.releases):
            return torch.zeros_like(noisy_mean)
        return posterior_mean(noisy_mean, std)
    threshold = noise_threshold(std, shape.coordinates)
    return noisy_mean.sign() * (noisy_mean.abs() - threshold).clamp_min(0.0)


def stands_out(noisy_mean: torch.Tensor, std: float, releases: int, level: float = FALSE_KEEP) -> bool:
    """Whether sum (noisy / std)^2 exceeds the chi-square quantile that noise alone (any of the
    pass's ``releases`` inputs) stays below with probability >= 1 - ``level`` (Bonferroni)."""
    from scipy.stats import chi2

    return float((noisy_mean.to(torch.float64) / std).square().sum()) > float(
        chi2.isf(level / releases, noisy_mean.numel()))


def posterior_mean(noisy: torch.Tensor, std: float) -> torch.Tensor:
    """Each coordinate's posterior mean given ``noisy`` = mu + N(0, std^2), under the discrete
    prior on ``PRIOR_GRID`` points spanning the coordinates (and 0) that maximises their
    likelihood (EM; deterministic: it reads only the noisy values and the noise level)."""
    noisy = noisy.to(torch.float64)
    top = float(noisy.abs().max())
    support = torch.cat([torch.linspace(-top, top, PRIOR_GRID, dtype=torch.float64),
                         torch.zeros(1, dtype=torch.float64)])
    # likelihoods relative to each coordinate's best support point (no underflow far out)
    log_like = -0.5 * ((noisy[:, None] - support[None, :]) / std) ** 2
    like = torch.exp(log_like - log_like.max(dim=1, keepdim=True).values)
    prior = torch.full((support.numel(),), 1.0 / support.numel(), dtype=torch.float64)
    for _ in range(PRIOR_ITERATIONS):
        joint = like * prior
        prior = (joint / joint.sum(dim=1, keepdim=True)).mean(dim=0)
    joint = like * prior
    return (joint / joint.sum(dim=1, keepdim=True)) @ support


def noise_threshold(std: float, coordinates: int, level: float = FALSE_KEEP) -> float:
    """The bound that ``coordinates`` independent N(0, std^2) draws all stay below in absolute
    value with probability >= 1 - ``level`` (Bonferroni): z_{1 - level / (2 coordinates)} std."""
    return std * float(torch.distributions.Normal(0.0, 1.0).icdf(
        torch.tensor(1.0 - level / (2.0 * coordinates), dtype=torch.float64)))


# --------------------------------------------------------------------------- the guarantee


@dataclass(frozen=True)
class NormalisedGuarantee:
    """What a normalised DP client's mask file proves: (epsilon, delta)-DP w.r.t. replacing
    one ``unit`` of at most ``windows_per_unit`` windows (:mod:`fedlib.dp.unit`), from
    ``releases`` Gaussian releases of noise multiplier ``sigma`` with sensitivity
    ``sensitivity`` (2 x windows_per_unit) x the release's clip (``clip`` x the public scale);
    ``noise``: secret or seeded (:mod:`fedlib.dp.samplers`)."""

    epsilon: float
    delta: float
    clip: float
    basis: int
    sigma: float
    releases: int
    public: str
    mechanism: str = NORMALISED
    sensitivity: float = SIGNED_SENSITIVITY
    accountant: str = ACCOUNTANT
    neighbours: str = NEIGHBOURS
    estimator: str = THRESHOLD
    unit: str = ProtectedUnit().kind
    windows_per_unit: int = 1
    noise: str = SEEDED
    #: the ``x_dp`` fields, in the writer's order
    FIELDS: ClassVar[tuple[str, ...]] = NORMALISED_FIELDS

    def noise_std(self, bound: float) -> float:
        """The noise's std for a release clipped to ``bound`` (0 without noise, whatever the bound)."""
        return self.sigma * self.sensitivity * bound if self.sigma > 0 else 0.0

    def header(self) -> str:
        return json.dumps({k: getattr(self, k) for k in self.FIELDS}, separators=(",", ":"))


@dataclass(frozen=True)
class NormalisedTarget:
    """``--dp-mechanism normalised``: the budget, the clip (x the public scale), the basis
    size (0 = every channel) and the estimator (module docstring)."""

    epsilon: float
    delta: float
    clip: float
    basis: int = 0
    estimator: str = THRESHOLD
    unit: ProtectedUnit = ProtectedUnit()
    mechanism = NORMALISED

    def __post_init__(self):
        if not (self.epsilon > 0 and 0 < self.delta < 1 and self.clip > 0 and self.basis >= 0):
            raise ValueError(f"DP needs epsilon > 0, 0 < delta < 1, clip > 0 and basis >= 0; got epsilon="
                             f"{self.epsilon}, delta={self.delta}, clip={self.clip}, basis={self.basis}")
        check_estimator(self.estimator)
        if not math.isfinite(self.epsilon) and math.isfinite(self.clip):
            raise ValueError("epsilon = inf (no noise) goes with clip = inf (no clipping): the plain estimate")

    @property
    def enabled(self) -> bool:
        return True  # inf is this family's no-noise limit, still computed through the public prior

    def guarantee(self, layer_names: Iterable[str], public: str) -> NormalisedGuarantee:
        releases = count_releases(layer_names)
        sigma = 0.0 if not math.isfinite(self.epsilon) else calibrate_sigma(float(self.epsilon), float(self.delta),
                                                                           releases)
        return NormalisedGuarantee(float(self.epsilon), float(self.delta), float(self.clip), int(self.basis), sigma,
                                   releases, public, estimator=self.estimator,
                                   sensitivity=SIGNED_SENSITIVITY * self.unit.sensitivity_factor,
                                   unit=self.unit.kind, windows_per_unit=self.unit.windows)


# --------------------------------------------------------------------------- one pass


@dataclass
class Release:
    """One DP mechanism to run in a pass: per client (``shared=False``: each client's noisy
    estimate, one mask per client) or distributed (``shared=True``: the clients' secure sum,
    one mask). ``noise``: the clients' noise sources (:mod:`fedlib.dp.samplers`).
    ``sink(client, block, decision)`` receives its masks (client None: the distributed mask).

    ``noisy_sums`` holds the noisy sums as they are drawn ((client or None, input) -> sum):
    releases given the same dict are ONE noisy release whose estimators are post-processing of
    the same sums (the first to reach an input draws its noise, the others read it), one epsilon
    in all; :func:`release_digest` names those sums in each mask file's header."""

    label: str
    guarantee: object
    noise: Sequence[NoiseSource]
    sink: Callable[[int | None, int, BlockDecision], None]
    shared: bool = False
    #: the SecAgg round's secrets: a simulation's seed, or None (the OS's)
    secagg_seed: int | None = None
    #: the SecAgg round's (clients, server, whether it revealed), set up at the first sum: one round masks
    #: every statistic of the pass (a vector per input), and each client reveals its shares once
    secagg_round: tuple | None = None
    noisy_sums: dict = field(default_factory=dict)


def release_digest(release: Release, client: int | None = None) -> str:
    """SHA-256 of the noisy sums one mask file of ``release`` was estimated from (``client``
    None: the secure sum's), in the pass's order: equal for estimators of one noisy release."""
    digest = hashlib.sha256()
    for (owner, key), total in release.noisy_sums.items():
        if owner == client:
            digest.update(key.encode() + b"\0" + total.to(torch.float64).contiguous().numpy().tobytes())
    return f"sha256:{digest.hexdigest()}"


def federation_pass(
    model,
    public_ids: torch.Tensor,
    clients_ids: Sequence[torch.Tensor],
    pruning: Pruning,
    releases: Sequence[Release],
    *,
    blocks: int | None = None,
    public_sink: Callable[[int, BlockDecision], None] | None = None,
) -> None:
    """Every client's statistics through the public mask's prefix (module docstring), and each
    release's masks from them, block by block: the public masks go to ``public_sink``, each
    release's to its sink; every mask is Wanda's as ``pruning`` says (its sparsity, group, seed,
    batch size and placement). ``blocks``: only blocks 0..blocks-1."""
    runner = BlockRunner(model, [public_ids, *clients_ids], pruning.placement, pruning.batch_size)
    views = {View.of(r.guarantee) for r in releases}
    moments = max((v.basis for v in views), default=0)
    n_blocks = runner.n_blocks if blocks is None else min(blocks, runner.n_blocks)
    for step in runner.steps(blocks):
        public = {name: PublicWanda(linear, name, moments) for name, linear in step.linears.items()}
        step.collect(0, public)
        decision = decide_block(public, pruning.sparsity, pruning.group, pruning.seed)
        priors = {}  # (input, basis) -> prior
        for name, collector in public.items():
            for k in {v.basis for v in views}:
                if (input_key(name), k) not in priors:
                    priors[input_key(name), k] = collector.prior(k)
        keys = list(dict.fromkeys(input_key(name) for name in step.linears))
        collected = []  # per client: input -> view -> Deviations
        for c in range(len(clients_ids)):
            stats = {name: ClippedDeviations(linear, name, {v: priors[input_key(name), v.basis] for v in views})
                     for name, linear in step.linears.items()}
            step.collect(c + 1, stats)
            collected.append({input_key(name): s.views for name, s in stats.items()})
        for release in releases:
            g, view = release.guarantee, View.of(release.guarantee)
            # every block has this block's inputs: what the pass releases in all
            shape = PassShape(n_blocks * sum(priors[key, view.basis].dim for key in keys), n_blocks * len(keys))
            if release.shared:
                estimates = {}
                for key in keys:
                    parts = [c[key][view] for c in collected]
                    if (None, key) not in release.noisy_sums:
                        release.noisy_sums[None, key] = g.secure_sum(release, key, parts)
                    prior = parts[0].prior
                    estimates[key] = shrunk_energies(prior, release.noisy_sums[None, key],
                                                     sum(p.units for p in parts),
                                                     g.noise_std(parts[0].bound, prior.dim), shape, g.estimator)
                release.sink(None, step.index, _estimate_decision(step, estimates, pruning))
                continue
            for c, by_key in enumerate(collected):
                estimates = {}
                for key in keys:
                    stat = by_key[key][view]
                    std = g.noise_std(stat.bound)
                    if (c, key) not in release.noisy_sums:
                        release.noisy_sums[c, key] = stat.sum + release.noise[c].normal(
                            stat.sum.shape, "dp-normalised-noise", key) * std
                    estimates[key] = shrunk_energies(stat.prior, release.noisy_sums[c, key], stat.units, std,
                                                     shape, g.estimator)
                release.sink(c, step.index, _estimate_decision(step, estimates, pruning))
        if public_sink is not None:
            public_sink(step.index, decision)
        for client in range(runner.n_clients):
            step.propagate(client, decision)


def _estimate_decision(step, estimates: Mapping[str, torch.Tensor], pruning: Pruning) -> BlockDecision:
    pruners = {name: EstimatedWanda(linear, name, estimates[input_key(name)]) for name, linear in step.linears.items()}
    return decide_block(pruners, pruning.sparsity, pruning.group, pruning.seed)


def collecting_sink(store: dict) -> Callable[[int | None, int, BlockDecision], None]:
    """A sink that keeps every mask in ``store[client][layer]`` (client None: the shared mask)."""
    def sink(client, _block, decision):
        store.setdefault(client, {}).update(decision.masks)
    return sink


# --------------------------------------------------------------------------- one client or federation


@dataclass(frozen=True, eq=False)
class PublicDP:
    """A normalised or distributed mechanism with the public text its clients normalise by:
    what ``fedlib client-mask --dp-mechanism normalised`` runs, and what an auditor recomputes
    (:func:`fedlib.privacy.stages.recompute.client_masks`)."""

    target: object
    public_ids: torch.Tensor
    enabled = True

    @property
    def delta(self) -> float:
        return self.target.delta

    @property
    def shared(self) -> bool:
        return self.target.mechanism != NORMALISED

    @property
    def unit(self) -> ProtectedUnit:
        return self.target.unit

    def guarantee(self, layer_names: Iterable[str]):
        return self.target.guarantee(layer_names, tokens_digest(self.public_ids))

    def client_masks(self, model, input_ids: torch.Tensor, pruning: Pruning, *, noise: NoiseSource,
                     blocks: int | None = None,
                     sink: Callable[[int, BlockDecision], None] | None = None) -> dict[str, torch.Tensor]:
        """The mask of a client with data ``input_ids``, pruned as ``pruning`` says (plain Wanda:
        no method options), (distributed: of a federation whose
        ``target.clients`` clients hold its consecutive parts, each drawing its share from
        ``noise``), blocks ``0..blocks-1``. ``sink(block, decision)`` gets the masks
        as they are decided (a client streams them to its file); returns them (empty with a sink)."""
        from fedlib.models import prunable_layers

        names = [info.name for info in prunable_layers(model) if blocks is None or info.block < blocks]
        guarantee = replace(self.guarantee(names), noise=noise.mode)
        parts = list(input_ids.tensor_split(self.target.clients)) if self.shared else [input_ids]
        if any(part.shape[0] == 0 for part in parts):
            raise ValueError(f"{input_ids.shape[0]} samples cannot be split over {len(parts)} clients")
        sources = [noise.derive("client", c) for c in range(len(parts))] if self.shared else [noise]
        store: dict = {}
        keep = collecting_sink(store)
        release = Release("client", guarantee, sources, keep if sink is None else (lambda _c, b, d: sink(b, d)),
                          shared=self.shared, secagg_seed=noise.secagg_seed("secagg"))
        if resolve_method(pruning.method) is not resolve_method("wanda") or pruning.options:
            raise ValueError(f"DP masks are plain Wanda's, not {pruning.method!r} with options {pruning.options}")
        federation_pass(model, self.public_ids, parts, pruning, [release], blocks=blocks)
        return next(iter(store.values()), {})
