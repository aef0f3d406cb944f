"""Privacy audit of shared pruning masks (FedPrLLM App. C, made into real measurements).

* :mod:`~fedlib.privacy.entropy` — empirical entropy of masks vs fp16 weights.
* :mod:`~fedlib.privacy.similarity` — Hamming distance between masks / mask dicts.
* :mod:`~fedlib.privacy.membership` — ROC / AUC / TPR at low FPR, Clopper-Pearson and
  bootstrap intervals, the empirical ε lower bound, LiRA-style scores, signal strength.
* :mod:`~fedlib.privacy.defence` — randomized response on mask bits (per-bit local DP)
  and the server's debiased vote counts.
* :mod:`~fedlib.privacy.inversion` — reconstructing calibration tokens from block-0 masks.

The audit's workflow stages built on these are :mod:`fedlib.privacy.stages`; mask-file bits
are read with :mod:`fedlib.privacy.bits`.

Mask convention everywhere: bool tensors, True = pruned.
"""

from fedlib.privacy.defence import (
    debias_counts,
    mask_epsilon_composed,
    randomized_response,
    randomized_response_masks,
    rr_bit_llr,
    rr_epsilon,
    rr_flip_probability,
    rr_keep_probability,
)
from fedlib.privacy.entropy import (
    bernoulli_entropy_bits,
    binary_entropy_bits,
    entropy_comparison,
    fp16_entropy_bits,
    histogram_entropy_bits,
    layer_entropies,
    mask_ensemble_entropy_bits,
    model_entropy_bits,
    weighted_mean,
)
from fedlib.privacy.inversion import (
    InversionResult,
    bag_overlap,
    block0_mean_sq,
    invert_block0_masks,
    position_match,
    token_sq_activations,
    wanda_block0_masks,
)
from fedlib.privacy.membership import (
    TprAtFpr,
    auc_ci,
    audit_ceilings,
    audit_epsilon,
    bootstrap_auc_ci,
    confusion_at_threshold,
    direction_statistic,
    epsilon_ceiling,
    epsilon_lower_bound,
    lira_scores,
    roc_auc,
    roc_curve,
    separated_auc_bound,
    signal_strength,
    target_direction,
    tpr_at_fpr,
)
from fedlib.privacy.similarity import (
    hamming_count,
    hamming_fraction,
    hamming_per_layer,
    hamming_total,
    mean_pairwise_hamming,
    pairwise_hamming,
)
from fedlib.stats import clopper_pearson

__all__ = [
    "debias_counts",
    "mask_epsilon_composed",
    "randomized_response",
    "randomized_response_masks",
    "rr_bit_llr",
    "rr_epsilon",
    "rr_flip_probability",
    "rr_keep_probability",
    "bernoulli_entropy_bits",
    "binary_entropy_bits",
    "entropy_comparison",
    "fp16_entropy_bits",
    "histogram_entropy_bits",
    "layer_entropies",
    "mask_ensemble_entropy_bits",
    "model_entropy_bits",
    "weighted_mean",
    "InversionResult",
    "bag_overlap",
    "block0_mean_sq",
    "invert_block0_masks",
    "position_match",
    "token_sq_activations",
    "wanda_block0_masks",
    "TprAtFpr",
    "auc_ci",
    "audit_ceilings",
    "audit_epsilon",
    "bootstrap_auc_ci",
    "clopper_pearson",
    "confusion_at_threshold",
    "direction_statistic",
    "epsilon_ceiling",
    "epsilon_lower_bound",
    "lira_scores",
    "roc_auc",
    "roc_curve",
    "separated_auc_bound",
    "signal_strength",
    "target_direction",
    "tpr_at_fpr",
    "hamming_count",
    "hamming_fraction",
    "hamming_per_layer",
    "hamming_total",
    "mean_pairwise_hamming",
    "pairwise_hamming",
]
