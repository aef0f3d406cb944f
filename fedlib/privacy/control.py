"""The audit's positive control: a deliberately broken DP client that the audit must catch.

An audit whose bound stays below the proven ε for every mechanism proves nothing about any of
them (its ceiling, :func:`fedlib.privacy.membership.epsilon_ceiling`, may simply be too low). The
control runs the same audit on two broken clients: :class:`UnderstatedSensitivity`, the client
of :mod:`fedlib.dp.gaussian` with its noise calibrated to a sensitivity ``factor`` times smaller
than the real one, and the honest client drawing from :class:`NoNoise`, a noise source that
returns zeros (a sampler bug: the release is the exact statistic). Both still claim the
requested (ε, δ); neither is (ε, δ)-DP, and an audit that works shows a lower bound above the
claimed ε. Audit code only: no site ever runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

import torch

from fedlib.dp.gaussian import DPGuarantee, DPTarget
from fedlib.dp.samplers import NoiseSource


@dataclass(frozen=True)
class UnderstatedSensitivity(DPTarget):
    """:class:`~fedlib.dp.gaussian.DPTarget` with its noise std divided by ``factor`` (as if the
    sensitivity were ``factor`` times smaller): same clipping, same releases, same claimed ε."""

    factor: float = 10.0

    def __post_init__(self):
        super().__post_init__()
        if not self.factor > 1:
            raise ValueError(f"a broken mechanism understates its sensitivity: factor must be > 1, got {self.factor}")

    def guarantee(self, layer_names: Iterable[str]) -> DPGuarantee:
        honest = super().guarantee(layer_names)
        return replace(honest, sigma=honest.sigma / self.factor)


@dataclass(frozen=True)
class NoNoise(NoiseSource):
    """A noise source whose every normal draw is 0: the mechanism's sampler, broken."""

    def normal(self, shape, *names: object) -> torch.Tensor:
        return torch.zeros(tuple(shape), dtype=torch.float64)
