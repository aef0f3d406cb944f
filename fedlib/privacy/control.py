"""The audit's positive control: a deliberately broken DP client that the audit must catch.

An audit whose bound stays below the proven ε for every mechanism proves nothing about any of
them (its ceiling, :func:`fedlib.privacy.membership.epsilon_ceiling`, may simply be too low). The
control runs the same audit on :class:`UnderstatedSensitivity`: the client of
:mod:`fedlib.dp.gaussian` with its noise calibrated to a sensitivity ``factor`` times smaller than
the real one, while it still claims the requested (ε, δ). It is not (ε, δ)-DP, and an audit that
works shows a lower bound above the claimed ε. Audit code only: no site ever runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from fedlib.dp.gaussian import DPGuarantee, DPTarget


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
