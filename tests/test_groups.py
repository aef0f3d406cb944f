"""Top-k per comparison group against a brute-force sort with the documented tie-break."""

import numpy as np
import pytest
import torch

from fedlib.groups import expected_pruned, prune_lowest, pruned_count, tie_break_keys


def brute_force(scores, sparsity, group, seed, name):
    rows, cols = scores.shape
    keys = tie_break_keys(np.arange(rows * cols), seed, name, group).reshape(rows, cols)
    s = scores.numpy()
    if group == "layer":
        groups = [[(r, c) for r in range(rows) for c in range(cols)]]
    elif group == "row":
        groups = [[(r, c) for c in range(cols)] for r in range(rows)]
    elif group == "column":
        groups = [[(r, c) for r in range(rows)] for c in range(cols)]
    else:
        m = int(group.split(":")[1])
        groups = [[(r, c) for c in range(b, b + m)] for r in range(rows) for b in range(0, cols, m)]
    mask = np.zeros((rows, cols), dtype=bool)
    for members in groups:
        k = int(group.split(":")[0]) if ":" in group else pruned_count(len(members), sparsity)
        for rc in sorted(members, key=lambda rc: (s[rc], int(keys[rc])))[:k]:
            mask[rc] = True
    return torch.from_numpy(mask)


@pytest.mark.parametrize("group", ["layer", "row", "column", "2:4", "4:8"])
@pytest.mark.parametrize("ties", [False, True])
def test_prune_lowest_matches_brute_force(group, ties):
    gen = torch.Generator().manual_seed(1)
    for trial in range(12):
        rows = int(torch.randint(1, 10, (1,), generator=gen))
        cols = 8 * int(torch.randint(1, 4, (1,), generator=gen))
        if ties:  # few distinct values, like vote counts or 4-bit weights
            scores = torch.randint(0, 3, (rows, cols), generator=gen).float()
        else:
            scores = torch.rand(rows, cols, generator=gen)
        for sparsity in (0.0, 0.25, 0.5, 0.7, 1.0):
            got = prune_lowest(scores, sparsity, group, seed=3, name=f"t{trial}")
            assert torch.equal(got, brute_force(scores, sparsity, group, 3, f"t{trial}"))


@pytest.mark.parametrize("group", ["layer", "row", "column", "2:4", "4:8"])
def test_counts_are_exact(group):
    scores = torch.randint(0, 5, (24, 64)).float()
    mask = prune_lowest(scores, 0.6, group, seed=0)
    assert int(mask.sum()) == expected_pruned((24, 64), 0.6, group)
    if group == "row":
        assert (mask.sum(1) == pruned_count(64, 0.6)).all()
    if group == "column":
        assert (mask.sum(0) == pruned_count(24, 0.6)).all()
    if ":" in group:
        n, m = map(int, group.split(":"))
        assert (mask.reshape(24, -1, m).sum(-1) == n).all()


def test_ties_depend_on_seed_and_are_reproducible():
    scores = torch.zeros(16, 32)  # all tied: the choice is entirely the tie-break
    a = prune_lowest(scores, 0.5, "layer", seed=0, name="x")
    assert torch.equal(a, prune_lowest(scores, 0.5, "layer", seed=0, name="x"))
    assert not torch.equal(a, prune_lowest(scores, 0.5, "layer", seed=1, name="x"))
    assert not torch.equal(a, prune_lowest(scores, 0.5, "layer", seed=0, name="y"))
    # not an index-order tie-break: pruned weights are spread over the columns
    assert 0.3 < a[:, :16].float().mean() < 0.7


def test_bad_inputs():
    with pytest.raises(ValueError, match="2-D"):
        prune_lowest(torch.zeros(4), 0.5, "row", 0)
    with pytest.raises(ValueError, match="unknown comparison group"):
        prune_lowest(torch.zeros(4, 4), 0.5, "diagonal", 0)
    with pytest.raises(ValueError, match="not divisible"):
        prune_lowest(torch.zeros(4, 6), 0.5, "2:4", 0)
    with pytest.raises(ValueError, match="NaN"):
        prune_lowest(torch.full((2, 2), float("nan")), 0.5, "row", 0)


def test_sparsity_for_count_prunes_exactly_that_count():
    from fedlib.groups import pruned_count, sparsity_for_count

    for size in (1, 2, 3, 7, 10, 64, 1000, 4096 * 11008):
        for count in sorted({0, 1, size // 3, size // 2, size - 1, size}):
            assert pruned_count(size, sparsity_for_count(count, size)) == count, (size, count)
