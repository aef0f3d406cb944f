"""OWL (Yin et al., 2024): outlier-weighted layerwise sparsity, on top of Wanda.

Blocks with many activation outliers are pruned less. Two passes over the client's
calibration data:

1. **Plan** (:meth:`OWLPruner.plan`): the calibration activations are propagated through the
   *dense* model, block by block (as the reference ``prune_wanda_outlier`` does in its first
   pass: it never prunes while measuring). For block ``l`` the Wanda metric
   ``|W_ij| * ||X_j||_2`` of all its linears is pooled into one vector, and the block's
   *layerwise outlier distribution* is

       D_l = #{metric > M * mean(metric of block l)} / #weights of block l,

   (the reference concatenates the metrics of the block's linears and counts against the mean
   of that pooled vector, so large layers weigh in proportion to their size).
   Then, with ``lam`` = lambda,

       d_l   = 2*lam * (D_l - min D) / (max D - min D)      in [0, 2*lam]
       s_l   = target - (d_l - mean(d))                     (the reference's rescaling)

   so the block sparsities average to ``target``, span at most ``2*lam``, and blocks with the
   most outliers get the lowest sparsity. Ratios are clipped to ``[0, 1]`` and re-centred (the
   reference instead floors a non-positive ratio at 0.01); this only matters when
   ``target < 2*lam``. The mean is weighted by block size so that the whole-model sparsity is
   the target also for models whose blocks differ in size (for LLaMA-like models all blocks
   are equal, and this is the reference's plain mean).
2. **Prune**: Wanda, layer by layer (block ``l+1`` sees block ``l`` pruned), every linear of
   block ``l`` at ratio ``s_l`` within the local comparison group.

Defaults ``outlier_m = 5`` and ``lam = 0.08`` are the reference's LLaMA-7B settings
(``llama7b_wanda_owll.sh``; its argparse default for ``Hyper_m`` is 3). With ``lam = 0`` OWL is
exactly Wanda. N:M groups are rejected: OWL varies the ratio per block, which an N:M pattern
cannot express (the reference's N:M variant varies N, a different method).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from fedlib.groups import GROUPS
from fedlib.methods.wanda import WandaPruner


def check_unstructured(method: str, group: str) -> None:
    if group not in GROUPS:
        raise ValueError(
            f"{method} allocates a different sparsity to each layer and needs an unstructured "
            f"comparison group {GROUPS}, got {group!r}"
        )


def recentre(ratios: np.ndarray, weights: np.ndarray, target: float, lo: float = 0.0,
             hi: float = 1.0) -> np.ndarray:
    """``clip(ratios + delta, lo, hi)`` with the shift ``delta`` chosen so that the
    ``weights``-weighted mean equals ``target`` (bisection; exact to ~1e-12)."""
    ratios = np.asarray(ratios, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if not lo <= target <= hi:
        raise ValueError(f"target {target} outside [{lo}, {hi}]")

    def mean(delta: float) -> float:
        return float(np.average(np.clip(ratios + delta, lo, hi), weights=weights))

    a, b = lo - ratios.max() - 1.0, hi - ratios.min() + 1.0  # mean(a) = lo, mean(b) = hi
    for _ in range(200):
        mid = (a + b) / 2
        if mean(mid) < target:
            a = mid
        else:
            b = mid
    return np.clip(ratios + (a + b) / 2, lo, hi)


def owl_ratios(outlier_ratios, target: float, lam: float, weights=None) -> np.ndarray:
    """Block sparsities from block outlier ratios (see the module docstring)."""
    d = np.asarray(outlier_ratios, dtype=np.float64)
    weights = np.ones_like(d) if weights is None else np.asarray(weights, dtype=np.float64)
    spread = d.max() - d.min() if d.size else 0.0
    if lam == 0 or spread == 0:
        return np.full(d.shape, float(target))
    scaled = (d - d.min()) / spread * (2.0 * lam)
    ratios = target - (scaled - np.average(scaled, weights=weights))
    if ratios.min() < 0 or ratios.max() > 1:
        ratios = recentre(ratios, weights, target)
    return ratios


def outlier_ratio(metrics: list[torch.Tensor], m: float) -> float:
    """Fraction of the pooled metric entries above ``m`` times their mean."""
    pooled = torch.cat([x.reshape(-1).double() for x in metrics])
    return float((pooled > m * pooled.mean()).sum()) / pooled.numel()


class OWLPruner(WandaPruner):
    """Wanda at per-block ratios from OWL's plan: registry name ``owl``.

    Options (``method_options``): ``outlier_m`` (M, default 5), ``lam`` (lambda, default 0.08).
    """

    name = "owl"
    allocation = "nonuniform"

    def __init__(self, layer: nn.Linear, layer_name: str, *, outlier_m: float = 5.0,
                 lam: float = 0.08):
        super().__init__(layer, layer_name)
        self.outlier_m, self.lam = _check_options(outlier_m, lam)

    @classmethod
    def layer_sparsity_bounds(cls, sparsity: float, options: Mapping) -> tuple[float, float]:
        """``target ± 2·lam`` within [0, 1]: the rescaled outlier ratios span ``[0, 2·lam]``
        and are centred on their (weighted) mean, so a block with the fewest (most) outliers
        can sit up to ``2·lam`` above (below) the target, e.g. one outlier-rich block among
        many; re-centring after clipping to [0, 1] only moves ratios towards the target."""
        _, lam = _options(options)
        return max(0.0, sparsity - 2 * lam), min(1.0, sparsity + 2 * lam)

    @classmethod
    @torch.no_grad()
    def plan(
        cls,
        model,
        input_ids: torch.Tensor,
        sparsity: float,
        group: str = "row",
        options: Mapping | None = None,
        batch_size: int = 8,
        placement=None,
    ) -> dict[str, float]:
        """Per-linear sparsity (all linears of a block share their block's ratio). ``model``:
        a model or :class:`~fedlib.models.ModelHandle`; ``placement``: where the dense pass
        runs (:class:`fedlib.runner.Placement`, default the CPU)."""
        m, lam = _options(options)
        check_unstructured(cls.name, group)
        if input_ids is None:
            raise ValueError("owl needs calibration data")
        blocks, outliers, sizes = block_outlier_ratios(model, input_ids, m, batch_size, placement)
        ratios = owl_ratios(outliers, sparsity, lam, sizes)
        return {name: float(ratio) for names, ratio in zip(blocks, ratios) for name in names}


@torch.no_grad()
def block_outlier_ratios(
    model, input_ids: torch.Tensor, m: float, batch_size: int = 8, placement=None,
) -> tuple[list[list[str]], list[float], list[int]]:
    """(linear names of each block, outlier ratio D_l of each block, weights of each block),
    from the Wanda metric on calibration activations propagated through the dense model."""
    from fedlib.runner import CPU, BlockRunner

    runner = BlockRunner(model, [input_ids], placement or CPU, batch_size)
    blocks: list[list[str]] = []
    outliers, sizes = [], []
    for step in runner.steps():
        stats = {name: WandaPruner(linear, name) for name, linear in step.linears.items()}
        step.collect(0, stats)
        outliers.append(outlier_ratio([p.scores() for p in stats.values()], m))
        sizes.append(sum(linear.weight.numel() for linear in step.linears.values()))
        blocks.append(list(step.linears))
        del stats
        step.propagate(0, None)  # dense propagation, as the reference's measuring pass
    return blocks, outliers, sizes


def _options(options: Mapping | None) -> tuple[float, float]:
    """(M, lambda) from ``method_options``, defaults filled in, checked."""
    options = dict(options or {})
    unknown = set(options) - {"outlier_m", "lam"}
    if unknown:
        raise ValueError(f"owl: unknown options {sorted(unknown)}; known: outlier_m, lam")
    return _check_options(options.get("outlier_m", 5.0), options.get("lam", 0.08))


def _check_options(m, lam) -> tuple[float, float]:
    m, lam = float(m), float(lam)
    if m <= 0:
        raise ValueError(f"owl: outlier_m (M) must be > 0, got {m}")
    if not 0 <= lam <= 0.5:
        raise ValueError(f"owl: lam (lambda) must be in [0, 0.5], got {lam}")
    return m, lam
