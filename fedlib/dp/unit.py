"""The unit a DP release protects, and how many windows it may contribute.

A release is (epsilon, delta)-DP with respect to replacing one **unit** of a client's text:

* ``document``: one document (a C4 or user JSONL document, a WikiText-2 article between its
  `` = Title = `` headings);
* ``span``: one of the disjoint spans a text without documents (PTB) is cut into;
* ``client``: a client's whole contribution, its windows' mean deviation clipped once
  (the normalised and distributed mechanisms);
* ``window``: one calibration window, the membership audit's game (a site's file names one of
  the others: a window drawn at random offsets overlaps others, so it protects no text).

Under DP, windows are cut so that no token of a client's text is in two windows of one release
(:func:`fedlib.data.calibration_windows` with a unit), and each unit contributes at most ``k``
windows (``windows_per_unit``). Replacing a unit then moves at most k clipped rows of the sum,
so the sum's L2 sensitivity is k times a window's (triangle inequality); the mechanisms scale
the noise by :attr:`ProtectedUnit.sensitivity_factor`, and the accountant's multiplier is
unchanged. A client unit is one row (its clipped mean): factor 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DOCUMENT, SPAN, CLIENT, WINDOW = "document", "span", "client", "window"
UNITS = (DOCUMENT, SPAN, CLIENT, WINDOW)
#: the units a token file cut for DP may declare (client and window are not properties of text)
TEXT_UNITS = (DOCUMENT, SPAN)


@dataclass(frozen=True)
class ProtectedUnit:
    """``kind`` (one of :data:`UNITS`) and ``windows``: the most windows one unit contributes
    (k; 1 for a client, whose windows enter as one clipped mean)."""

    kind: str = WINDOW
    windows: int = 1

    def __post_init__(self):
        if self.kind not in UNITS:
            raise ValueError(f"protected unit {self.kind!r}: known {', '.join(UNITS)}")
        if type(self.windows) is not int or self.windows < 1:
            raise ValueError(f"windows per unit must be an integer >= 1, got {self.windows!r}")
        if self.kind in (CLIENT, WINDOW) and self.windows != 1:
            raise ValueError(f"a {self.kind} unit contributes one row: windows per unit 1, got {self.windows}")

    @property
    def sensitivity_factor(self) -> int:
        """How many clipped rows of the sum replacing one unit moves."""
        return self.windows

    @property
    def clips_client(self) -> bool:
        """Whether each client's contribution is clipped once (its windows' mean)."""
        return self.kind == CLIENT


def unit_of_tokens(meta: dict, path: Path | str) -> ProtectedUnit:
    """The unit a token file's windows were cut by (``fedlib calibration-pool --unit``): a DP
    release on windows cut otherwise (random offsets, with replacement) is refused, naming the
    file and the field."""
    kind = meta.get("unit")
    if kind not in TEXT_UNITS:
        raise ValueError(f"{path}: field 'unit' is {kind!r}; DP needs windows cut disjointly by unit "
                        f"({' or '.join(TEXT_UNITS)}: fedlib calibration-pool --unit), not drawn at random offsets")
    windows = meta.get("windows_per_unit")
    if type(windows) is not int or windows < 1:
        raise ValueError(f"{path}: field 'windows_per_unit' is {windows!r}; expected an integer >= 1")
    return ProtectedUnit(kind, windows)


def common_unit(units) -> ProtectedUnit:
    """The unit of a release over several token files (clients' shards): one kind, the largest k."""
    units = list(units)
    kinds = {u.kind for u in units}
    if len(kinds) != 1:
        raise ValueError(f"one release protects one kind of unit; the clients' files declare {sorted(kinds)}")
    return ProtectedUnit(units[0].kind, max(u.windows for u in units))
