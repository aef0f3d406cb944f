"""Perplexity on non-overlapping token windows (as Wanda/SparseGPT evaluate)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def perplexity(model: nn.Module, windows: torch.Tensor, batch_size: int = 1) -> dict:
    """exp(mean negative log-likelihood) over every predicted token of every window.

    Each window is scored independently (no context carried over); the first token of a
    window is context only. The reference multiplies each window's mean loss by ``seqlen``
    instead of ``seqlen - 1``; the difference is below 0.2 % at 512 tokens and this is the
    exact token average.
    """
    total_nll = 0.0
    total_tokens = 0
    for batch in windows.long().split(batch_size, dim=0):
        logits = model(input_ids=batch, use_cache=False).logits
        nll = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
            batch[:, 1:].reshape(-1),
            reduction="sum",
        )
        total_nll += float(nll)
        total_tokens += batch[:, 1:].numel()
    mean = total_nll / total_tokens
    return {"ppl": math.exp(mean), "nll": mean, "tokens": total_tokens, "windows": int(windows.shape[0])}
