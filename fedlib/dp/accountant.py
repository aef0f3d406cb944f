"""Accounting of the distributed discrete Gaussian sum (:mod:`fedlib.dp.distributed`):
its header vocabulary and its (epsilon, delta) by RDP (Kairouz, Liu & Steinke, ICML 2021,
Prop. 14; the derivation is in that module's docstring), the trust model's other cases (one
client dropping out, the coordinator colluding with clients: :func:`trust_model`) and the
composition of a pool's releases (:func:`composed_epsilon`, the ledger's total).

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


def trust_model(header: dict) -> dict:
    """The epsilon of a release (its ``x_dp`` as a dict) under the trust model every DP table
    states: an honest-but-curious coordinator and all K clients honest (the claimed epsilon),
    and, for the distributed sum, when one client drops out (its noise share leaves with it) and
    when the coordinator colludes with c clients (it knows their shares): K - c shares of
    variance sigma^2 Delta^2 / K remain, a Gaussian of multiplier sigma sqrt((K - c) / K), with
    the same per-client share in the discrete term. A per-client release (no ``clients``) is
    protected by that client's own noise: collusion does not change it. Returns
    {"all_honest", "one_dropout", "collusion": {c: epsilon}} (inf when no share remains)."""
    epsilon = float(header["epsilon"])
    clients = int(header.get("clients", 1)) if header.get("mechanism") == DISTRIBUTED else None
    if clients is None:
        return {"all_honest": epsilon, "one_dropout": epsilon, "collusion": {}}
    sigma, releases, delta, grid = float(header["sigma"]), int(header["releases"]), float(header["delta"]), int(
        header["grid"])

    def remaining(shares: int) -> float:
        if shares < 1:
            return math.inf
        return rdp_epsilon(sigma * math.sqrt(shares / clients), releases, delta, shares, grid)

    return {"all_honest": epsilon, "one_dropout": remaining(clients - 1),
            "collusion": {c: remaining(clients - c) for c in range(1, clients)}}


def composed_epsilon(headers, delta: float) -> float:
    """The epsilon at ``delta`` of every release of one data pool together (their ``x_dp``
    dicts): each a ``releases``-fold Gaussian of multiplier ``sigma``, composed by RDP, plus the
    discrete term of each distributed one (:func:`tau_term`). A pool's ledger total."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    headers = list(headers)
    if not headers:
        return 0.0
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.ComposedDpEvent([_composed_event(float(h["sigma"]), int(h["releases"]))
                                                      for h in headers]))
    tau = sum(tau_term(float(h["sigma"]), int(h["clients"]), int(h["grid"]), int(h["releases"]))
              for h in headers if h.get("mechanism") == DISTRIBUTED)
    return float(accountant.get_epsilon(delta)) + tau
