"""One ledger per data pool: what every release on a pool's private data has spent.

Each noisy release of a pool (a mechanism at an epsilon: one draw of noise on the pool's
statistics) is one entry, whatever number of estimators read it: estimators are
post-processing of the same noisy sums, and their mask files carry the same release digest
(``x_dp_release``, :func:`fedlib.dp.public.release_digest`). The pool's total is the
composition of all its entries (:func:`fedlib.dp.accountant.composed_epsilon`, at the sum of
their deltas). Diagnostics that read the exact private statistics (the headroom analysis) are
not DP at all: they are listed as such, and a pool with one has no finite total.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from fedlib.dp.samplers import NOISE_MODES, SEEDED


@dataclass
class Ledger:
    """A pool's releases (``label``, its ``x_dp`` dict, the digests of its files, the
    estimators that read it) and its non-private diagnostics (``label``, what it reads)."""

    pool: str
    releases: list[dict] = field(default_factory=list)
    diagnostics: list[dict] = field(default_factory=list)

    def add_release(self, label: str, header: dict, estimators, digests) -> None:
        if header.get("noise") not in NOISE_MODES:
            raise ValueError(f"release {label!r}: x_dp noise {header.get('noise')!r}, expected one of {NOISE_MODES}")
        self.releases.append({"label": label, "x_dp": dict(header), "estimators": sorted(estimators),
                              "digests": sorted(set(digests))})

    def add_diagnostic(self, label: str, reads: str) -> None:
        self.diagnostics.append({"label": label, "reads": reads})

    @property
    def delta(self) -> float:
        return sum(float(r["x_dp"]["delta"]) for r in self.releases)

    @property
    def epsilon(self) -> float:
        """The pool's total epsilon at :attr:`delta` (inf with a non-private diagnostic)."""
        from fedlib.dp.accountant import composed_epsilon

        if self.diagnostics:
            return math.inf
        return composed_epsilon([r["x_dp"] for r in self.releases], self.delta) if self.releases else 0.0

    @property
    def dp_epsilon(self) -> float:
        """The total of the DP releases alone (what the pool spent on DP, diagnostics apart)."""
        from fedlib.dp.accountant import composed_epsilon

        return composed_epsilon([r["x_dp"] for r in self.releases], self.delta) if self.releases else 0.0

    @property
    def simulation(self) -> bool:
        """Whether any release's noise was seeded (then nothing of the pool is private)."""
        return any(r["x_dp"]["noise"] == SEEDED for r in self.releases)

    def to_json(self) -> dict:
        return {"pool": self.pool, "releases": self.releases, "diagnostics": self.diagnostics,
                "total": {"epsilon_dp": self.dp_epsilon, "delta": self.delta,
                          "epsilon": None if math.isinf(self.epsilon) else self.epsilon}}

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def merged(cls, pool: str, ledgers) -> "Ledger":
        """One pool's ledger from the ledgers of its passes (e.g. one per sparsity)."""
        out = cls(pool)
        for ledger in ledgers:
            out.releases += ledger.releases
            out.diagnostics += ledger.diagnostics
        return out

    @classmethod
    def read(cls, path: Path) -> "Ledger":
        """A ledger file, checked field by field (a bad one names the file and the field)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a readable ledger ({err})") from None
        if not isinstance(data, dict) or not isinstance(data.get("pool"), str):
            raise ValueError(f"{path}: field 'pool': expected a string")
        for key in ("releases", "diagnostics"):
            if not isinstance(data.get(key), list) or not all(isinstance(r, dict) for r in data[key]):
                raise ValueError(f"{path}: field {key!r}: expected a list of objects")
        for i, release in enumerate(data["releases"]):
            header = release.get("x_dp")
            if not isinstance(header, dict) or not all(k in header for k in ("epsilon", "delta", "sigma", "releases",
                                                                             "noise")):
                raise ValueError(f"{path}: field 'releases[{i}].x_dp': expected a guarantee with epsilon, delta, "
                                 f"sigma, releases and noise")
        return cls(data["pool"], data["releases"], data["diagnostics"])
