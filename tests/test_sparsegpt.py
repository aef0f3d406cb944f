"""SparseGPT: metric, mask counts, and the OBS update checked against closed-form optima."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlib.groups import expected_pruned, pruned_count
from fedlib.methods import get_method
from fedlib.methods.sparsegpt import (
    SparseGPTPruner,
    SparseGPTUpdatePruner,
    damped_hessian,
    inverse_cholesky_upper,
    obs_prune,
)

torch.set_num_threads(1)

PERCDAMP = 0.01


def make_layer(rows: int, cols: int, seed: int = 0, quantize: bool = False) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = nn.Linear(cols, rows, bias=False)
    with torch.no_grad():
        w = torch.randn(rows, cols, generator=gen)
        if quantize:  # few distinct values, like the 4-bit embedded model: many ties
            w = torch.round(w * 2) / 2
        layer.weight.copy_(w)
    return layer


def make_inputs(n: int, cols: int, seed: int = 1, corr: float = 0.5) -> torch.Tensor:
    """Correlated features with different scales, so H is far from diagonal."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, cols, generator=gen)
    mix = torch.eye(cols) + corr * torch.randn(cols, cols, generator=gen) / cols**0.5
    scale = torch.exp(torch.randn(cols, generator=gen))
    return (z @ mix) * scale


def fitted(cls, layer, x, batches: int = 1, **opts):
    pruner = cls(layer, "model.layers.0.mlp.up_proj", **opts)
    for chunk in x.reshape(batches, -1, x.shape[-1]):
        pruner.add_batch(chunk)
    return pruner


def damped_from_inputs(x: torch.Tensor, percdamp: float = PERCDAMP) -> torch.Tensor:
    """H + lambda I computed directly from the inputs, independently of the module."""
    x = x.double()
    h = 2.0 / x.shape[0] * x.T @ x
    return h + percdamp * h.diagonal().mean() * torch.eye(h.shape[0], dtype=h.dtype)


def least_squares_optimum(weight, x, mask, percdamp: float = PERCDAMP) -> torch.Tensor:
    """Per row: min over w' with w'[mask] = 0 of (2/n)||X (w - w')||^2 + lambda ||w - w'||^2,
    solved as an ordinary least-squares problem on the stacked design [sqrt(2/n) X; sqrt(l) I]."""
    x = x.double()
    n, cols = x.shape
    h = 2.0 / n * x.T @ x
    lam = percdamp * h.diagonal().mean()
    design = torch.cat([(2.0 / n) ** 0.5 * x, lam.sqrt() * torch.eye(cols, dtype=x.dtype)])
    out = torch.zeros(weight.shape, dtype=torch.float64)
    for r in range(weight.shape[0]):
        w = weight[r].double()
        keep = ~mask[r]
        target = design @ w
        sol = torch.linalg.lstsq(design[:, keep], target.unsqueeze(1)).solution.squeeze(1)
        out[r, keep] = sol
    return out


def recon_error(weight, new_weight, hd) -> float:
    """1/2 * sum over rows of (w - w') Hd (w - w')^T."""
    delta = weight.double() - new_weight.double()
    return float(0.5 * torch.einsum("ri,ij,rj->", delta, hd, delta))


# --- registry ----------------------------------------------------------------------------------


def test_registry_names_and_modes():
    assert get_method("sparsegpt") is SparseGPTPruner
    assert get_method("sparsegpt_update") is SparseGPTUpdatePruner
    assert SparseGPTPruner.update is False and SparseGPTUpdatePruner.update is True
    assert SparseGPTPruner.needs_calibration
    p = SparseGPTPruner(make_layer(4, 8), "l")
    assert (p.percdamp, p.blocksize, p.dtype, p.metric_diag) == (
        0.01,
        128,
        torch.float64,
        "inverse",
    )


# --- the OBS update ----------------------------------------------------------------------------


@pytest.mark.parametrize("solve", ["column", "block"])
@pytest.mark.parametrize("blocksize", [1, 5, 8, 64])
def test_update_is_exactly_optimal_for_prefix_masks(blocksize, solve):
    """When every row prunes a prefix of its columns, each weight is fixed to zero before any
    surviving weight is, so sequential OBS equals the constrained least-squares optimum
    (pruning only column 0 is the special case of prefix length 1)."""
    rows, cols = 6, 24
    layer = make_layer(rows, cols)
    x = make_inputs(96, cols)
    lengths = [1, 3, 7, 11, 12, 20]  # crosses the block boundaries of every blocksize tested
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    for r, k in enumerate(lengths):
        mask[r, :k] = True
    pruner = fitted(SparseGPTUpdatePruner, layer, x, blocksize=blocksize, solve=solve)
    got = pruner.update_for_mask(mask).double()
    want = least_squares_optimum(layer.weight.detach(), x, mask)
    assert torch.all(got[mask] == 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # and the reported loss is the reconstruction error under the damped Hessian
    hd = damped_from_inputs(x)
    assert pruner.loss == pytest.approx(recon_error(layer.weight.detach(), got, hd), rel=1e-5)


def test_update_with_rank_deficient_hessian_matches_ridge_optimum():
    """Fewer tokens than features: H is singular; the damping makes it a ridge problem."""
    rows, cols = 4, 16
    layer = make_layer(rows, cols, seed=3)
    x = make_inputs(10, cols, seed=4)
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    mask[:, :5] = True
    got = fitted(SparseGPTUpdatePruner, layer, x, blocksize=4).update_for_mask(mask).double()
    want = least_squares_optimum(layer.weight.detach(), x, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_lazy_block_update_is_exact():
    """Blocking only reorders the arithmetic: any blocksize gives the same result."""
    rows, cols = 8, 30
    layer = make_layer(rows, cols, seed=5)
    x = make_inputs(80, cols, seed=6)
    mask = torch.rand(rows, cols, generator=torch.Generator().manual_seed(7)) < 0.5
    results = [
        fitted(SparseGPTUpdatePruner, layer, x, blocksize=bs).update_for_mask(mask).double()
        for bs in (1, 4, 7, 30, 128)
    ]
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("solve", ["column", "block"])
@pytest.mark.parametrize("group", ["layer", "row", "column", "2:4"])
def test_update_error_between_optimum_and_plain_zeroing(group, solve):
    """For its own mask, SparseGPT's weights reconstruct better than zeroing alone and no better
    than the least-squares optimum; the reported loss equals the true error."""
    rows, cols = 12, 32
    layer = make_layer(rows, cols, seed=8)
    x = make_inputs(128, cols, seed=9, corr=2.0)
    pruner = fitted(SparseGPTUpdatePruner, layer, x, blocksize=8, solve=solve)
    mask = pruner.prune(0.5, group, seed=0)
    w = layer.weight.detach()
    hd = damped_from_inputs(x)
    err_update = recon_error(w, pruner.updated_weight, hd)
    err_zero = recon_error(w, w.masked_fill(mask, 0.0), hd)
    err_opt = recon_error(w, least_squares_optimum(w, x, mask), hd)
    assert err_opt <= err_update * (1 + 1e-6)
    assert err_update < err_zero
    assert pruner.loss == pytest.approx(err_update, rel=1e-5)


@pytest.mark.parametrize("group", ["layer", "row", "column", "2:4", "fixed"])
def test_block_solve_equals_the_column_loop(group):
    """The batched triangular solve gives the column loop's masks and, up to rounding, its
    weights and loss, across block boundaries (blocksize 16 over 40 columns: a short last block)."""
    rows, cols = 24, 40
    w = make_layer(rows, cols, seed=13).weight.detach().double()
    upper = inverse_cholesky_upper(damped_from_inputs(make_inputs(160, cols, seed=14, corr=2.0)))
    opts = dict(blocksize=16, seed=0)
    if group == "fixed":
        opts["mask"] = torch.rand(rows, cols, generator=torch.Generator().manual_seed(15)) < 0.6
    else:
        opts.update(sparsity=0.5, group=group)
    w_col, m_col, loss_col = obs_prune(w, upper, solve="column", **opts)
    w_blk, m_blk, loss_blk = obs_prune(w, upper, solve="block", **opts)
    assert torch.equal(m_col, m_blk)
    assert torch.all(w_blk[m_blk] == 0)
    torch.testing.assert_close(w_blk, w_col, rtol=1e-10, atol=1e-10)
    assert loss_blk == pytest.approx(loss_col, rel=1e-10)


def test_solve_default_is_the_column_loop_on_the_host():
    pruner = SparseGPTUpdatePruner(make_layer(4, 8), "l")
    assert pruner.solve is None and pruner._solve_on(torch.device("cpu")) == "column"
    assert pruner._solve_on(torch.device("cuda", 0)) == "block"
    with pytest.raises(ValueError, match="solve must be one of"):
        SparseGPTUpdatePruner(make_layer(4, 8), "l", solve="rows")
    with pytest.raises(ValueError, match="solve must be one of"):
        obs_prune(torch.ones(2, 2), torch.eye(2), solve="rows")


def test_tensor_core_batch_gram_needs_half_activations_on_cuda():
    with pytest.raises(ValueError, match="batch_gram must be one of"):
        SparseGPTUpdatePruner(make_layer(4, 8), "l", batch_gram="fast")
    pruner = SparseGPTUpdatePruner(make_layer(4, 8), "l", batch_gram="tensor-cores")
    with pytest.raises(ValueError, match="needs bfloat16 or float16 activations on a CUDA device, got "
                                         "torch.float32 on cpu"):
        pruner.add_batch(torch.randn(3, 8))
    # linears fed one input share a Gram sum only when they form it alike
    exact = SparseGPTUpdatePruner(make_layer(4, 8), "l")
    assert not exact.adopt_statistics(pruner) and not pruner.adopt_statistics(exact)
    assert SparseGPTUpdatePruner(make_layer(4, 8), "l", batch_gram="tensor-cores").adopt_statistics(pruner)


def test_update_does_not_touch_layer_weight_and_zeros_pruned():
    layer = make_layer(10, 24, seed=10)
    before = layer.weight.detach().clone()
    pruner = fitted(SparseGPTUpdatePruner, layer, make_inputs(64, 24), blocksize=8)
    mask = pruner.prune(0.6, "layer", seed=1)
    assert torch.equal(layer.weight.detach(), before)
    new = pruner.updated_weight
    assert new is not None and new.dtype == torch.float32 and new.shape == before.shape
    assert torch.all(new[mask] == 0)
    assert not torch.equal(new[~mask], before[~mask])  # survivors were compensated

    mask_only = fitted(SparseGPTPruner, layer, make_inputs(64, 24))
    mask_only.prune(0.6, "layer", seed=1)
    assert mask_only.updated_weight is None
    assert torch.equal(layer.weight.detach(), before)


def test_float32_close_to_float64():
    layer = make_layer(16, 48, seed=11)
    x = make_inputs(128, 48, seed=12)
    p64 = fitted(SparseGPTUpdatePruner, layer, x, blocksize=16)
    p32 = fitted(SparseGPTUpdatePruner, layer, x, blocksize=16, dtype="float32")
    m64 = p64.prune(0.5, "row", seed=0)
    m32 = p32.update_for_mask(m64)
    torch.testing.assert_close(m32, p64.updated_weight, rtol=1e-3, atol=1e-3)


# --- the metric --------------------------------------------------------------------------------


def test_mask_only_metric_is_w2_over_inverse_hessian_diagonal():
    rows, cols = 7, 20
    layer = make_layer(rows, cols, seed=13)
    x = make_inputs(60, cols, seed=14)
    got = fitted(SparseGPTPruner, layer, x, batches=3).scores()
    hinv_diag = torch.linalg.inv(damped_from_inputs(x)).diagonal()
    want = layer.weight.detach().double() ** 2 / hinv_diag.reshape(1, -1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)


def test_cholesky_metric_is_trailing_inverse_diagonal():
    """U_jj^2 = [(Hd[j:, j:])^-1]_jj: the saliency once columns < j are fixed."""
    rows, cols = 5, 12
    layer = make_layer(rows, cols, seed=15)
    x = make_inputs(40, cols, seed=16)
    got = fitted(SparseGPTPruner, layer, x, metric_diag="cholesky").scores()
    hd = damped_from_inputs(x)
    diag = torch.stack([torch.linalg.inv(hd[j:, j:])[0, 0] for j in range(cols)])
    want = layer.weight.detach().double() ** 2 / diag.reshape(1, -1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("group", ["layer", "row"])
def test_one_block_update_selects_like_cholesky_metric(group):
    """With one block covering all columns, update mode selects its mask up front from the
    original weights and W^2/U_jj^2: the same mask as the mask-only Cholesky metric."""
    layer = make_layer(9, 20, seed=17)
    x = make_inputs(50, 20, seed=18)
    upd = fitted(SparseGPTUpdatePruner, layer, x, blocksize=128).prune(0.5, group, seed=0)
    chol = fitted(SparseGPTPruner, layer, x, metric_diag="cholesky").prune(0.5, group, seed=0)
    assert torch.equal(upd, chol)


def test_mask_only_layer_prunes_lowest_scores():
    layer = make_layer(8, 16, seed=19)
    pruner = fitted(SparseGPTPruner, layer, make_inputs(40, 16, seed=20))
    scores = pruner.scores()
    mask = pruner.prune(0.5, "layer", seed=0)
    assert scores[mask].max() <= scores[~mask].min()


# --- counts per group --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [SparseGPTPruner, SparseGPTUpdatePruner])
@pytest.mark.parametrize("group", ["layer", "row", "column", "2:4", "4:8"])
@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_mask_counts(cls, group, sparsity):
    rows, cols = 12, 48
    blocksize = 16 if ":" in group else 20  # 20 leaves a short last block (48 = 20 + 20 + 8)
    layer = make_layer(rows, cols, seed=21)
    pruner = fitted(cls, layer, make_inputs(64, cols, seed=22), blocksize=blocksize)
    mask = pruner.prune(sparsity, group, seed=3)
    assert mask.dtype == torch.bool and mask.shape == (rows, cols) and mask.device.type == "cpu"
    assert int(mask.sum()) == expected_pruned((rows, cols), sparsity, group)
    if group == "row":
        assert torch.all(mask.sum(1) == pruned_count(cols, sparsity))
    elif group == "column":
        assert torch.all(mask.sum(0) == pruned_count(rows, sparsity))
    elif ":" in group:
        n, m = map(int, group.split(":"))
        assert torch.all(mask.reshape(rows, cols // m, m).sum(2) == n)
    elif cls.update:  # layer: cumulative per-block budget
        for i1 in range(0, cols, blocksize):
            i2 = min(i1 + blocksize, cols)
            want = pruned_count(rows * i2, sparsity) - pruned_count(rows * i1, sparsity)
            assert int(mask[:, i1:i2].sum()) == want
    if cls.update:
        assert torch.all(pruner.updated_weight[mask] == 0)


def test_nm_needs_blocksize_multiple_of_m():
    pruner = fitted(SparseGPTUpdatePruner, make_layer(4, 24), make_inputs(30, 24), blocksize=6)
    with pytest.raises(ValueError, match="multiple of M"):
        pruner.prune(0.5, "4:8", seed=0)
    # mask-only mode does not block, so blocksize is irrelevant there
    mask = fitted(SparseGPTPruner, make_layer(4, 24), make_inputs(30, 24), blocksize=6).prune(
        0.5, "4:8", seed=0
    )
    assert torch.all(mask.reshape(4, 3, 8).sum(2) == 4)


# --- determinism, edge cases -------------------------------------------------------------------


@pytest.mark.parametrize("cls", [SparseGPTPruner, SparseGPTUpdatePruner])
def test_deterministic_and_batch_split_invariant(cls):
    layer = make_layer(10, 32, seed=23, quantize=True)
    x = make_inputs(64, 32, seed=24)
    a = fitted(cls, layer, x, batches=1, blocksize=8)
    b = fitted(cls, layer, x, batches=4, blocksize=8)
    for group in ("layer", "row", "column", "2:4"):
        ma, mb = a.prune(0.5, group, seed=5), b.prune(0.5, group, seed=5)
        assert torch.equal(ma, mb)
        if cls.update:
            torch.testing.assert_close(a.updated_weight, b.updated_weight, rtol=0, atol=1e-6)


def test_seed_breaks_ties():
    """Quantized weights + column group (a per-column constant Hessian factor): many exact
    ties, resolved by the seed."""
    layer = make_layer(16, 32, seed=25, quantize=True)
    pruner = fitted(SparseGPTPruner, layer, make_inputs(64, 32, seed=26))
    m1, m2 = pruner.prune(0.5, "column", 1), pruner.prune(0.5, "column", 2)
    assert torch.equal(m1, pruner.prune(0.5, "column", 1))
    assert not torch.equal(m1, m2)


@pytest.mark.parametrize("cls", [SparseGPTPruner, SparseGPTUpdatePruner])
def test_dead_inputs(cls):
    rows, cols = 6, 16
    layer = make_layer(rows, cols, seed=27)
    x = make_inputs(40, cols, seed=28)
    dead = [2, 9]
    x[:, dead] = 0.0
    pruner = fitted(cls, layer, x, blocksize=8)
    scores = pruner.scores()
    assert torch.isfinite(scores).all() and torch.all(scores[:, dead] == 0)
    mask = pruner.prune(0.25, "layer", seed=0)
    assert mask[:, dead].all()  # free to prune: the calibration data never uses them
    if cls.update:
        assert torch.isfinite(pruner.updated_weight).all()
        assert torch.all(pruner.updated_weight[:, dead] == 0)


def test_errors():
    layer = make_layer(4, 8)
    with pytest.raises(RuntimeError, match="calibration"):
        SparseGPTUpdatePruner(layer, "l").prune(0.5, "layer", 0)
    with pytest.raises(ValueError):
        SparseGPTPruner(layer, "l", dtype="float16")
    with pytest.raises(ValueError):
        SparseGPTPruner(layer, "l", metric_diag="full")
    with pytest.raises(ValueError):
        SparseGPTPruner(layer, "l", blocksize=0)
    p = SparseGPTPruner(layer, "l")
    with pytest.raises(ValueError, match="in_features"):
        p.add_batch(torch.randn(3, 9))


def test_obs_prune_fixed_mask_shape_check():
    hd, _ = damped_hessian(damped_from_inputs(make_inputs(20, 8)), PERCDAMP)
    u = inverse_cholesky_upper(hd)
    with pytest.raises(ValueError, match="mask shape"):
        obs_prune(torch.randn(3, 8, dtype=torch.float64), u, mask=torch.zeros(3, 7, dtype=bool))


# --- linears fed one input share their statistics ----------------------------------------------


class _Unshared(SparseGPTUpdatePruner):
    """The same method with statistics never shared: each linear accumulates its own H."""

    def adopt_statistics(self, other) -> bool:
        return False


def test_linears_fed_one_input_share_one_hessian(model):
    """q/k/v and gate/up of a block see one input tensor: after collect they hold one Gram sum,
    equal to 2/n X^T X of the inputs captured independently by hooks; the others hold their own."""
    from fedlib.runner import CPU, BlockRunner

    ids = torch.randint(0, 128, (6, 16), generator=torch.Generator().manual_seed(3))
    step = next(iter(BlockRunner(model, [ids], CPU, batch_size=4).steps()))
    captured = {name: [] for name in step.linears}
    hooks = [lin.register_forward_hook(lambda _m, inp, _o, n=name: captured[n].append(inp[0].detach().clone()))
             for name, lin in step.linears.items()]
    pruners = {name: SparseGPTUpdatePruner(lin, name) for name, lin in step.linears.items()}
    step.collect(0, pruners)
    for h in hooks:
        h.remove()
    groups = {}
    for name, p in pruners.items():
        groups.setdefault(id(p.stats), set()).add(name.rsplit(".", 1)[-1])
    assert sorted(map(sorted, groups.values())) == [
        ["down_proj"], ["gate_proj", "up_proj"], ["k_proj", "q_proj", "v_proj"], ["o_proj"]]
    for name, p in pruners.items():
        x = torch.cat(captured[name]).reshape(-1, p.layer.in_features).double()
        assert x.shape[0] == 6 * 16
        torch.testing.assert_close(p.hessian(), 2.0 / x.shape[0] * x.T @ x, rtol=1e-12, atol=1e-12)
    step.collect(0, pruners)  # collected again: still shared, each input counted once more
    assert {p.stats.n_tokens for p in pruners.values()} == {2 * 6 * 16}
    assert len({id(p.stats) for p in pruners.values()}) == 4


@pytest.mark.parametrize("method,group", [("sparsegpt_update", "layer"), ("sparsegpt_update", "2:4"),
                                          ("sparsegpt", "row")])
def test_shared_statistics_give_the_masks_of_unshared_ones(model, method, group):
    """Sharing is bit-exact: masks and updated weights equal those of pruners that each
    accumulate and factorise their own Hessian."""
    from fedlib.client import Pruning, prune_locally

    unshared = type("U", (_Unshared,), {"update": method == "sparsegpt_update"})
    ids = torch.randint(0, 128, (6, 16), generator=torch.Generator().manual_seed(4))
    a = prune_locally(model, ids, Pruning(method, 0.5, group, 0, batch_size=4))
    b = prune_locally(model, ids, Pruning(unshared, 0.5, group, 0, batch_size=4))
    assert a.masks.keys() == b.masks.keys() and a.weights.keys() == b.weights.keys()
    assert all(torch.equal(a.masks[k], b.masks[k]) for k in a.masks)
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert len(a.weights) == (len(a.masks) if method == "sparsegpt_update" else 0)
