"""Accounting of the distributed discrete Gaussian sum (:mod:`fedlib.dp.distributed`):
its header vocabulary and its (epsilon, delta) by RDP (Kairouz, Liu & Steinke, ICML 2021,
Prop. 14; the derivation is in that module's docstring).

A leaf of the mechanism: the mask file's reader (:mod:`fedlib.maskfile`) checks a distributed
mask's stated guarantee with these functions without importing the mechanism, which imports
secure aggregation and through it the server.
"""

from __future__ import annotations

import math
from functools import lru_cache

from fedlib.dp.public import NORMALISED_FIELDS

DISTRIBUTED = "distributed"
ACCOUNTANT = "rdp-ddg"
#: grid steps per clip bound: rounding adds sqrt(dim)/2 steps to a sample's norm, 1e-4 of 2^16
GRID = 2**16
#: header fields of a distributed mechanism's ``x_dp``, in the writer's order
DISTRIBUTED_FIELDS = NORMALISED_FIELDS + ("clients", "grid")
#: an upper bound on any release's dimension (the tau d term): 2^24 channels
MAX_DIM = 2**24
def sensitivity_steps(grid: int, dim: int) -> float:
    """L2 sensitivity, in grid steps, of a sum of rounded clipped rows under replace-one."""
    return 2.0 * grid + math.sqrt(dim)


def tau_term(sigma: float, clients: int, grid: int, releases: int) -> float:
    """The epsilon the discrete noise adds beyond a Gaussian's (module docstring), at most:
    releases x MAX_DIM x 10 (K-1) exp(-pi^2 s^2), s >= sigma 2 grid / sqrt(K) the smallest
    per-client std in steps."""
    if clients < 2:
        return 0.0
    s = sigma * 2.0 * grid / math.sqrt(clients)
    return releases * MAX_DIM * 10 * (clients - 1) * math.exp(-math.pi**2 * s * s)


def _composed_event(sigma: float, releases: int):
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), releases)


@lru_cache(maxsize=256)
def rdp_epsilon(sigma: float, releases: int, delta: float, clients: int, grid: int = GRID) -> float:
    """Epsilon at ``delta`` of the distributed discrete Gaussian sum over ``releases`` releases."""
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    accountant.compose(_composed_event(sigma, releases))
    return float(accountant.get_epsilon(delta)) + tau_term(sigma, clients, grid, releases)


@lru_cache(maxsize=256)
def calibrate_distributed_sigma(epsilon: float, delta: float, releases: int, clients: int, grid: int = GRID) -> float:
    """The smallest multiplier (to 1e-6) whose distributed sum is (epsilon, delta)-DP by RDP."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1 and releases >= 1 and clients >= 1):
        raise ValueError(f"distributed DP needs 0 < epsilon < inf, 0 < delta < 1, releases >= 1, clients >= 1; "
                         f"got epsilon={epsilon}, delta={delta}, releases={releases}, clients={clients}")
    sigma = float(dp_accounting.calibrate_dp_mechanism(RdpAccountant, lambda s: _composed_event(s, releases),
                                                       epsilon, delta))
    while rdp_epsilon(sigma, releases, delta, clients, grid) > epsilon:
        sigma *= 1 + 1e-6
    return sigma
