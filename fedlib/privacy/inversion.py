"""Inverting a client's block-0 Wanda mask back to its calibration tokens.

Threat model: an honest-but-curious server that knows the public model, the pruning
method (Wanda), the sparsity, the comparison group, the tie-break seed and the number of
calibration tokens T, and receives one client's mask. It searches for tokens whose Wanda
mask matches the shared one (the FedPrLLM paper's "gradient inversion", App. C).

What the block-0 q/k/v masks can reveal
---------------------------------------
The input of ``q_proj``/``k_proj``/``v_proj`` of decoder block 0 is
``input_layernorm(embed_tokens(tokens))``: no position enters before these projections
(LLaMA-family models apply RoPE after them). The RMSNorm acts on each token separately,
so with u_v = input_layernorm(E_v)^2 per vocabulary entry v, the Wanda statistic is

    mean_sq = (1/T) sum_t u_{token_t} = sum_v (count_v / T) u_v,

a function of the token *histogram* only. Any permutation of the calibration text gives
the same mask: exact-position recovery from these masks is impossible, and recovering the
bag of tokens is the ceiling. ``position_match`` is therefore reported only for
completeness (chance level for T > 1); ``bag_overlap`` is the meaningful rate. On top of
that, the mask keeps only the row-wise *order* of |W_ij| sqrt(mean_sq_j), so mean_sq is
known only up to scale and up to the polytope of orderings; with a large vocabulary
(V >> hidden size) many bags can share a mask.

The attack
----------
1. Soft tokens, two relaxations:

   * ``"histogram"`` (default): one distribution π = softmax(logits) over the vocabulary
     stands for the token histogram count/T, and mean_sq = π @ U with
     U_v = input_layernorm(E_v)^2, the exact statistic of a hard bag and linear in π.
     The bag is decoded by rounding T·π (floor, then largest remainders).
   * ``"embedding"`` (the paper-style continuous-input attack): per-position logits
     (T, V), embedding_t = softmax(logits_t) @ E, then the model's ``input_layernorm``,
     mean_sq = mean_t h_t^2; decoded by argmax per position. Mixing *embeddings* lets
     signs cancel before the square, so the landscape has poor local optima; measured
     here it recovers far fewer tokens than ``"histogram"`` (kept for comparison).

2. Differentiable Wanda mask: log-score s_ij = log|W_ij| + 1/2 log mean_sq_j, group
   threshold θ at the target sparsity (midpoint of the k-th and (k+1)-th smallest score of
   each row / column / layer), relaxed mask sigmoid((θ - s)/τ) with τ annealed
   geometrically (in log-score units: around the threshold of a SmolLM2 q_proj row,
   neighbouring scores differ by ~0.006, so τ has to end near that scale; starting at
   τ = 1 instead of 0.2 left the optimiser in poor optima); loss = BCE against the target mask(s), summed over
   the given layers. Adam on the logits, seeded restarts; the restart whose decoding has
   the best *hard* mask agreement wins.
3. Discrete refinement (skipped once the agreement is perfect), on the hard bag; the attacker
   can evaluate hard agreement exactly because it has the model. Two searches:

   * ``refine_sweeps`` (short texts): for each position try the ``n_candidates`` tokens of
     highest soft probability and keep the swap that most increases the agreement; a few
     sweeps. It costs T x n_candidates mask evaluations per sweep.
   * ``refine_moves`` (a client's whole calibration set, T ~ 1,000): positions are
     exchangeable, so one move takes one count from a token of the bag and gives it to one
     of the ``n_candidates`` tokens. The relaxed loss's gradient with respect to the counts
     ranks the moves (the bag tokens it most wants fewer of, the candidates it most wants
     more of); the best few pairs are evaluated exactly and the best is kept if it raises
     the agreement. Its cost does not grow with T.

Reported: mask agreement (1 - Hamming) of the decoded tokens' mask with the target, of the
gradient stage alone, and of random tokens (a baseline: masks are mostly determined by
the public weights, so even random text agrees on most bits); token recovery by exact
position and as a bag (multiset overlap / T); decoded text.

Only layers fed by ``input_layernorm`` of block 0 (q/k/v projections) are supported:
later block-0 layers see attention outputs, which do depend on positions.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fedlib.groups import GROUPS, pruned_count, prune_lowest
from fedlib.methods.wanda import wanda_scores

#: block-0 linears whose input is input_layernorm(embed_tokens(tokens))
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")


def _decoder(model):
    inner = getattr(model, "model", model)
    if not hasattr(inner, "layers") or not hasattr(inner, "embed_tokens"):
        raise TypeError("expected a HF decoder-only model with .model.layers and .model.embed_tokens")
    return inner


def layer_name(short: str, block: int = 0) -> str:
    """Full module name of a block linear, e.g. ``model.layers.0.self_attn.q_proj``."""
    return f"model.layers.{block}.{short}"


def _short_name(name: str) -> str:
    for s in QKV:
        if name == s or name.endswith("." + s):
            if name not in (s, layer_name(s)):
                raise ValueError(f"{name}: only block-0 q/k/v projections are supported")
            return s
    raise ValueError(f"{name}: only block-0 q/k/v projections ({', '.join(QKV)}) are supported")


def _linear(model, short: str) -> torch.nn.Linear:
    mod = _decoder(model).layers[0]
    for part in short.split("."):
        mod = getattr(mod, part)
    return mod


def _embedding_matrix(model) -> torch.Tensor:
    emb = _decoder(model).embed_tokens
    E = emb.weight.detach().float()
    scale = getattr(emb, "embed_scale", None)  # Gemma-style scaled embeddings
    if scale is not None:
        E = E * float(scale)
    return E


@torch.no_grad()
def token_sq_activations(model, chunk: int = 8192) -> torch.Tensor:
    """U (V, d): input_layernorm(embedding_v)^2 for every vocabulary entry v, so that the
    block-0 q/k/v Wanda statistic of tokens t_1..t_T is U[t].mean(0)."""
    E = _embedding_matrix(model)
    norm = _decoder(model).layers[0].input_layernorm
    return torch.cat([norm(E[i : i + chunk]).float().pow(2) for i in range(0, E.shape[0], chunk)])


def block0_mean_sq(model, token_ids: Sequence[int]) -> torch.Tensor:
    """Per-input-feature mean square of the block-0 q/k/v input over the tokens (float64
    accumulation, as :class:`fedlib.methods.wanda.WandaPruner`), via the model's modules."""
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    with torch.no_grad():
        emb = _decoder(model).embed_tokens(ids)
        h = _decoder(model).layers[0].input_layernorm(emb).to(torch.float64)
    return (h * h).mean(dim=0).to(torch.float32)


def wanda_block0_masks(
    model,
    token_ids: Sequence[int],
    layers: Sequence[str] = ("self_attn.q_proj",),
    sparsity: float = 0.5,
    group: str = "row",
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """The Wanda masks (True = pruned) a client with calibration tokens ``token_ids`` would
    share for block-0 q/k/v layers: {full layer name: mask}."""
    m = block0_mean_sq(model, token_ids)
    out = {}
    for name in layers:
        short = _short_name(name)
        w = _linear(model, short).weight.detach().float()
        full = layer_name(short)
        out[full] = prune_lowest(wanda_scores(w, m), sparsity, group, seed, full)
    return out


# ----------------------------------------------------------------------- relaxed mask


def _check_group(group: str) -> None:
    if group not in GROUPS:
        raise ValueError(f"inversion supports groups {GROUPS} (not N:M), got {group!r}")


def _soft_logits(log_scores: torch.Tensor, sparsity: float, group: str, tau: float):
    """(θ - s)/τ: logits of the relaxed 'pruned' indicator for a (rows, cols) or
    batched (B, rows, cols) log-score tensor."""
    rows, cols = log_scores.shape[-2:]
    if group == "row":
        k = pruned_count(cols, sparsity)
        srt = log_scores.sort(dim=-1).values
        thr = _mid(srt, k, cols).unsqueeze(-1)
    elif group == "column":
        k = pruned_count(rows, sparsity)
        srt = log_scores.sort(dim=-2).values
        thr = _mid(srt.transpose(-1, -2), k, rows).unsqueeze(-2)
    else:
        k = pruned_count(rows * cols, sparsity)
        flat = log_scores.reshape(*log_scores.shape[:-2], rows * cols)
        thr = _mid(flat.sort(dim=-1).values, k, rows * cols).unsqueeze(-1).unsqueeze(-1)
    return (thr - log_scores) / tau


def _mid(srt: torch.Tensor, k: int, n: int) -> torch.Tensor:
    if k == 0:
        return srt[..., 0] - 1.0
    if k >= n:
        return srt[..., -1] + 1.0
    return 0.5 * (srt[..., k - 1] + srt[..., k])


def _hard_masks(log_scores: torch.Tensor, sparsity: float, group: str) -> torch.Tensor:
    """Pruned indicator: score <= the k-th smallest of its group (ties ignored: the final
    evaluation uses :func:`fedlib.groups.prune_lowest`). kthvalue, not a full sort: this
    is the refinement's inner loop."""
    rows, cols = log_scores.shape[-2:]
    if group == "row":
        k = pruned_count(cols, sparsity)
        if k == 0:
            return torch.zeros_like(log_scores, dtype=torch.bool)
        return log_scores <= log_scores.kthvalue(k, dim=-1, keepdim=True).values
    if group == "column":
        k = pruned_count(rows, sparsity)
        if k == 0:
            return torch.zeros_like(log_scores, dtype=torch.bool)
        return log_scores <= log_scores.kthvalue(k, dim=-2, keepdim=True).values
    k = pruned_count(rows * cols, sparsity)
    if k == 0:
        return torch.zeros_like(log_scores, dtype=torch.bool)
    flat = log_scores.reshape(*log_scores.shape[:-2], rows * cols)
    kth = flat.kthvalue(k, dim=-1).values
    return log_scores <= kth.unsqueeze(-1).unsqueeze(-1)


# ----------------------------------------------------------------------- result


@dataclass
class InversionResult:
    tokens: list[int]
    mask_agreement: float  # 1 - Hamming over all target layers, decoded tokens
    mask_agreement_layers: dict[str, float]
    gradient_agreement: float  # before the discrete refinement
    gradient_tokens: list[int]  # the bag the gradient stage decoded (before the refinement)
    baseline_agreement: float  # random tokens of the same length
    seconds: float  # wall time, for the log: summary() (what results hold) has no timings
    text: str | None = None
    target_tokens: list[int] | None = None
    target_text: str | None = None
    position_match: float | None = None  # fraction of positions decoded exactly
    bag_overlap: float | None = None  # multiset overlap / T
    true_tokens_agreement: float | None = None  # the real tokens (1.0 unless ties)
    history: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        keys = (
            "mask_agreement", "gradient_agreement", "baseline_agreement",
            "true_tokens_agreement", "position_match", "bag_overlap",
        )
        return {k: getattr(self, k) for k in keys}


def bag_overlap(decoded: Sequence[int], target: Sequence[int]) -> float:
    """Multiset intersection size / len(target): token recovery ignoring order."""
    inter = Counter(decoded) & Counter(target)
    return sum(inter.values()) / len(target)


def position_match(decoded: Sequence[int], target: Sequence[int]) -> float:
    """Fraction of positions where the decoded token equals the target token."""
    return sum(int(a == b) for a, b in zip(decoded, target)) / len(target)


# ----------------------------------------------------------------------- attack


class _Problem:
    """Precomputed pieces shared by the gradient stage and the refinement."""

    def __init__(self, model, target_masks, sparsity, group):
        self.sparsity, self.group = sparsity, group
        _check_group(group)
        self.names, self.logw, self.targets = [], [], []
        for name, mask in target_masks.items():
            short = _short_name(name)
            w = _linear(model, short).weight.detach().float()
            if tuple(mask.shape) != tuple(w.shape):
                raise ValueError(f"{name}: mask {tuple(mask.shape)} vs weight {tuple(w.shape)}")
            self.names.append(layer_name(short))
            self.logw.append(torch.log(w.abs().clamp_min(1e-30)))
            self.targets.append(mask.to(torch.bool))
        self.n_bits = sum(t.numel() for t in self.targets)

    def loss(self, mean_sq: torch.Tensor, tau: float) -> torch.Tensor:
        half_log_m = 0.5 * torch.log(mean_sq.clamp_min(1e-30))
        total = 0.0
        for logw, target in zip(self.logw, self.targets):
            z = _soft_logits(logw + half_log_m, self.sparsity, self.group, tau)
            total = total + F.binary_cross_entropy_with_logits(
                z, target.float(), reduction="sum"
            )
        return total / self.n_bits

    @torch.no_grad()
    def agreement_batch(self, mean_sq: torch.Tensor) -> torch.Tensor:
        """Matching bits (summed over layers) for a batch of statistics (B, d)."""
        half_log_m = 0.5 * torch.log(mean_sq.clamp_min(1e-30)).unsqueeze(1)
        out = torch.zeros(mean_sq.shape[0], dtype=torch.long)
        for logw, target in zip(self.logw, self.targets):
            hard = _hard_masks(logw.unsqueeze(0) + half_log_m, self.sparsity, self.group)
            out += (hard == target).flatten(1).sum(1)
        return out


def _agreement_exact(model, tokens, names, targets, sparsity, group, seed) -> dict[str, float]:
    masks = wanda_block0_masks(model, tokens, names, sparsity, group, seed)
    return {n: 1.0 - float((masks[n] ^ t).float().mean()) for n, t in zip(names, targets)}


def _total(per_layer: Mapping[str, float], targets) -> float:
    sizes = [t.numel() for t in targets]
    return sum(v * s for v, s in zip(per_layer.values(), sizes)) / sum(sizes)


def refine_bag(
    prob: _Problem,
    U: torch.Tensor,
    counts: torch.Tensor,
    candidates: torch.Tensor,
    moves: int,
    tau: float,
    history: list | None = None,
    removals: int = 8,
    additions: int = 16,
    batch: int = 32,
) -> tuple[torch.Tensor, int]:
    """Greedy moves of one count between tokens of a bag (``counts``, (V,)), at most ``moves``:
    each step evaluates exactly the ``removals`` x ``additions`` moves the relaxed loss's
    gradient (at temperature ``tau``) ranks best (from the bag's tokens to ``candidates``)
    and keeps the best if it raises the hard agreement; stops when none does. Returns
    (counts, matching bits)."""
    counts = counts.clone()
    n_tokens = int(counts.sum())
    total = counts.double() @ U.double()  # (d,): the bag's sum of u_v, kept exact in float64
    current = int(prob.agreement_batch((total / n_tokens).float().unsqueeze(0))[0])
    for move in range(moves):
        if current == prob.n_bits:
            break
        c = counts.float().requires_grad_(True)
        (grad,) = torch.autograd.grad(prob.loss((c @ U) / n_tokens, tau), c)
        present = counts.nonzero().squeeze(1)
        take = present[grad[present].topk(min(removals, present.numel())).indices]
        give = candidates[grad[candidates].topk(min(additions, candidates.numel()), largest=False).indices]
        src, dst = (x.reshape(-1) for x in torch.meshgrid(take, give, indexing="ij"))
        keep = src != dst
        src, dst = src[keep], dst[keep]
        if src.numel() == 0:
            break
        stats = (total.unsqueeze(0) + U[dst].double() - U[src].double()) / n_tokens
        scores = torch.cat([prob.agreement_batch(stats[i : i + batch].float()) for i in range(0, len(stats), batch)])
        j = int(scores.argmax())
        if int(scores[j]) <= current:
            break
        a, b = int(src[j]), int(dst[j])
        counts[a] -= 1
        counts[b] += 1
        total += U[b].double() - U[a].double()
        current = int(scores[j])
        if history is not None:
            history.append({"refine_move": move, "agreement": current / prob.n_bits})
    return counts, current


RELAXATIONS = ("embedding", "histogram")


def _round_histogram(probs: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """A bag of ``n_tokens`` tokens from a distribution: floor(T·p) copies of each token,
    the remaining slots to the largest remainders (tokens sorted by id)."""
    target = probs.double() * n_tokens
    counts = torch.floor(target).long()
    rest = n_tokens - int(counts.sum())
    if rest > 0:
        counts[torch.topk(target - counts, rest).indices] += 1
    return torch.repeat_interleave(torch.arange(probs.numel()), counts)


def invert_block0_masks(
    model,
    target_masks: Mapping[str, torch.Tensor],
    n_tokens: int,
    sparsity: float = 0.5,
    group: str = "row",
    seed: int = 0,
    steps: int = 800,
    restarts: int = 1,
    lr: float = 0.03,
    tau: tuple[float, float] = (0.2, 0.01),
    relaxation: str = "histogram",
    init_scale: float = 1.0,
    init_logits: torch.Tensor | None = None,
    entropy_weight: float = 0.0,
    refine_sweeps: int = 2,
    refine_moves: int = 0,
    n_candidates: int = 64,
    candidate_batch: int = 32,
    target_tokens: Sequence[int] | None = None,
    tokenizer=None,
    time_limit: float | None = None,
    log_every: int = 0,
) -> InversionResult:
    """Reconstruct ``n_tokens`` calibration tokens from block-0 q/k/v Wanda masks
    ({layer name: bool mask, True = pruned}, e.g. from :func:`wanda_block0_masks`).

    ``n_tokens`` (T) is assumed known to the attacker (the mask itself only determines
    the token *proportions*). ``seed`` is the client's tie-break seed (used for the exact
    final agreement) and seeds the attack's initialisation (logits ~ N(0, init_scale)).
    ``init_logits`` (shape (V,) for ``"histogram"``, (V,) or (T, V) for ``"embedding"``) is
    added to the initial logits, e.g. the log of a public unigram distribution (a prior
    any server has). ``tau`` = (start, end) temperature in log-score units. ``relaxation`` is
    ``"histogram"`` or ``"embedding"`` (see the module docstring).
    ``refine_sweeps`` / ``refine_moves``: the two discrete refinements (module docstring),
    one after the other. ``entropy_weight`` > 0 adds a penalty on the soft tokens' entropy, ramped up linearly,
    pushing them towards one-hot. ``time_limit`` (seconds) stops the gradient stage early.
    ``target_tokens`` / ``tokenizer`` are only used for reporting.
    """
    if relaxation not in RELAXATIONS:
        raise ValueError(f"relaxation must be one of {RELAXATIONS}, got {relaxation!r}")
    start = time.perf_counter()
    prob = _Problem(model, target_masks, sparsity, group)
    U = token_sq_activations(model)  # exact statistic of hard tokens, used by refinement
    V = U.shape[0]
    E = _embedding_matrix(model) if relaxation == "embedding" else None
    norm = _decoder(model).layers[0].input_layernorm
    for p in norm.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)

    def soft_mean_sq(logits):
        probs = torch.softmax(logits, dim=-1)
        if relaxation == "histogram":
            return probs @ U
        h = norm(probs @ E).float()
        return (h * h).mean(0)

    def decode(logits):
        if relaxation == "histogram":
            return _round_histogram(torch.softmax(logits, -1), n_tokens)
        return logits.argmax(-1)

    def hard_agreement(tok):
        return int(prob.agreement_batch(U[tok].mean(0, keepdim=True))[0])

    history = []
    best_tokens, best_agree, best_probs = None, -1, None
    shape = (V,) if relaxation == "histogram" else (n_tokens, V)
    for r in range(restarts):
        logits = init_scale * torch.randn(shape, generator=gen)
        if init_logits is not None:
            logits = logits + init_logits.float().expand(shape)
        logits.requires_grad_(True)
        opt = torch.optim.Adam([logits], lr=lr)
        for step in range(steps):
            frac = step / max(steps - 1, 1)
            t = tau[0] * (tau[1] / tau[0]) ** frac
            loss = prob.loss(soft_mean_sq(logits), t)
            if entropy_weight > 0:
                p = torch.softmax(logits, -1)
                ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()
                loss = loss + entropy_weight * frac * ent
            opt.zero_grad()
            loss.backward()
            opt.step()
            if log_every and step % log_every == 0:
                with torch.no_grad():
                    agree = hard_agreement(decode(logits))
                history.append(
                    {"restart": r, "step": step, "tau": t, "loss": loss.item(),
                     "agreement": agree / prob.n_bits}
                )
            if time_limit is not None and time.perf_counter() - start > time_limit:
                break
        with torch.no_grad():
            tok = decode(logits)
            agree = hard_agreement(tok)
            probs = torch.softmax(logits, -1).reshape(-1, V).mean(0)
        history.append({"restart": r, "final": True, "agreement": agree / prob.n_bits})
        if agree > best_agree:
            best_agree, best_tokens, best_probs = agree, tok.clone(), probs
        if time_limit is not None and time.perf_counter() - start > time_limit:
            break
    gradient_agreement = best_agree / prob.n_bits

    # discrete refinement: coordinate search; positions are exchangeable, so every position
    # draws from one shared candidate list (the tokens with the highest soft probability)
    tokens = best_tokens.clone()
    current = best_agree
    n_cand = min(n_candidates, V)
    cand = best_probs.topk(n_cand).indices
    for sweep in range(refine_sweeps):
        if current == prob.n_bits:
            break
        improved = False
        for pos in range(n_tokens):
            base = U[tokens].sum(0)
            scores = []
            for i in range(0, n_cand, candidate_batch):
                c = cand[i : i + candidate_batch]
                m = (base.unsqueeze(0) - U[tokens[pos]] + U[c]) / n_tokens
                scores.append(prob.agreement_batch(m))
            scores = torch.cat(scores)
            j = int(scores.argmax())
            if int(scores[j]) > current:
                current, tokens[pos], improved = int(scores[j]), cand[j], True
        history.append({"refine_sweep": sweep, "agreement": current / prob.n_bits})
        if not improved:
            break
    if refine_moves:
        counts = torch.bincount(tokens, minlength=V)
        counts, _ = refine_bag(prob, U, counts, cand, refine_moves, tau[1], history)
        tokens = torch.repeat_interleave(torch.arange(V), counts)

    tokens_list = [int(t) for t in tokens]
    per_layer = _agreement_exact(
        model, tokens_list, prob.names, prob.targets, sparsity, group, seed
    )
    rand = torch.randint(0, V, (n_tokens,), generator=gen).tolist()
    baseline = _total(
        _agreement_exact(model, rand, prob.names, prob.targets, sparsity, group, seed),
        prob.targets,
    )
    result = InversionResult(
        tokens=tokens_list,
        mask_agreement=_total(per_layer, prob.targets),
        mask_agreement_layers=per_layer,
        gradient_agreement=gradient_agreement,
        gradient_tokens=[int(t) for t in best_tokens],
        baseline_agreement=baseline,
        seconds=0.0,
        history=history,
    )
    if target_tokens is not None:
        target_tokens = [int(t) for t in target_tokens]
        result.target_tokens = target_tokens
        result.position_match = position_match(tokens_list, target_tokens)
        result.bag_overlap = bag_overlap(tokens_list, target_tokens)
        result.true_tokens_agreement = _total(
            _agreement_exact(model, target_tokens, prob.names, prob.targets, sparsity, group, seed),
            prob.targets,
        )
    if tokenizer is not None:
        result.text = tokenizer.decode(tokens_list)
        if target_tokens is not None:
            result.target_text = tokenizer.decode(target_tokens)
    result.seconds = time.perf_counter() - start
    return result
