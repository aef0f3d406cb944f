"""Non-IID Dirichlet split of a labelled mixture pool, and the pool itself."""

import numpy as np
import pytest
import torch

from conftest import REPO
from fedlib.data import DataError, calibration_split, dirichlet_partition, mixture_pool

PAPER_LABELS = [0] * 8 + [1] * 8 + [2] * 8  # FedPrLLM Sec. 4.3: 8 each of WikiText-2, C4, PTB


def _label_shares(parts, labels, n_labels):
    return np.array([[sum(labels[i] == c for i in p) / max(len(p), 1) for c in range(n_labels)] for p in parts])


def test_every_sample_exactly_once_and_seeded():
    for seed in range(20):
        parts = dirichlet_partition(PAPER_LABELS, 12, 5.0, seed)
        flat = sorted(i for p in parts for i in p)
        assert flat == list(range(24)) and len(parts) == 12
        assert min(len(p) for p in parts) >= 1  # every client can compute a mask
        assert all(p == sorted(p) for p in parts)
        assert parts == dirichlet_partition(PAPER_LABELS, 12, 5.0, seed)
    assert dirichlet_partition(PAPER_LABELS, 12, 5.0, 0) != dirichlet_partition(PAPER_LABELS, 12, 5.0, 1)
    sizes = [len(p) for s in range(50) for p in dirichlet_partition(PAPER_LABELS, 12, 5.0, s)]
    assert np.mean(sizes) == 2.0  # 24 samples over 12 clients


def test_large_alpha_is_near_uniform_small_alpha_is_skewed():
    labels = [c for c in range(3) for _ in range(600)]
    flat = dirichlet_partition(labels, 6, 1000.0, seed=0)
    shares = _label_shares(flat, labels, 3)
    assert np.abs(shares - 1 / 3).max() < 0.05
    assert max(len(p) for p in flat) / min(len(p) for p in flat) < 1.2
    skewed = dirichlet_partition(labels, 6, 0.05, seed=0, min_per_client=1)
    top_share = _label_shares(skewed, labels, 3).max(axis=1)
    assert top_share.mean() > 0.8  # most clients hold mostly one source
    assert sorted(i for p in skewed for i in p) == list(range(len(labels)))


def test_min_per_client_and_empty_clients():
    # with min_per_client=0 the first draw is accepted, so some clients can be empty
    empties = sum(
        sum(not p for p in dirichlet_partition(PAPER_LABELS, 12, 5.0, s, min_per_client=0)) for s in range(30)
    )
    assert empties > 0
    strict = dirichlet_partition(PAPER_LABELS, 8, 5.0, 0, min_per_client=3)
    assert min(len(p) for p in strict) >= 3
    with pytest.raises(DataError, match="at least 3"):
        dirichlet_partition(PAPER_LABELS, 12, 5.0, 0, min_per_client=3)
    with pytest.raises(DataError, match="in 5 draws"):
        dirichlet_partition([0] * 12, 12, 0.01, 0, max_tries=5)
    with pytest.raises(DataError, match="alpha"):
        dirichlet_partition(PAPER_LABELS, 4, 0.0, 0)


def test_mixture_pool(smollm_tokenizer):
    # the workflow test's slice of the mirror: the same files, tokenized in a fraction of a second
    data_dir = REPO / ".test" / "data"
    ids, labels = mixture_pool(smollm_tokenizer, data_dir, 2, 32, seed=0, c4_docs=(0, 50))
    assert ids.shape == (6, 32) and ids.dtype == torch.int32 and labels == [0, 0, 1, 1, 2, 2]
    # each block of rows is exactly calibration_windows of that dataset (seeded there)
    from fedlib.data import calibration_windows
    assert torch.equal(ids[2:4], calibration_windows(smollm_tokenizer, "c4", data_dir, 2, 32, 0, (0, 50)))
    assert calibration_split("wikitext2", data_dir).startswith("validation")
    assert calibration_split("wikitext2", None) == "train"
    parts = dirichlet_partition(labels, 3, 5.0, seed=0)
    assert sorted(i for p in parts for i in p) == list(range(6))
