"""Where a DP release's randomness comes from, and the exact discrete Gaussian sampler.

Noise source. A release's noise is either **secret**, drawn from the operating system's
cryptographic generator (:mod:`secrets`, ``os.urandom``) and never stored anywhere, or
**seeded**, derived from an integer seed: a simulation's, reproducible by anyone who knows the
seed, who can then subtract the noise. A seeded release is *not private*; its mask file says
``"noise": "seeded"`` in ``x_dp`` and every report prints it as "simulation: not private".
The site-facing paths (``fedlib client-mask --dp-*``) use the secret source unless seeded noise
is asked for explicitly.

Exact discrete Gaussian (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for
Differential Privacy", Algorithms 1-3). P(y) is proportional to exp(-y^2 / (2 s^2)) on the
integers. Every step is integer arithmetic on exact rationals: s^2 is the exact rational value
of the float s; Bernoulli(exp(-gamma)) for rational gamma (Alg. 1) needs only uniform integers;
the discrete Laplace proposal of integer scale t = floor(s) + 1 (Alg. 2) and the acceptance
test (Alg. 3) likewise. So the draws follow the stated distribution exactly, with no
floating-point rounding an attacker could read (Mironov 2012), given uniform integers, which the
secret source takes from ``os.urandom``. One draw is a Python loop of a few dozen integer
operations (``benchmarks/bench_dp_noise.py`` times a release).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from fedlib.groups import seeded_generator

#: ``x_dp``'s ``noise``: drawn from the OS's cryptographic generator, or derived from a seed
SECRET, SEEDED = "secret", "seeded"
NOISE_MODES = (SECRET, SEEDED)
#: what every report prints for a seeded release
SIMULATION_LABEL = "simulation: not private"


def derive_seed(seed: int, *names: object) -> int:
    """A 63-bit seed that depends only on ``seed`` and ``names`` (SHA-256)."""
    text = ":".join(str(x) for x in (seed, *names))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class NoiseSource:
    """A release's randomness (module docstring): ``seed`` None is the OS's cryptographic
    generator (secret), an integer a simulation's seed."""

    seed: int | None = None

    @property
    def mode(self) -> str:
        return SECRET if self.seed is None else SEEDED

    def derive(self, *names: object) -> "NoiseSource":
        """The source of a part (a client, a release): seeded, a seed derived from this one and
        ``names``; secret, the OS generator again."""
        return self if self.seed is None else NoiseSource(derive_seed(self.seed, *names))

    def integers(self, *names: object) -> random.Random:
        """A generator of uniform integers (``randrange``) for ``names``."""
        if self.seed is None:
            return OsRandom()
        return random.Random(derive_seed(self.seed, *names))

    def normal(self, shape, *names: object) -> torch.Tensor:
        """Standard normal draws (float64) of ``shape``: seeded, torch's generator seeded by the
        seed and ``names``; secret, Box-Muller on 53-bit uniforms from ``os.urandom``."""
        if self.seed is not None:
            return torch.randn(shape, generator=seeded_generator(self.seed, *names), dtype=torch.float64)
        count = math.prod(shape)
        words = np.frombuffer(os.urandom(16 * count), dtype=np.uint64).reshape(2, count) >> np.uint64(11)
        u1 = (words[0].astype(np.float64) + 1.0) / 2.0**53  # (0, 1]: the log is finite
        u2 = words[1].astype(np.float64) / 2.0**53
        return torch.from_numpy(np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).reshape(shape)

    def discrete_gaussian(self, sigma: float, size: int, *names: object) -> np.ndarray:
        """``size`` exact draws of N_Z(0, sigma^2) (:func:`discrete_gaussian`) for ``names``."""
        return discrete_gaussian(sigma, size, self.integers(*names))

    def secagg_seed(self, *names: object) -> int | None:
        """The seed of a simulated SecAgg round's secrets (None: the OS's, as a deployment)."""
        return None if self.seed is None else derive_seed(self.seed, *names)


class OsRandom(random.SystemRandom):
    """:class:`random.SystemRandom` reading ``os.urandom`` 64 KiB at a time: one system call per
    draw made the sampler 5x slower. Bits are used once, in order."""

    CHUNK = 1 << 16

    def __init__(self):
        super().__init__()
        self._buffer, self._at = b"", 0

    def getrandbits(self, k: int) -> int:
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        n = (k + 7) // 8
        if self._at + n > len(self._buffer):
            self._buffer, self._at = os.urandom(max(self.CHUNK, n)), 0
        word = int.from_bytes(self._buffer[self._at:self._at + n], "little")
        self._at += n
        return word >> (8 * n - k)


def bernoulli_exp(num: int, den: int, rng) -> bool:
    """True with probability exp(-num/den), num >= 0, den >= 1 (CKS 2020, Alg. 1; exp(-gamma)
    for gamma > 1 as exp(-1)^floor(gamma) exp(-frac(gamma)))."""
    while num > den:
        if not _bernoulli_exp_unit(1, 1, rng):
            return False
        num -= den
    return _bernoulli_exp_unit(num, den, rng)


def _bernoulli_exp_unit(num: int, den: int, rng) -> bool:
    """exp(-gamma) for gamma = num/den in [0, 1]: K = 1; while Bernoulli(gamma / K): K += 1;
    K odd."""
    k = 1
    while rng.randrange(den * k) < num:
        k += 1
    return k % 2 == 1


def discrete_laplace(t: int, rng) -> int:
    """One draw of the discrete Laplace of integer scale ``t``, P(y) proportional to
    exp(-|y| / t) (CKS 2020, Alg. 2 with s = 1)."""
    while True:
        u = rng.randrange(t)
        if not bernoulli_exp(u, t, rng):
            continue
        v = 0
        while bernoulli_exp(1, 1, rng):
            v += 1
        y = u + t * v
        negative = rng.randrange(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(sigma: float, size: int, rng) -> np.ndarray:
    """``size`` draws of N_Z(0, sigma^2) (CKS 2020, Alg. 3): a discrete Laplace proposal of
    scale t = floor(sigma) + 1 accepted with probability exp(-(|y| - sigma^2/t)^2 / (2 sigma^2)),
    all in exact rationals (sigma^2 is the float sigma's exact square). ``rng``: uniform
    integers (:meth:`NoiseSource.integers`)."""
    if sigma == 0:
        return np.zeros(size, dtype=np.int64)  # no noise (a test's limit)
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"discrete Gaussian needs a finite sigma >= 0, got {sigma}")
    var = Fraction(sigma) ** 2
    a, b = var.numerator, var.denominator  # sigma^2 = a / b
    t = math.floor(sigma) + 1
    # gamma = (|y| - sigma^2/t)^2 / (2 sigma^2) = (|y| b t - a)^2 / (2 a b t^2)
    den = 2 * a * b * t * t
    out = np.empty(size, dtype=np.int64)
    for i in range(size):
        while True:
            y = discrete_laplace(t, rng)
            if bernoulli_exp((abs(y) * b * t - a) ** 2, den, rng):
                out[i] = y
                break
    return out
