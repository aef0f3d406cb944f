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

# Each name is imported from its module on first use (PEP 562): the workflow's Snakefile imports
# fedlib.privacy.stages, and this facade must not cost it scipy and torch.
_MODULES = {
    "fedlib.privacy.defence": (
        "debias_counts", "mask_epsilon_composed", "randomized_response", "randomized_response_masks",
        "rr_bit_llr", "rr_epsilon", "rr_flip_probability", "rr_keep_probability",
    ),
    "fedlib.privacy.entropy": (
        "bernoulli_entropy_bits", "binary_entropy_bits", "entropy_comparison", "fp16_entropy_bits",
        "histogram_entropy_bits", "layer_entropies", "mask_ensemble_entropy_bits", "model_entropy_bits",
        "weighted_mean",
    ),
    "fedlib.privacy.inversion": (
        "InversionResult", "bag_overlap", "block0_mean_sq", "invert_block0_masks", "position_match",
        "token_sq_activations", "wanda_block0_masks",
    ),
    "fedlib.privacy.membership": (
        "TprAtFpr", "auc_ci", "audit_ceilings", "audit_epsilon", "bootstrap_auc_ci",
        "confusion_at_threshold", "direction_statistic", "epsilon_ceiling", "epsilon_lower_bound",
        "lira_scores", "roc_auc", "roc_curve", "separated_auc_bound", "signal_strength", "target_direction",
        "tpr_at_fpr",
    ),
    "fedlib.stats": (
        "clopper_pearson",
    ),
    "fedlib.privacy.similarity": (
        "hamming_count", "hamming_fraction", "hamming_per_layer", "hamming_total", "mean_pairwise_hamming",
        "pairwise_hamming",
    ),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
