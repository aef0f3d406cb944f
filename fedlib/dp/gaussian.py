"""Sample-level differential privacy for a Wanda client: clipped per-sample statistics, Gaussian
noise in every block, composition accounted with Google's ``dp-accounting`` (PLD).

Mechanism. A Wanda mask is post-processing of, per linear, the per-input-channel statistic
S_j = sum over samples s of v_s[j], v_s[j] = sum over the sample's tokens of x_{s,t,j}^2
(:mod:`fedlib.methods.wanda`). Each sample's vector v_s is L2-clipped to ``clip`` before the
sum, and N(0, (sigma * Delta)^2 I) is added to the sum; the scores use the noisy sum clamped at
0 (post-processing; the division by the token count of plain Wanda only rescales a whole layer,
which no comparison group sees, so it is left out and the count is never used).

Neighbours: replace-one (the data set's size n is public: the mask file says ``n_samples``,
and the membership audit's game replaces one sample). Since every v_s is non-negative,
|v - v'|^2 = |v|^2 + |v'|^2 - 2<v, v'> <= 2 clip^2, so the L2 sensitivity is Delta =
sqrt(2) * clip (not 2 * clip). Removing one sample moves S by at most ``clip``.
A protected unit of up to k windows (``unit``, ``windows_per_unit``: :mod:`fedlib.dp.unit`) moves
k of the clipped vectors: sensitivity k sqrt(2) clip, and the noise scales with it.

Releases. Linears that read the same tensor (q/k/v_proj; gate/up_proj) share one noisy
statistic: their noise is seeded by the block and the input they share
(:func:`input_key`), and identical clean sums plus identical noise are one release. The noise
is secret, drawn from the OS's cryptographic generator (:mod:`fedlib.dp.samplers`); a seeded
simulation's is not, and its ``x_dp`` says ``noise: seeded``. A LLaMA-style
block makes 4 releases (attention input, o_proj input, MLP input, down_proj input). The
statistics of block b are computed through blocks < b pruned by this client's masks, which are
post-processing of earlier releases; each sample's activations depend on that sample only, so
conditioned on the earlier releases block b's statistic still has sensitivity Delta: adaptive
composition over ``releases`` = blocks x distinct inputs Gaussian mechanisms.

Accounting. Privacy loss distributions (PLD, :mod:`dp_accounting.pld`) rather than RDP: the
composition of Gaussian mechanisms is again Gaussian, and PLD's (epsilon, delta) is tight up
to its discretisation, whereas RDP's conversion to (epsilon, delta) overstates epsilon (so
would need more noise for the same guarantee). sigma (the noise multiplier, per unit of
sensitivity) is calibrated to the target (epsilon, delta) by the accountant itself
(:func:`dp_accounting.calibrate_dp_mechanism`, a bracketed root search); the privacy of a
Gaussian mechanism depends only on std / Delta, so the accountant's unit-sensitivity Gaussian
event with multiplier sigma is exact for any neighbour relation of sensitivity Delta.

Mechanisms that keep public text as the prior and degrade to its mask instead of destroying it
(normalised statistics, shrinkage, a distributed sum under SecAgg): :mod:`fedlib.dp.public`
and :mod:`fedlib.dp.distributed`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

import torch

from fedlib.dp.samplers import SEEDED, NoiseSource
from fedlib.dp.unit import ProtectedUnit
from fedlib.methods.wanda import WandaPruner, wanda_scores

ACCOUNTANT = "pld"
#: the PLD's grid of privacy-loss values: its pessimistic discretisation only ever overstates
#: epsilon, and 1e-2 (not the default 1e-4) makes a calibration take seconds, not minutes, at
#: large epsilon; the sigmas agree to ~1e-8 (checked against the exact Gaussian bound in tests)
PLD_INTERVAL = 1e-2
NEIGHBOURS = "replace-one"
#: linears (by the last part of their name) that read the same tensor in a LLaMA/Gemma block
SHARED_INPUTS = {"q_proj": "attn_in", "k_proj": "attn_in", "v_proj": "attn_in",
                 "gate_proj": "mlp_in", "up_proj": "mlp_in"}
#: header fields of a DP mask file's ``x_dp``, in the writer's order
GUARANTEE_FIELDS = ("epsilon", "delta", "clip", "sigma", "accountant", "neighbours", "releases", "unit",
                    "windows_per_unit", "noise")
#: what every mechanism's ``x_dp`` ends with: the protected unit, its k and the noise source
#: (:mod:`fedlib.dp.unit`, :mod:`fedlib.dp.samplers`); files written before carry none of them
RELEASE_FIELDS = ("unit", "windows_per_unit", "noise")


def input_key(layer_name: str) -> str:
    """The statistic a linear reads: ``model.layers.3.self_attn.k_proj`` -> ``model.layers.3.attn_in``;
    a linear that shares its input with no other is its own key."""
    parent, _, leaf = layer_name.rpartition(".")
    if leaf in SHARED_INPUTS:
        block = parent.rpartition(".")[0]  # drop self_attn / mlp
        return f"{block}.{SHARED_INPUTS[leaf]}"
    return layer_name


def count_releases(layer_names: Iterable[str]) -> int:
    """Noisy statistics released for these linears: one per distinct input."""
    return len({input_key(name) for name in layer_names})


def _composed_event(sigma: float, releases: int):
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), releases)


@lru_cache(maxsize=256)
def pld_epsilon(sigma: float, releases: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``releases`` composed Gaussian mechanisms of noise multiplier
    ``sigma`` (std / sensitivity), by the PLD accountant."""
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    accountant = PLDAccountant(value_discretization_interval=PLD_INTERVAL)
    accountant.compose(_composed_event(sigma, releases))
    return float(accountant.get_epsilon(delta))


def gaussian_delta(epsilon: float, sigma: float, releases: int) -> float:
    """The exact delta at ``epsilon`` of ``releases`` composed Gaussian mechanisms of noise
    multiplier ``sigma``: their composition is one Gaussian mechanism of sensitivity/std
    mu = sqrt(releases) / sigma (Dong, Roth & Su 2022), whose delta(epsilon) is
    Phi(mu/2 - epsilon/mu) - e^epsilon Phi(-mu/2 - epsilon/mu) (Balle & Wang 2018, Thm. 8).
    PLD's epsilon bounds the exact one from above; a mask file reader checks a claimed
    guarantee with this (cheap, no discretisation)."""
    from scipy.stats import norm

    mu = math.sqrt(releases) / sigma
    return float(norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon + norm.logcdf(-mu / 2 - epsilon / mu)))


def gaussian_epsilon(sigma: float, releases: int, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``releases`` composed Gaussian mechanisms of noise
    multiplier ``sigma``: the root of :func:`gaussian_delta` (decreasing in epsilon), by
    bisection to 1e-9; infinite without noise (``sigma`` 0)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if sigma <= 0:
        return math.inf
    if gaussian_delta(0.0, sigma, releases) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, sigma, releases) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-9 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gaussian_delta(mid, sigma, releases) > delta else (lo, mid)
    return hi


@lru_cache(maxsize=256)
def calibrate_sigma(epsilon: float, delta: float, releases: int) -> float:
    """The smallest noise multiplier (to 1e-6) whose ``releases``-fold composition is
    (epsilon, delta)-DP by the PLD accountant."""
    import dp_accounting
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1 and releases >= 1):
        raise ValueError(f"DP target needs 0 < epsilon < inf, 0 < delta < 1, releases >= 1; got "
                         f"epsilon={epsilon}, delta={delta}, releases={releases}")
    sigma = float(dp_accounting.calibrate_dp_mechanism(
        lambda: PLDAccountant(value_discretization_interval=PLD_INTERVAL), lambda s: _composed_event(s, releases),
        epsilon, delta))
    # the search returns a value within its tolerance of the optimum; never one that misses the target
    while pld_epsilon(sigma, releases, delta) > epsilon:
        sigma *= 1 + 1e-6
    return sigma


@dataclass(frozen=True)
class DPGuarantee:
    """What a DP client's mask file proves: (epsilon, delta)-DP w.r.t. replacing one ``unit``
    (:mod:`fedlib.dp.unit`) of at most ``windows_per_unit`` calibration windows, from
    ``releases`` Gaussian releases of noise multiplier ``sigma``; ``noise``: secret or seeded
    (:mod:`fedlib.dp.samplers`; seeded is a simulation, not private)."""

    epsilon: float
    delta: float
    clip: float
    sigma: float
    accountant: str = ACCOUNTANT
    neighbours: str = NEIGHBOURS
    releases: int = 1
    unit: str = ProtectedUnit().kind
    windows_per_unit: int = 1
    noise: str = SEEDED

    @property
    def sensitivity(self) -> float:
        return math.sqrt(2.0) * self.clip * self.windows_per_unit

    @property
    def noise_std(self) -> float:
        return self.sigma * self.sensitivity

    def header(self) -> str:
        """The mask file's ``x_dp`` value (canonical compact JSON, fields in order)."""
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass(frozen=True)
class DPTarget:
    """``privacy.dp`` / ``--dp-*``: the budget a client asks for."""

    epsilon: float
    delta: float
    clip: float
    unit: ProtectedUnit = ProtectedUnit()

    def __post_init__(self):
        if not (self.epsilon > 0 and 0 < self.delta < 1 and math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"DP needs epsilon > 0, 0 < delta < 1 and a finite clip > 0; got "
                             f"epsilon={self.epsilon}, delta={self.delta}, clip={self.clip}")
        if self.unit.clips_client:
            raise ValueError("the Gaussian mechanism clips each window; a client unit needs --dp-mechanism "
                             "normalised or distributed (the client's mean deviation clipped once)")

    @property
    def enabled(self) -> bool:
        """epsilon = inf means no DP: the plain (unclipped, noiseless) mechanism."""
        return math.isfinite(self.epsilon)

    #: one client's mask (as :class:`fedlib.dp.public.PublicDP`'s normalised mechanism)
    shared = False

    def guarantee(self, layer_names: Iterable[str]) -> DPGuarantee:
        releases = count_releases(layer_names)
        epsilon, delta, clip = float(self.epsilon), float(self.delta), float(self.clip)
        return DPGuarantee(epsilon, delta, clip, calibrate_sigma(epsilon, delta, releases), releases=releases,
                           unit=self.unit.kind, windows_per_unit=self.unit.windows)

    def client_masks(self, model, input_ids: torch.Tensor, pruning, *, noise: NoiseSource, blocks: int | None = None,
                     sink: Callable | None = None) -> dict[str, torch.Tensor]:
        """The DP mask of a client with data ``input_ids``, Wanda as ``pruning`` says, blocks
        ``0..blocks-1``, the noise drawn from ``noise``; ``sink(block, decision)`` gets the masks
        as they are decided (then none are kept: returns {}). The interface of every DP mechanism
        (:meth:`fedlib.dp.public.PublicDP.client_masks`)."""
        from fedlib.client import prune_locally
        from fedlib.models import prunable_layers

        names = [info.name for info in prunable_layers(model) if blocks is None or info.block < blocks]
        dp_class, _ = dp_method(pruning.method, self, names, noise)
        return prune_locally(model, input_ids, replace(pruning, method=dp_class), sink, blocks=blocks,
                             keep=sink is None).masks


def clipped_sample_sum(inp: torch.Tensor, clip: float) -> torch.Tensor:
    """Sum over samples of each sample's per-channel squared-norm vector, L2-clipped to ``clip``
    (float64). ``inp``: (samples, tokens, channels), one calibration sample per row."""
    if inp.dim() != 3:
        raise ValueError(f"DP clipping needs per-sample inputs (samples, tokens, channels), got shape {tuple(inp.shape)}")
    x = inp.detach().to("cpu", torch.float64)
    per_sample = (x * x).sum(dim=1)
    norms = per_sample.norm(dim=1, keepdim=True)
    scale = torch.where(norms > clip, clip / norms.clamp_min(torch.finfo(torch.float64).tiny), torch.ones_like(norms))
    return (per_sample * scale).sum(dim=0)


def noisy_release(statistic: torch.Tensor, guarantee: DPGuarantee, noise: NoiseSource, *names: object) -> torch.Tensor:
    """The Gaussian release of a clipped statistic: Gaussian noise of the guarantee's std from
    ``noise`` (for ``names``), negative values set to 0 (post-processing). What a DP client
    releases and what the release audit (:mod:`fedlib.privacy.stages.dp_release`) attacks."""
    return (statistic + noise.normal(tuple(statistic.shape), *names) * guarantee.noise_std).clamp_min(0.0)


class DPWandaPruner(WandaPruner):
    """Wanda on clipped, noised statistics (module docstring). A subclass per client
    (:func:`dp_method`) carries the guarantee and the noise source; seeded noise depends on the
    seed and the layer's input (:func:`input_key`): same seed, same mask."""

    guarantee: DPGuarantee
    noise: NoiseSource

    def add_batch(self, inp: torch.Tensor) -> None:
        self.sq_sum += clipped_sample_sum(inp, self.guarantee.clip)
        self.n_tokens += inp.shape[0] * inp.shape[1]

    def noisy_sum(self) -> torch.Tensor:
        return noisy_release(self.sq_sum, self.guarantee, self.noise, "dp-noise", input_key(self.layer_name))

    def scores(self) -> torch.Tensor:
        if self.n_tokens == 0:
            raise RuntimeError(f"{self.layer_name}: Wanda needs calibration inputs, saw none")
        return wanda_scores(self.layer.weight.detach().float().cpu(), self.noisy_sum())


def dp_method(method: str, target: DPTarget, layer_names: Iterable[str],
              noise: NoiseSource) -> tuple[type[WandaPruner], DPGuarantee]:
    """The method class a DP client prunes ``layer_names`` with (for
    :func:`fedlib.client.prune_locally`) and the guarantee its mask file records."""
    if method != WandaPruner.name:
        raise ValueError(f"DP masks are implemented for method 'wanda' (its mask is post-processing of "
                         f"per-channel statistics), not {method!r}")
    guarantee = replace(target.guarantee(layer_names), noise=noise.mode)
    return type("DPWandaPruner", (DPWandaPruner,), {"guarantee": guarantee, "noise": noise}), guarantee
