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
_EXPORTS = {
    "debias_counts": "fedlib.privacy.defence",
    "mask_epsilon_composed": "fedlib.privacy.defence",
    "randomized_response": "fedlib.privacy.defence",
    "randomized_response_masks": "fedlib.privacy.defence",
    "rr_bit_llr": "fedlib.privacy.defence",
    "rr_epsilon": "fedlib.privacy.defence",
    "rr_flip_probability": "fedlib.privacy.defence",
    "rr_keep_probability": "fedlib.privacy.defence",
    "bernoulli_entropy_bits": "fedlib.privacy.entropy",
    "binary_entropy_bits": "fedlib.privacy.entropy",
    "entropy_comparison": "fedlib.privacy.entropy",
    "fp16_entropy_bits": "fedlib.privacy.entropy",
    "histogram_entropy_bits": "fedlib.privacy.entropy",
    "layer_entropies": "fedlib.privacy.entropy",
    "mask_ensemble_entropy_bits": "fedlib.privacy.entropy",
    "model_entropy_bits": "fedlib.privacy.entropy",
    "weighted_mean": "fedlib.privacy.entropy",
    "InversionResult": "fedlib.privacy.inversion",
    "bag_overlap": "fedlib.privacy.inversion",
    "block0_mean_sq": "fedlib.privacy.inversion",
    "invert_block0_masks": "fedlib.privacy.inversion",
    "position_match": "fedlib.privacy.inversion",
    "token_sq_activations": "fedlib.privacy.inversion",
    "wanda_block0_masks": "fedlib.privacy.inversion",
    "TprAtFpr": "fedlib.privacy.membership",
    "auc_ci": "fedlib.privacy.membership",
    "audit_ceilings": "fedlib.privacy.membership",
    "audit_epsilon": "fedlib.privacy.membership",
    "bootstrap_auc_ci": "fedlib.privacy.membership",
    "clopper_pearson": "fedlib.stats",
    "confusion_at_threshold": "fedlib.privacy.membership",
    "direction_statistic": "fedlib.privacy.membership",
    "epsilon_ceiling": "fedlib.privacy.membership",
    "epsilon_lower_bound": "fedlib.privacy.membership",
    "lira_scores": "fedlib.privacy.membership",
    "roc_auc": "fedlib.privacy.membership",
    "roc_curve": "fedlib.privacy.membership",
    "separated_auc_bound": "fedlib.privacy.membership",
    "signal_strength": "fedlib.privacy.membership",
    "target_direction": "fedlib.privacy.membership",
    "tpr_at_fpr": "fedlib.privacy.membership",
    "hamming_count": "fedlib.privacy.similarity",
    "hamming_fraction": "fedlib.privacy.similarity",
    "hamming_per_layer": "fedlib.privacy.similarity",
    "hamming_total": "fedlib.privacy.similarity",
    "mean_pairwise_hamming": "fedlib.privacy.similarity",
    "pairwise_hamming": "fedlib.privacy.similarity",
}

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
