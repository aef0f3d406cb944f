"""Evaluation of pruned models: perplexity and zero-shot accuracy."""
