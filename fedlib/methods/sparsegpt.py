"""SparseGPT (Frantar & Alistarh, 2023): OBS saliency from the layer Hessian, with or without
its sequential OBS weight update.

Two registered variants of one class:

``sparsegpt`` (:class:`SparseGPTPruner`, mask only)
    What FedPrLLM uses (its App. B.3, following Wanda's Table 7): SparseGPT's pruning metric,
    no weight update. The metric is computed once from the original weights,

        S_ij = W_ij^2 / [(H + lambda I)^-1]_jj,

    the OBS error of removing ``W_ij`` alone (Hassibi & Stork; SparseGPT eq. 3; the formula the
    FedPrLLM and Wanda papers print). The layer's weights are never changed.
``sparsegpt_update`` (:class:`SparseGPTUpdatePruner`)
    What FedSpaLLM clients run: the full SparseGPT algorithm. Columns are processed left to
    right; each column is fixed (pruned weights set to 0), and the OBS update compensates the
    error on the columns to its right, inside the current block of ``blocksize`` columns
    immediately and on later blocks lazily (one matrix product per block). The result is
    returned in ``updated_weight``; ``self.layer.weight`` is not touched.

Hessian: ``H = 2/n * sum_t x_t x_t^T`` over the ``n`` calibration tokens seen by
:meth:`~SparseGPTPruner.add_batch`. The reference divides by the number of *sequences*; the
constant factor changes neither the mask nor the update (damping is relative to ``mean(diag H)``,
and the metric and the update are invariant to rescaling H), only the scale of
:attr:`~SparseGPTPruner.loss`. ``H`` is accumulated in float64 by default (option ``dtype``):
a float32 sum over 10^5 tokens loses about 3 of its 7 digits and depends on how the calibration
set was cut into batches, while clients in a federation must get reproducible masks from the
same data; the Cholesky factorisations and the update then run in the same dtype. ``dtype=
"float32"`` is the reference's precision and halves memory (a GPU with 11008-wide inputs holds
a 1 GB float64 Hessian per ``down_proj``). Linears fed the same input tensor (q/k/v, gate/up)
share one Gram sum and its factorisations (:class:`InputGram`; the reference computes each
once per linear): the same numbers, computed once.

As in the reference: inputs that are zero on every calibration token ("dead", ``H_jj == 0``)
get ``H_jj = 1`` and their weights are treated as zero (score 0, so they are pruned first and
cost nothing; in update mode they are zero in ``updated_weight`` whether or not the budget
reaches them); then ``lambda = percdamp * mean(diag H)`` is added to the diagonal; the update
uses ``U``, the upper Cholesky factor of ``(H + lambda I)^-1`` (``U^T U = H^-1``), whose
diagonal satisfies ``U_jj^2 = [(H_{j:, j:})^-1]_jj``: the inverse Hessian of the columns not yet
fixed, so the reference's block metric ``W^2 / diag(U)^2`` is the OBS saliency given that the
columns to the left are fixed.

Comparison groups (``prune(sparsity, group, seed)``), all selections through
:func:`fedlib.groups.prune_lowest`:

Mask-only mode: the metric exists for the whole matrix at once, so groups mean what they mean
for every other metric in fedlib: ``layer`` = lowest fraction of the whole matrix (the "layer
comparison" FedPrLLM attributes to SparseGPT), ``row`` = lowest fraction of each output row
(Wanda's group), ``column`` = lowest fraction of each input column (degenerates to magnitude,
as the FedPrLLM paper notes, since the Hessian factor is constant in a column), ``N:M`` = N of
every M consecutive weights of a row.

Update mode: a weight's saliency is only known once the columns to its left have been fixed
and their errors propagated, so each group is selected at the last moment before its first
column is processed, from the weights as updated so far, with ``W^2 / diag(U)^2``:

* ``layer`` -- the reference behaviour: at the start of each block of ``blocksize`` columns,
  the lowest entries of the rows x block sub-matrix;
* ``row`` -- at the start of each block, the lowest entries of each row of the block;
* ``column`` -- each input column separately, just before it is processed;
* ``N:M`` -- each group of M columns just before its first column (the reference); requires
  ``blocksize % M == 0`` so groups do not straddle blocks.

Counts: ``layer`` and ``row`` get a block budget from cumulative rounding
(``floor(c_b * s) - floor(c_{b-1} * s)`` with ``c_b`` the weights up to block b), so the whole
layer prunes exactly what the group means for the whole matrix (``groups.expected_pruned``):
``floor(rows * cols * s)`` for layer, ``floor(cols * s)`` in every row. The reference instead
prunes ``int(block_size * s) + 1`` entries per block (it keeps ``score <= sorted[k]``), plus ties.
``blocksize >= in_features`` turns update-mode ``layer``/``row`` into one selection over the
whole matrix from the original weights (with the Cholesky diagonal).

Options (constructor keywords, reference defaults): ``percdamp=0.01``, ``blocksize=128``,
``dtype="float64"``, and for mask-only mode ``metric_diag="inverse"`` (``[(H+lambda I)^-1]_jj``,
above) or ``"cholesky"`` (``U_jj^2``, the reference code's block-start value applied to the
original weights); for update mode ``solve`` (:func:`obs_prune`), by default ``"block"`` on a CUDA
device and ``"column"`` (the reference's loop) elsewhere; ``batch_gram`` (:class:`InputGram`),
``"exact"`` by default or ``"tensor-cores"`` (bfloat16/float16 activations on CUDA).
"""

from __future__ import annotations

import torch
from torch import nn

from fedlib.groups import GROUPS, parse_nm, prune_lowest, pruned_count, sparsity_for_count
from fedlib.methods.base import LayerPruner

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def damped_hessian(hessian: torch.Tensor, percdamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(H + lambda I, dead)``: a copy of ``hessian`` with dead inputs (``H_jj == 0``) given
    ``H_jj = 1`` and ``lambda = percdamp * mean(diag H)`` (taken after that fix, as the
    reference does) added to the diagonal."""
    if percdamp < 0:
        raise ValueError(f"percdamp must be >= 0, got {percdamp}")
    h = hessian.clone()
    diag = h.diagonal()
    dead = diag == 0
    diag[dead] = 1.0
    diag += percdamp * diag.mean()
    return h, dead


def _cholesky(matrix: torch.Tensor, upper: bool, what: str) -> torch.Tensor:
    factor, info = torch.linalg.cholesky_ex(matrix, upper=upper)
    if int(info) != 0:
        raise RuntimeError(
            f"{what}: the damped Hessian is not positive definite (Cholesky failed at column "
            f"{int(info) - 1}); raise percdamp or use dtype='float64'"
        )
    return factor


def inverse_hessian(hdamped: torch.Tensor, name: str = "") -> torch.Tensor:
    """``(H + lambda I)^-1`` via Cholesky."""
    return torch.cholesky_inverse(_cholesky(hdamped, upper=False, what=name))


def inverse_cholesky_upper(hdamped: torch.Tensor, name: str = "") -> torch.Tensor:
    """``U`` upper triangular with ``U^T U = (H + lambda I)^-1``: row ``j`` of ``U`` divided by
    ``U_jj`` is the OBS update direction for column ``j`` once columns ``< j`` are fixed."""
    hinv = inverse_hessian(hdamped, name)
    return _cholesky(hinv, upper=True, what=name)


def obs_prune(
    weight: torch.Tensor,
    hinv_upper: torch.Tensor,
    *,
    sparsity: float = 0.0,
    group: str = "layer",
    seed: int = 0,
    name: str = "",
    blocksize: int = 128,
    mask: torch.Tensor | None = None,
    solve: str = "column",
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """SparseGPT's sequential OBS pruning of ``weight`` (rows, cols).

    ``hinv_upper`` is :func:`inverse_cholesky_upper` of the damped Hessian (same dtype and device
    as ``weight``). With ``mask`` given (True = pruned) no selection is made: the weights are
    pruned at that mask and compensated (the "fixed mask + weight update" of Wanda's ablation);
    otherwise groups are selected as described in the module docstring.

    Returns ``(new_weight, mask, loss)``: ``new_weight`` has exact zeros where pruned, ``mask``
    is a bool tensor (both on ``weight``'s device), ``loss = 1/2 * sum_i (w_i - q_i)^2 / U_ii^2`` summed over all rows,
    which equals ``1/2 * sum_rows (w - w_new) Hd (w - w_new)^T`` (the layer reconstruction
    error under the damped Hessian ``Hd``).

    ``solve`` says how the errors of a block's columns are computed (:data:`SOLVES`): ``"column"``
    one column after another, the reference's order of roundings; ``"block"`` all columns whose
    mask is already chosen at once (the whole block for ``layer``/``row``/a given mask, each
    group of M for ``N:M``), from one batched triangular solve (:func:`obs_errors`). The two
    agree up to float rounding; ``"block"`` runs a few large kernels where ``"column"`` runs
    thousands of tiny ones.
    """
    if blocksize < 1:
        raise ValueError(f"blocksize must be >= 1, got {blocksize}")
    if solve not in SOLVES:
        raise ValueError(f"solve must be one of {SOLVES}, got {solve!r}")
    W = weight.clone()
    rows, cols = W.shape
    device = W.device
    fixed = mask is not None
    if fixed:
        if tuple(mask.shape) != (rows, cols):
            raise ValueError(f"{name}: mask shape {tuple(mask.shape)} != weight {(rows, cols)}")
        full_mask = mask.to(device=device, dtype=torch.bool)
        n = m = 0
    else:
        full_mask = torch.zeros(rows, cols, dtype=torch.bool, device=device)
        if group in GROUPS:
            n = m = 0
        else:
            n, m = parse_nm(group)
            if cols % m:
                raise ValueError(f"{name}: {cols} input columns are not divisible by M={m}")
            if blocksize % m:
                raise ValueError(f"{name}: blocksize {blocksize} is not a multiple of M={m}")
    loss = torch.zeros((), dtype=W.dtype, device=device)

    # The column loop works on the block transposed (columns as contiguous rows) and with a
    # few in-place operations per column: it is Python-bound at these sizes. Every weight still
    # gets the reference's sequence of roundings (``w -= err * u``, then the column set to q).
    done_cols = 0  # columns before the current block, for the cumulative budgets
    for b, i1 in enumerate(range(0, cols, blocksize)):
        i2 = min(i1 + blocksize, cols)
        count = i2 - i1
        W1 = W[:, i1:i2].clone()
        U1 = hinv_upper[i1:i2, i1:i2]
        d = U1.diagonal()
        M1 = full_mask[:, i1:i2]  # a view: selections write through to full_mask

        if not fixed and group in ("layer", "row"):
            scores = W1.pow(2) / d.pow(2).reshape(1, -1)
            if group == "layer":
                k = pruned_count(rows * i2, sparsity) - pruned_count(rows * done_cols, sparsity)
                s_b = sparsity_for_count(k, rows * count)
            else:
                k = pruned_count(i2, sparsity) - pruned_count(done_cols, sparsity)
                s_b = sparsity_for_count(k, count)
            M1.copy_(prune_lowest(scores, s_b, group, seed, f"{name}#block{b}"))

        if solve == "block":
            # the chunks whose masks are chosen together: a column, a group of M, or the block
            width = 1 if group == "column" and not fixed else (m or count)
            err1 = torch.empty_like(W1)
            for c1 in range(0, count, width):
                c2 = c1 + width
                if not fixed and (group == "column" or m):
                    sub = W1[:, c1:c2].pow(2) / d[c1:c2].pow(2).reshape(1, -1)
                    M1[:, c1:c2] = prune_lowest(sub, sparsity, group, seed, f"{name}#col{i1 + c1}")
                pruned = M1[:, c1:c2]
                err = obs_errors(W1[:, c1:c2], U1[c1:c2, c1:c2], pruned)
                W1[:, c1:c2] -= err @ U1[c1:c2, c1:c2]
                W1[:, c1:c2].masked_fill_(pruned, 0.0)  # exactly q, whatever the rounding left
                W1[:, c2:] -= err @ U1[c1:c2, c2:]
                err1[:, c1:c2] = err
            loss += err1.pow(2).sum() / 2
            W[:, i1:i2] = W1
            W[:, i2:] -= err1 @ hinv_upper[i1:i2, i2:]
            done_cols = i2
            continue

        T = W1.T.contiguous()  # (count, rows): T[i] is column i
        pruned_t = M1.T.contiguous()
        kept_t = ~pruned_t
        err_t = torch.empty_like(T)
        product = torch.empty_like(T)  # the update's buffer, reused by every column
        cols_t, pruned_rows, kept_rows, err_rows = T.unbind(), pruned_t.unbind(), kept_t.unbind(), err_t.unbind()
        d_values = d.unbind()
        u_rows = U1.unsqueeze(-1)  # u_rows[i, j:] is U1[i, j:] as a column, broadcast over rows
        for i in range(count):
            if not fixed and (group == "column" or (m and i % m == 0)):
                width = 1 if group == "column" else m
                sub = T[i : i + width].T.pow(2) / d[i : i + width].pow(2).reshape(1, -1)
                chosen = prune_lowest(sub, sparsity, group, seed, f"{name}#col{i1 + i}")
                pruned_t[i : i + width] = chosen.T
                kept_t[i : i + width] = ~chosen.T
            # err = (w - q) / U_ii with q = w at the pruned entries set to 0: w - q is w there
            # and exactly 0 elsewhere
            w, err = cols_t[i], err_rows[i]
            torch.div(w.masked_fill(kept_rows[i], 0.0), d_values[i], out=err)
            # OBS update of the not-yet-fixed columns of this block, then column i becomes q
            step = torch.mul(u_rows[i, i + 1 :], err, out=product[i + 1 :])
            T[i + 1 :].sub_(step)
            w.masked_fill_(pruned_rows[i], 0.0)
        loss += err_t.pow(2).sum() / 2
        W[:, i1:i2] = T.T
        M1.copy_(pruned_t.T)
        # lazy batch update of all later blocks (the errors in (rows, count) layout, as the
        # reference multiplies them)
        W[:, i2:] -= err_t.T.contiguous() @ hinv_upper[i1:i2, i2:]
        done_cols = i2
    return W, full_mask, float(loss)


#: how :func:`obs_prune` computes a block's errors
SOLVES = ("column", "block")

#: elements of the per-row triangular systems :func:`obs_errors` builds at once (256 MB in float64)
_SOLVE_ELEMENTS = 1 << 25


def obs_errors(w: torch.Tensor, u: torch.Tensor, pruned: torch.Tensor) -> torch.Tensor:
    """The OBS errors ``E`` (rows, k) of ``k`` consecutive columns whose mask ``pruned`` (rows, k)
    is fixed, as the column-by-column update would produce them: with ``u`` the (k, k) upper
    block of ``U``, ``E_i = pruned_i * (w_i - sum_{j<i} E_j u_ji) / u_ii``, i.e. per row
    ``E A = pruned * w`` with ``A`` upper triangular: ``u``'s columns at the pruned entries, its
    diagonal alone at the kept ones (their errors are 0)."""
    rows, k = w.shape
    diag = torch.diag_embed(u.diagonal())
    rhs = w.masked_fill(~pruned, 0.0)
    err = torch.empty_like(w)
    step = max(1, _SOLVE_ELEMENTS // (k * k))
    for r1 in range(0, rows, step):
        p = pruned[r1 : r1 + step].unsqueeze(1)  # (r, 1, k): selects columns of u
        systems = torch.where(p, u, diag)
        err[r1 : r1 + step] = torch.linalg.solve_triangular(
            systems, rhs[r1 : r1 + step].unsqueeze(1), upper=True, left=False
        ).squeeze(1)
    return err


#: how :class:`InputGram` forms a batch's ``x^T x``
BATCH_GRAMS = ("exact", "tensor-cores")


class InputGram:
    """``sum_t x_t x_t^T`` over the calibration tokens of one layer input, and the
    factorisations derived from it (cached: linears that share the input share them).

    ``batch_gram="exact"`` casts each batch to ``dtype`` before its product. ``"tensor-cores"``
    multiplies bfloat16/float16 activations on a CUDA device's tensor cores with float32 output
    (the products are exact there; the sum over a batch's tokens rounds in float32, so the result
    depends on the batch size) and adds that to the ``dtype`` sum: an order of magnitude faster on
    an H100, where float64 and float32 products run at about the same rate
    (``benchmarks/bench_gram.py``)."""

    def __init__(self, dtype: torch.dtype, batch_gram: str = "exact"):
        if batch_gram not in BATCH_GRAMS:
            raise ValueError(f"batch_gram must be one of {BATCH_GRAMS}, got {batch_gram!r}")
        self.dtype = dtype
        self.batch_gram = batch_gram
        self.xxt: torch.Tensor | None = None  # allocated on the inputs' device
        self.n_tokens = 0
        self._cache: dict = {}

    def add(self, inp: torch.Tensor) -> None:
        x = inp.detach().reshape(-1, inp.shape[-1])
        if self.xxt is None:
            self.xxt = torch.zeros(x.shape[1], x.shape[1], dtype=self.dtype, device=x.device)
        x = x.to(self.xxt.device)
        if self.batch_gram == "tensor-cores":
            if x.device.type != "cuda" or x.dtype not in (torch.bfloat16, torch.float16):
                raise ValueError(f"batch_gram='tensor-cores' needs bfloat16 or float16 activations on a CUDA "
                                 f"device, got {x.dtype} on {x.device} (use batch_gram='exact')")
            self.xxt.add_(torch.mm(x.T, x, out_dtype=torch.float32))
        else:
            x = x.to(self.dtype)
            self.xxt.addmm_(x.T, x)
        self.n_tokens += x.shape[0]
        self._cache.clear()

    def cached(self, key, compute):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]


class SparseGPTPruner(LayerPruner):
    """SparseGPT metric, mask only (no weight update): registry name ``sparsegpt``."""

    name = "sparsegpt"
    #: whether :meth:`prune` runs the sequential OBS update and sets ``updated_weight``
    update: bool = False

    def __init__(
        self,
        layer: nn.Linear,
        layer_name: str,
        *,
        percdamp: float = 0.01,
        blocksize: int = 128,
        dtype: str = "float64",
        metric_diag: str = "inverse",
        solve: str | None = None,
        batch_gram: str = "exact",
    ):
        super().__init__(layer, layer_name)
        if solve is not None and solve not in SOLVES:
            raise ValueError(f"solve must be one of {SOLVES} or null, got {solve!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if metric_diag not in ("inverse", "cholesky"):
            raise ValueError(f"metric_diag must be 'inverse' or 'cholesky', got {metric_diag!r}")
        if int(blocksize) < 1:
            raise ValueError(f"blocksize must be >= 1, got {blocksize}")
        if percdamp < 0:
            raise ValueError(f"percdamp must be >= 0, got {percdamp}")
        self.percdamp = float(percdamp)
        self.blocksize = int(blocksize)
        self.dtype = _DTYPES[dtype]
        self.metric_diag = metric_diag
        #: :func:`obs_prune`'s ``solve``; None = "block" on a CUDA device (thousands of tiny
        #: kernels per column loop leave a GPU idle), else "column" (the reference's roundings)
        self.solve = solve
        self.stats = InputGram(self.dtype, batch_gram)
        #: update mode: 1/2 * sum of the OBS errors (reconstruction error under the damped H)
        self.loss: float | None = None

    # -- statistics ---------------------------------------------------------------------------

    def add_batch(self, inp: torch.Tensor) -> None:
        if inp.shape[-1] != self.layer.in_features:
            raise ValueError(
                f"{self.layer_name}: input width {inp.shape[-1]} != "
                f"in_features {self.layer.in_features}"
            )
        self.stats.add(inp)

    def adopt_statistics(self, other: LayerPruner) -> bool:
        """Linears fed the same input (q/k/v, gate/up) share one Gram sum and its
        factorisations: same H, computed once (when their precisions match)."""
        if not isinstance(other, SparseGPTPruner) or (other.dtype, other.stats.batch_gram) != (
                self.dtype, self.stats.batch_gram):
            return False
        self.stats = other.stats
        return True

    def hessian(self) -> torch.Tensor:
        """``H = 2/n * sum_t x_t x_t^T`` (undamped)."""
        if self.stats.n_tokens == 0:
            raise RuntimeError(f"{self.layer_name}: SparseGPT needs calibration inputs, saw none")
        return self.stats.xxt * (2.0 / self.stats.n_tokens)

    def _upper_factor(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U, dead)`` of the damped Hessian (:func:`inverse_cholesky_upper`)."""

        def compute():
            hd, dead = damped_hessian(self.hessian(), self.percdamp)
            return inverse_cholesky_upper(hd, self.layer_name), dead

        return self.stats.cached(("upper", self.percdamp), compute)

    def _metric_diagonal(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(diag, dead)``: the mask-only metric's denominator per input column."""
        if self.metric_diag == "cholesky":
            upper, dead = self._upper_factor()
            return upper.diagonal().pow(2), dead

        def compute():
            hd, dead = damped_hessian(self.hessian(), self.percdamp)
            return inverse_hessian(hd, self.layer_name).diagonal().clone(), dead

        return self.stats.cached(("inverse-diagonal", self.percdamp), compute)

    def _solve_on(self, device: torch.device) -> str:
        return self.solve or ("block" if device.type == "cuda" else "column")

    def _weight(self, dead: torch.Tensor) -> torch.Tensor:
        """The layer's weights in this pruner's precision, on the statistics' device, with the
        columns of dead inputs set to 0."""
        W = self.layer.weight.detach().to(device=dead.device, dtype=self.dtype).clone()
        W[:, dead] = 0.0
        return W

    # -- mask-only metric ---------------------------------------------------------------------

    def scores(self) -> torch.Tensor:
        """The non-sequential metric ``W^2 / [(H + lambda I)^-1]_jj`` (or ``/ U_jj^2`` with
        ``metric_diag="cholesky"``) from the original weights; dead inputs score 0. Float32, on
        the statistics' device, (out_features, in_features)."""
        diag, dead = self._metric_diagonal()
        W = self._weight(dead)
        return (W.pow(2) / diag.reshape(1, -1)).to(torch.float32)

    # -- pruning ------------------------------------------------------------------------------

    def prune(self, sparsity: float, group: str, seed: int) -> torch.Tensor:
        if not self.update:
            return prune_lowest(self.scores(), sparsity, group, seed, self.layer_name)
        hinv_upper, dead = self._upper_factor()
        new_w, mask, loss = obs_prune(
            self._weight(dead),
            hinv_upper,
            sparsity=sparsity,
            group=group,
            seed=seed,
            name=self.layer_name,
            blocksize=self.blocksize,
            solve=self._solve_on(hinv_upper.device),
        )
        self.updated_weight = new_w.to(torch.float32)
        self.loss = loss
        return mask

    def update_for_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """SparseGPT's OBS update for a given mask (True = pruned), without selecting one:
        returns the compensated weights (float32, CPU; zeros where pruned) and sets
        :attr:`loss`. Neither ``self.layer.weight`` nor ``updated_weight`` is changed."""
        hinv_upper, dead = self._upper_factor()
        new_w, _, loss = obs_prune(
            self._weight(dead), hinv_upper, name=self.layer_name, blocksize=self.blocksize, mask=mask,
            solve=self._solve_on(hinv_upper.device),
        )
        self.loss = loss
        return new_w.to(device="cpu", dtype=torch.float32)


class SparseGPTUpdatePruner(SparseGPTPruner):
    """Full SparseGPT with the sequential OBS update: registry name ``sparsegpt_update``."""

    name = "sparsegpt_update"
    update = True
