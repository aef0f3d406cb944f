"""Distributed DP: the clients' normalised statistics (:mod:`fedlib.privacy.dp_public`) summed
under secure aggregation (:mod:`fedlib.server.secagg`), each client adding 1/sqrt(K) of the noise,
so the server sees one sum with the noise a central curator would add: central-DP utility
(the noise on a mean falls with the federation's total sample count, not one client's), with
no party ever seeing a client's statistic.

Integers. Secure aggregation sums integers modulo 2^64, so each sample's clipped representation
is put on a grid of ``grid`` steps per clip bound C (rounded to nearest): its L2 norm is then at
most grid + sqrt(dim)/2 steps, and the replace-one sensitivity of a client's integer sum is
Delta = 2 grid + sqrt(dim) steps. Each client adds discrete Gaussian noise N_Z(0, s^2) per
coordinate, s = sigma Delta / sqrt(K) (Canonne, Kamath & Steinke 2020's exact rejection sampler, in
floating point as in Kairouz et al.'s implementation).

Accounting (Kairouz, Liu & Steinke, ICML 2021, Prop. 14): the sum of K independent N_Z(0, s^2)
added to an integer vector of L2 sensitivity Delta is (alpha, alpha Delta^2 / (2 K s^2) + tau d)-RDP
for every alpha, tau = 10 sum_{k=1}^{K-1} exp(-2 pi^2 s^2 k / (k+1)). Here Delta^2 / (K s^2) =
1 / sigma^2: the RDP of a Gaussian of multiplier sigma plus tau d, and tau d <= 10 (K-1) d
exp(-pi^2 s^2) is below 1e-300 for s of thousands of steps. ``releases`` of them compose by
adding RDP; dp-accounting's RDP accountant turns that into (epsilon, delta) (its conversion holds
for any mechanism with that RDP curve), and the tau d term is added to epsilon, never dropped.
The guarantee is against the server and any party that sees only the sum, and holds when every
client adds its share (a client that drops out takes its share with it; SecAgg's threshold does
not restore it); a client's own upload is a one-time-padded vector.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedlib.privacy.ddg_accounting import (
    ACCOUNTANT,
    DISTRIBUTED,
    DISTRIBUTED_FIELDS,
    GRID,
    calibrate_distributed_sigma,
    sensitivity_steps,
)
from fedlib.privacy.dp import count_releases
from fedlib.privacy.dp_public import (
    NORMALISED,
    THRESHOLD,
    Deviations,
    NormalisedGuarantee,
    NormalisedTarget,
    PublicDP,
    check_estimator,
)

#: secure aggregation's ring: sums are exact modulo 2^64 while they stay below 2^62
RING_BITS = 64


def discrete_gaussian(sigma: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` draws of N_Z(0, sigma^2), P(y) proportional to exp(-y^2 / (2 sigma^2)) on the
    integers: Canonne, Kamath & Steinke (2020), Alg. 3: a discrete Laplace proposal of scale
    t = floor(sigma) + 1 (a difference of two geometrics), accepted with probability
    exp(-(|y| - sigma^2/t)^2 / (2 sigma^2))."""
    if sigma == 0:
        return np.zeros(size, dtype=np.int64)  # no noise (a test's limit)
    if not sigma > 0:
        raise ValueError(f"discrete Gaussian needs sigma >= 0, got {sigma}")
    t = math.floor(sigma) + 1
    p = -math.expm1(-1.0 / t)
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        y = rng.geometric(p, todo.size) - rng.geometric(p, todo.size)
        accept = rng.random(todo.size) < np.exp(-((np.abs(y) - sigma * sigma / t) ** 2) / (2 * sigma * sigma))
        out[todo[accept]] = y[accept]
        todo = todo[~accept]
    return out


@dataclass(frozen=True)
class DistributedGuarantee(NormalisedGuarantee):
    """What the server's mask from the secure sum proves, against the server: (epsilon,
    delta)-DP w.r.t. replacing one sample of any client, ``clients`` clients each adding its
    share of ``releases`` discrete Gaussian releases of multiplier ``sigma``."""

    clients: int = 1
    grid: int = GRID
    mechanism: str = DISTRIBUTED
    accountant: str = ACCOUNTANT
    FIELDS: ClassVar[tuple[str, ...]] = DISTRIBUTED_FIELDS

    def client_std(self, dim: int) -> float:
        """One client's noise share, in grid steps."""
        return self.sigma * sensitivity_steps(self.grid, dim) / math.sqrt(self.clients)

    def noise_std(self, bound: float, dim: int) -> float:
        """The std of the summed noise per coordinate, in the statistic's units."""
        return self.sigma * sensitivity_steps(self.grid, dim) * bound / self.grid

    def secure_sum(self, release, key: str, stats: Sequence[Deviations]) -> torch.Tensor:
        """:func:`secure_noisy_sum` (:func:`fedlib.privacy.dp_public.federation_pass` calls it
        through the guarantee, so that module need not import this one)."""
        return secure_noisy_sum(release, key, stats)


@dataclass(frozen=True)
class DistributedTarget:
    """``distributed`` in the domain study: the budget, clip (x the public scale), basis size,
    the number of clients that share the noise and the server's estimator
    (:mod:`fedlib.privacy.dp_public`)."""

    epsilon: float
    delta: float
    clip: float
    basis: int
    clients: int
    grid: int = GRID
    estimator: str = THRESHOLD
    mechanism = DISTRIBUTED

    def __post_init__(self):
        if not (0 < self.epsilon < math.inf and 0 < self.delta < 1 and 0 < self.clip < math.inf
                and self.basis >= 0 and self.clients >= 1 and self.grid >= 1):
            raise ValueError(f"distributed DP needs 0 < epsilon < inf, 0 < delta < 1, a finite clip > 0, basis >= 0, "
                             f"clients >= 1; got {self}")
        check_estimator(self.estimator)

    @property
    def enabled(self) -> bool:
        return True

    def guarantee(self, layer_names: Iterable[str], public: str) -> DistributedGuarantee:
        releases = count_releases(layer_names)
        sigma = calibrate_distributed_sigma(float(self.epsilon), float(self.delta), releases, self.clients, self.grid)
        return DistributedGuarantee(float(self.epsilon), float(self.delta), float(self.clip), int(self.basis), sigma,
                                    releases, public, estimator=self.estimator, clients=int(self.clients),
                                    grid=int(self.grid))


def _rng(seed: int, *names: object) -> np.random.Generator:
    text = ":".join(str(x) for x in (seed, *names))
    return np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "little"))


def secure_noisy_sum(release, key: str, stats: Sequence[Deviations]) -> torch.Tensor:
    """The server's view of release ``key``: each client's grid sum plus its discrete Gaussian
    share, one-time padded and summed by SecAgg (:mod:`fedlib.server.secagg`), decoded to the
    statistic's units (float64)."""
    from fedlib.server.secagg import finish_round, setup_round

    g: DistributedGuarantee = release.guarantee
    if len(stats) != g.clients:
        raise ValueError(f"release {release.label}: {len(stats)} clients sum, the guarantee is for {g.clients}")
    dim, bound = stats[0].prior.dim, stats[0].bound
    std = g.client_std(dim)
    if release.secagg_round is None:
        release.secagg_round = (*setup_round(g.clients, seed=release.secagg_seed, bits=RING_BITS), False)
    clients, server, revealed = release.secagg_round
    label = f"{release.label}:{key}"
    limit = 2**62 // g.clients
    uploads = {}
    for c, stat in enumerate(stats):
        noise = discrete_gaussian(std, dim, _rng(release.noise_seeds[c], "dp-distributed-noise", key))
        value = stat.grid_sum.numpy() + noise
        if np.abs(value).max(initial=0) >= limit:
            raise OverflowError(f"release {label}: a client's noisy sum leaves the 2^64 ring's safe range")
        uploads[c] = clients[c].masked_words(label, value.astype(np.uint64))
    if not revealed:  # nobody drops out of the simulated federation: the survivors are every client
        finish_round(clients, server, sorted(uploads))
        release.secagg_round = (clients, server, True)
    total = server.unmask_words(label, uploads).view(np.int64)
    return torch.from_numpy(total.astype(np.float64) * (bound / g.grid))


def public_dp(mechanism: str, epsilon: float, delta: float, clip: float, basis: int, clients: int | None,
              public_ids: torch.Tensor, estimator: str = THRESHOLD) -> PublicDP:
    """``--dp-mechanism normalised|distributed`` with its public text and ``--dp-estimator``."""
    if mechanism == NORMALISED:
        if clients is not None:
            raise ValueError("--dp-clients: the normalised mechanism is one client's (distributed shares the noise)")
        if not math.isfinite(epsilon):
            raise ValueError("--dp-mechanism normalised needs a finite --dp-epsilon (without DP, omit --dp-epsilon)")
        return PublicDP(NormalisedTarget(epsilon, delta, clip, basis, estimator), public_ids)
    if mechanism == DISTRIBUTED:
        if clients is None:
            raise ValueError("--dp-mechanism distributed needs --dp-clients (how many clients share the noise)")
        return PublicDP(DistributedTarget(epsilon, delta, clip, basis, clients, estimator=estimator), public_ids)
    raise ValueError(f"unknown DP mechanism {mechanism!r}; known: gaussian, {NORMALISED}, {DISTRIBUTED}")
