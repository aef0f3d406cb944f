"""Rows compared with public-only on the same evaluation windows: the evaluation files' per-window
NLLs, the paired bootstrap over data seeds, noise draws and windows, its 95 % intervals and the
change cell the study tables print (:mod:`fedlib.studies.domain`, :mod:`fedlib.studies.headroom`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

BOOTSTRAP = 2000


def load(path) -> dict:
    return json.loads(Path(path).read_text())


def window_nll(result: dict, dataset: str) -> np.ndarray:
    ppl = result["perplexity"][dataset]
    if "window_nll" not in ppl:
        raise ValueError(f"{result.get('label')}: no per-window NLL for {dataset} (evaluated before fedlib kept them)")
    return np.asarray(ppl["window_nll"], dtype=np.float64)


class Paired:
    """Per-window NLL differences of a row against public-only, (seeds, noise draws, windows), and
    the bootstrap resamples shared by every row of one sparsity: seeds, then within each resampled
    seed its noise draws, then windows (a row without noise has one draw per seed)."""

    def __init__(self, seeds: int, draws: int, windows: int, rng: np.random.Generator):
        self.seed_draws = rng.integers(0, seeds, size=(BOOTSTRAP, seeds))
        self.window_draws = rng.integers(0, windows, size=(BOOTSTRAP, windows))
        self.noise_draws = rng.integers(0, draws, size=(BOOTSTRAP, seeds, draws))

    def resampled(self, diff: np.ndarray) -> np.ndarray:
        """The mean difference in every bootstrap resample."""
        noise = self.noise_draws if diff.shape[1] > 1 else np.zeros_like(self.noise_draws[:, :, :1])
        return np.array([diff[s[:, None], r][:, :, w].mean()
                         for s, r, w in zip(self.seed_draws, noise, self.window_draws)])


def interval(values: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def _pct(delta: float) -> str:
    return f"{math.expm1(delta):+.1%}"


def change_cell(point: float, ci: tuple[float, float]) -> str:
    return f"{_pct(point)} [{_pct(ci[0])}, {_pct(ci[1])}]"


def kept_cell(kept: float, ci: tuple[float, float]) -> str:
    """A share of the gain kept and its interval, in whole percent."""
    return f"{kept:.0%} [{ci[0]:.0%}, {ci[1]:.0%}]"


def percents(values) -> str:
    """Shares in whole percent, comma-separated (the gain kept per noise draw)."""
    return ", ".join(f"{v:.0%}" for v in values)
