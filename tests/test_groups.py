"""Top-k per comparison group against a brute-force sort with the documented tie-break."""

import numpy as np
import pytest
import torch

import fedlib.groups
from fedlib.groups import expected_pruned, prune_lowest, pruned_count, tie_break_keys


def brute_force(scores, sparsity, group, seed, name):
    rows, cols = scores.shape
    keys = tie_break_keys(torch.arange(rows * cols), seed, name, group).reshape(rows, cols)
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


def _splitmix64(value: int) -> int:
    """splitmix64's finaliser in Python integers (arbitrary precision, reduced modulo 2^64)."""
    mod = 1 << 64
    z = (value + 0x9E3779B97F4A7C15) % mod
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % mod
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % mod
    return z ^ (z >> 31)


def test_tie_break_keys_order_is_splitmix64_in_unsigned_order():
    """The int64 keys (wrapping products, logical shifts, sign bit flipped) order weights as
    splitmix64's unsigned 64-bit values do, computed independently in Python integers."""
    index = torch.tensor([0, 1, 2, 7, 1000, 123456789, (1 << 40) + 3, (1 << 62) + 5])
    base = fedlib.groups._seed_value(3, "layer.q", "row")
    reference = [_splitmix64(int(i) ^ base) for i in index]
    keys = tie_break_keys(index, 3, "layer.q", "row").tolist()
    assert sorted(range(len(index)), key=lambda i: keys[i]) == sorted(range(len(index)), key=lambda i: reference[i])
    assert [k + (1 << 63) for k in keys] == reference  # the flipped sign bit is the only change


@pytest.mark.parametrize("group", ["layer", "row", "column", "2:4"])
def test_device_kernel_gives_the_host_masks(monkeypatch, group):
    """The kernel a GPU runs (torch's kthvalue for the threshold, keys in int64 torch ops), fed
    the same scores as the host kernel (numpy's introselect), selects the same weights: with
    few distinct values (ties decided by keys) and without."""
    gen = torch.Generator().manual_seed(5)
    cases = [torch.randint(0, 4, (48, 64), generator=gen).float(),
             torch.rand(48, 64, generator=gen),
             torch.randint(0, 17, (48, 64), generator=gen).float() * torch.rand(64, generator=gen)]
    host = [prune_lowest(scores, s, group, 11, "m") for scores in cases for s in (0.3, 0.5, 0.7)]
    monkeypatch.setattr(fedlib.groups, "kth_smallest",
                        lambda values, k: values.kthvalue(k, dim=1, keepdim=True).values)
    device = [prune_lowest(scores, s, group, 11, "m") for scores in cases for s in (0.3, 0.5, 0.7)]
    assert all(torch.equal(a, b) for a, b in zip(host, device))
