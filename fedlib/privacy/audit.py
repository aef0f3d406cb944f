"""The privacy audit as workflow stages: what do shared masks reveal about private data?

Each analysis here runs the :mod:`fedlib.privacy` library on real masks and writes one JSON
result (``fedlib privacy <analysis> ... --out X.json``); :mod:`fedlib.privacy.audit_report`
turns the JSON files into report tables and plots (``fedlib privacy report``). Analyses:

``entropy``
    Bits per entry of a client's mask (zero-order entropy of its density) against the
    empirical entropy of the float16 bit patterns of the same weights, per layer, per layer
    type and over the whole model (FedPrLLM App. C: 1.0 vs 13.75 bits for LLaMA-7B's block-0
    ``q_proj``), plus the per-entry entropy *across* the clients' masks (the data-dependent
    part of a mask).
``similarity``
    Hamming distance between masks computed on disjoint random calibration sets: every pair
    of the workflow's client masks (each client's shard is a disjoint random part of the
    pool), and optionally masks from independently seeded calibration draws (paper: 4.96 %).
``sensitivity``
    Masks from two data sets that differ in exactly one sample (a client's shard with one
    sample replaced by another client's sample): the Hamming distribution. This is a
    distance between outputs of a deterministic algorithm, not a privacy loss.
``membership``
    A real membership-inference attack: LiRA (Carlini et al. 2022) on the agreement of the
    observed mask with the direction in which the target sample moves the mask, estimated
    from shadow masks the attacker computes itself (it has the public model). Scored by ROC
    AUC, TPR at low FPR and the empirical ε lower bound, also under randomized response.
``inversion``
    The honest-but-curious server reconstructs calibration tokens from the client's
    block-0 ``q_proj`` mask (:func:`fedlib.privacy.inversion.invert_block0_masks`), on the
    real model and on a tiny model where recovery is exact.
``rr-aggregate``
    The defence: randomized response on every mask bit (client side, ε per bit), the
    FedPrLLM server's top-k on the noisy vote counts; writes the global mask file whose
    perplexity the workflow measures with ``fedlib evaluate``.

Shadow and neighbour masks are computed in-process on one loaded model; for the attack they
can be restricted to the first decoder blocks (:func:`client_masks`), since the masks of
blocks 0..b-1 only need the forward pass through those blocks. Every result JSON says
exactly what was computed and observed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

#: the paper's figures (FedPrLLM App. C, LLaMA-7B, Wanda, 50 %), quoted in the tables
PAPER = {
    "mask_bits": 1.0,
    "fp16_bits": 13.75,
    "similarity_hamming": 0.0496,
    "sensitivity_hamming": 0.0496,
    "claimed_epsilon": 0.05,
    "mia_target_hamming": 0.0323,
    "inversion_tokens": 0.02,
}

_LOG: Callable[[str], None] = print


def _log(message: str) -> None:
    _LOG(message)


# --------------------------------------------------------------------------- masks


def layer_type(name: str) -> str:
    """``model.layers.3.self_attn.q_proj`` -> ``q_proj``."""
    return name.rsplit(".", 1)[-1]


def client_masks(
    model,
    input_ids: torch.Tensor,
    method: str = "wanda",
    sparsity: float = 0.5,
    group: str = "row",
    seed: int = 0,
    blocks: int | None = None,
    batch_size: int = 8,
    method_options: Mapping | None = None,
    placement=None,
) -> dict[str, torch.Tensor]:
    """The masks a client with calibration ``input_ids`` computes
    (:func:`fedlib.runner.prune_locally`), restricted to decoder blocks ``0..blocks-1``
    (``None`` = all). The forward pass stops after the last requested block, so the masks
    of the first blocks cost only the forward through those blocks."""
    from fedlib.runner import CPU, prune_locally

    if blocks is not None and blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    return prune_locally(model, input_ids, method, sparsity, group, seed, batch_size, method_options,
                         placement=placement or CPU, blocks=blocks).masks


def _block_of(name: str) -> int:
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return -1


def flat_mask(masks: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """One flat bool vector of the masks in the given layer order."""
    return torch.cat([masks[n].reshape(-1).to(torch.bool) for n in names])


def _packed_np(mask: torch.Tensor) -> np.ndarray:
    return np.packbits(mask.detach().cpu().reshape(-1).numpy().astype(bool), bitorder="little")


def _popcount(a: np.ndarray) -> int:
    return int(np.bitwise_count(a).sum())


@contextlib.contextmanager
def open_mask_files(paths: Sequence[Path], fingerprint: str, layers):
    """Header-checked mask files (against the model's fingerprint and layers) and a reader
    of each layer's packed bits: ``packed(i, name) -> uint8 array`` (padding bits are 0,
    as the format requires, so XOR + popcount over packed arrays counts exact differences)."""
    from safetensors import safe_open

    from fedlib.maskfile import MaskFile, MaskFileError

    files = [MaskFile(Path(p), fingerprint, layers) for p in paths]
    sizes = {info.name: math.prod(info.shape) for info in layers}
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f.path), framework="np")) for f in files]

        def packed(i: int, name: str) -> np.ndarray:
            arr = handles[i].get_tensor(f"mask:{name}")
            if arr.dtype != np.uint8 or arr.shape != ((sizes[name] + 7) // 8,):
                raise MaskFileError(files[i].path, f"mask:{name}", f"unexpected packed shape {arr.shape}")
            return arr

        yield files, packed


# --------------------------------------------------------------------------- entropy


def entropy_audit(model, mask_paths: Sequence[Path]) -> dict:
    """Per-layer entropies: the first client's mask (bits/entry from its density), the
    float16 bit patterns of the weights, and the per-entry entropy across all given client
    masks (mean over entries of H(fraction of clients pruning it); 0 = every client shares
    the same bit). Also the model-wide figures and the pooled fp16 histogram entropy."""
    from fedlib.models import ModelHandle
    from fedlib.privacy.entropy import histogram_entropy_bits

    handle = ModelHandle.of(model)
    layers = handle.layers()
    fp = handle.fingerprint()
    block_weights: dict = {}  # the current block's tensors, read once (a lazy model reads from disk)
    pooled = torch.zeros(65536, dtype=torch.int64)
    rows = []
    with open_mask_files(mask_paths, fp, layers) as (files, packed):
        m = len(files)
        h_of_count = np.array([_h2(c / m) for c in range(m + 1)])
        for info in layers:
            numel = math.prod(info.shape)
            first = packed(0, info.name)
            p = _popcount(first) / numel
            if block_weights.get("index") != info.block:
                block_weights = {"index": info.block, "tensors": handle.block_tensors(info.block)}
            weight = block_weights["tensors"][f"{info.name.removeprefix(f'{handle.prefix}.{info.block}.')}.weight"]
            bits = weight.to("cpu", torch.float16).contiguous().view(torch.int16).to(torch.int32).flatten() & 0xFFFF
            hist = torch.bincount(bits, minlength=65536)
            pooled += hist
            ensemble = None
            if m >= 2:
                counts = np.zeros(numel, dtype=np.uint16)
                for i in range(m):
                    counts += np.unpackbits(packed(i, info.name), count=numel, bitorder="little")
                ensemble = float((np.bincount(counts, minlength=m + 1) * h_of_count).sum() / numel)
            rows.append({
                "name": info.name, "type": layer_type(info.name), "block": info.block, "numel": numel,
                "mask_density": p, "mask_bits": _h2(p), "fp16_bits": histogram_entropy_bits(hist),
                "fp16_distinct": int((hist > 0).sum()), "ensemble_bits": ensemble,
            })
        packed_bytes = sum(Path(f.path).stat().st_size for f in files[:1])
        client_ids = [f.header.client_id for f in files]
        header = files[0].header
    total = sum(r["numel"] for r in rows)
    return {
        "analysis": "entropy",
        "model_fingerprint": fp,
        "mask_files": [str(p) for p in mask_paths],
        "client_ids": client_ids,
        "n_clients": len(client_ids),
        "method": header.method, "group": header.group, "sparsity": header.sparsity,
        "n_samples": header.n_samples,
        "layers": rows,
        "total_entries": total,
        "fp16_pooled_bits": histogram_entropy_bits(pooled),
        "fp16_pooled_distinct": int((pooled > 0).sum()),
        "file_bits_per_entry": 8 * packed_bytes / total,
    }


def _h2(p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


# --------------------------------------------------------------------------- similarity


def _pairwise(packed_sets: Sequence[Callable[[str], np.ndarray]], names: Sequence[str]) -> list[dict]:
    """Differing bits per layer type for every pair of mask sets (each a name -> packed reader)."""
    n = len(packed_sets)
    pairs = [{"i": i, "j": j, "diff": {}} for i in range(n) for j in range(i + 1, n)]
    for name in names:
        arrays = [get(name) for get in packed_sets]
        t = layer_type(name)
        for pair in pairs:
            d = _popcount(np.bitwise_xor(arrays[pair["i"]], arrays[pair["j"]]))
            pair["diff"][t] = pair["diff"].get(t, 0) + d
    return pairs


def _type_sizes(layers) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for info in layers:
        sizes[layer_type(info.name)] = sizes.get(layer_type(info.name), 0) + math.prod(info.shape)
    return sizes


def similarity_audit(
    model,
    mask_paths: Sequence[Path],
    seed_windows: Sequence[torch.Tensor] = (),
    seed_values: Sequence[int] = (),
    method: str = "wanda",
    sparsity: float = 0.5,
    group: str = "row",
    seed: int = 0,
    batch_size: int = 8,
    placement=None,
) -> dict:
    """Hamming distances between every pair of the given client mask files, and (optional)
    between whole-model masks computed here from independently seeded calibration draws
    ``seed_windows`` (one token tensor per seed)."""
    from fedlib.models import fingerprint, prunable_layers

    layers = prunable_layers(model)
    fp = fingerprint(model)
    names = [info.name for info in layers]
    sizes = _type_sizes(layers)
    out = {"analysis": "similarity", "model_fingerprint": fp, "type_sizes": sizes,
           "total_entries": sum(sizes.values())}
    if mask_paths:
        with open_mask_files(mask_paths, fp, layers) as (files, packed):
            readers = [lambda name, i=i: packed(i, name) for i in range(len(files))]
            pairs = _pairwise(readers, names)
            h = files[0].header
            out["clients"] = {
                "client_ids": [f.header.client_id for f in files],
                "n_samples": [f.header.n_samples for f in files],
                "method": h.method, "group": h.group, "sparsity": h.sparsity,
                "pairs": pairs,
            }
    if seed_windows:
        t0 = time.perf_counter()
        sets = []
        for value, ids in zip(seed_values, seed_windows):
            masks = client_masks(model, ids, method, sparsity, group, seed, None, batch_size, placement=placement)
            sets.append({n: _packed_np(masks[n]) for n in names})
            _log(f"similarity: mask for calibration seed {value} ({tuple(ids.shape)})")
        pairs = _pairwise([lambda name, s=s: s[name] for s in sets], names)
        out["seeds"] = {"seeds": list(seed_values), "n_samples": int(seed_windows[0].shape[0]),
                        "seqlen": int(seed_windows[0].shape[1]), "method": method, "group": group,
                        "sparsity": sparsity, "pairs": pairs, "seconds": time.perf_counter() - t0}
    return out


# --------------------------------------------------------------------------- sensitivity


def sensitivity_audit(
    model,
    input_ids: torch.Tensor,
    replacements: torch.Tensor,
    neighbours: int,
    method: str = "wanda",
    sparsity: float = 0.5,
    group: str = "row",
    seed: int = 0,
    blocks: int | None = None,
    batch_size: int = 8,
    base_masks: Mapping[str, torch.Tensor] | None = None,
    placement=None,
) -> dict:
    """Masks of D (``input_ids``) and of ``neighbours`` data sets D'_j that differ from D in
    exactly one sample (row j mod n of D replaced by ``replacements[j]``): per neighbour, the
    number and fraction of differing mask bits, overall and per layer type. ``base_masks``:
    D's masks if already known (the client's shared mask file), else computed here."""
    from fedlib.models import fingerprint

    n = input_ids.shape[0]
    if replacements.shape[0] < neighbours:
        raise ValueError(f"{neighbours} neighbours need as many replacement samples, got {replacements.shape[0]}")
    if replacements.shape[1] != input_ids.shape[1]:
        raise ValueError("replacement samples must have the calibration samples' length")
    t0 = time.perf_counter()
    base = base_masks if base_masks is not None else client_masks(
        model, input_ids, method, sparsity, group, seed, blocks, batch_size, placement=placement)
    names = list(base)
    sizes: dict[str, int] = {}
    for name in names:
        sizes[layer_type(name)] = sizes.get(layer_type(name), 0) + base[name].numel()
    rows = []
    for j in range(neighbours):
        ids = input_ids.clone()
        ids[j % n] = replacements[j]
        masks = client_masks(model, ids, method, sparsity, group, seed, blocks, batch_size, placement=placement)
        diff: dict[str, int] = {}
        for name in names:
            t = layer_type(name)
            diff[t] = diff.get(t, 0) + int((masks[name] ^ base[name]).sum())
        rows.append({"replaced_row": j % n, "diff": diff, "changed_bits": sum(diff.values())})
        _log(f"sensitivity: neighbour {j}: {sum(diff.values())} bits differ")
    total = sum(sizes.values())
    return {
        "analysis": "sensitivity", "model_fingerprint": fingerprint(model),
        "n_samples": int(n), "seqlen": int(input_ids.shape[1]), "neighbours": rows,
        "blocks": blocks, "n_layers": len(names), "type_sizes": sizes, "total_entries": total,
        "method": method, "group": group, "sparsity": sparsity, "seed": seed,
        "seconds": time.perf_counter() - t0,
    }


# --------------------------------------------------------------------------- membership


def attack_summary(members, nonmembers, fprs=(0.01, 0.001), confidence: float = 0.95,
                   seed: int = 0, n_boot: int = 1000) -> dict:
    """AUC (+ bootstrap CI), ROC, TPR at each target FPR (+ Clopper-Pearson CI on the TPR,
    with the resolution caveat) and the ε lower bounds of one attack's scores."""
    from fedlib.privacy.membership import (
        audit_epsilon, bootstrap_auc_ci, clopper_pearson, roc_auc, roc_curve, tpr_at_fpr,
    )

    m, n = np.asarray(members, float), np.asarray(nonmembers, float)
    fpr, tpr, _ = roc_curve(m, n)
    out = {
        "auc": roc_auc(m, n), "auc_ci": list(bootstrap_auc_ci(m, n, confidence, n_boot, seed)),
        "roc_fpr": fpr.tolist(), "roc_tpr": tpr.tolist(), "n_members": int(m.size),
        "n_nonmembers": int(n.size), "tpr_at_fpr": [],
    }
    for target in fprs:
        r = tpr_at_fpr(m, n, target)
        out["tpr_at_fpr"].append({
            "target_fpr": target, "tpr": r.tpr, "fpr": r.fpr, "tp": r.tp, "fp": r.fp,
            "tpr_ci": list(clopper_pearson(r.tp, r.n_members, confidence)),
            "resolvable": r.resolvable, "min_nonzero_fpr": r.min_nonzero_fpr, "note": r.note,
        })
    # a priori threshold: likelihood ratio 1 (LiRA score 0) on all scores
    out["epsilon_lr1"] = audit_epsilon(m, n, confidence, threshold=0.0)
    try:  # threshold chosen on half of the scores, bound on the other half
        out["epsilon_split"] = audit_epsilon(m, n, confidence, seed=seed)
    except ValueError as err:
        out["epsilon_split"] = {"epsilon_lb": None, "note": str(err)}
    return out


def membership_audit(
    model,
    population: torch.Tensor,
    targets: int,
    samples: int,
    pairs: int,
    blocks: int | None,
    method: str = "wanda",
    sparsity: float = 0.5,
    group: str = "row",
    seed: int = 0,
    epsilons: Sequence[float] = (),
    fprs: Sequence[float] = (0.01, 0.001),
    confidence: float = 0.95,
    natural: int = 12,
    batch_size: int = 8,
    placement=None,
) -> dict:
    """LiRA membership inference against a client's (block-restricted) mask.

    The game, per target t (the first ``targets`` rows of ``population``): the client's data
    set is t plus ``samples``-1 random other population rows (member) or ``samples`` random
    other rows (non-member); the attacker sees the client's mask of blocks ``0..blocks-1``.
    The attacker knows the model, the method and the population. It computes ``pairs`` shadow
    pairs per target, (R + t, R + s) with R random and s a random replacement (replace-one
    neighbours): the first half give the direction d_t = mean(in) - mean(out)
    (:func:`fedlib.privacy.membership.target_direction`), the other half the in/out
    distributions of the statistic <d_t, mask> / |d_t|_1, fitted as Gaussians with a variance
    pooled over targets (Carlini et al.'s choice with few shadows). Score = log-likelihood
    ratio; one member and one non-member observation per target.

    Randomized response with per-bit ε (``epsilons``): the observation and the fitting
    shadows are noised (the attacker knows the mechanism), the direction comes from clean
    shadows. Only entries where d_t != 0 enter the statistic, so only those are noised (the
    others cannot change it): exact in distribution and cheap.
    """
    from fedlib.groups import seeded_generator
    from fedlib.models import fingerprint
    from fedlib.privacy.defence import rr_flip_probability
    from fedlib.privacy.membership import lira_scores, target_direction

    P = population.shape[0]
    if pairs < 2:
        raise ValueError("membership needs at least 2 shadow pairs per target (direction + fit)")
    if not 1 <= targets <= P:
        raise ValueError(f"targets must be in 1..{P} (population rows), got {targets}")
    if samples < 1 or samples + 1 > P:
        raise ValueError(f"samples must be in 1..{P - 1}, got {samples}")
    n_dir = pairs // 2
    n_fit = pairs - n_dir
    rng = np.random.default_rng([seed, 0x4D1A])
    names: list[str] | None = None
    t0 = time.perf_counter()

    def mask_of(rows) -> torch.Tensor:
        nonlocal names
        masks = client_masks(model, population[list(rows)], method, sparsity, group, seed, blocks, batch_size,
                             placement=placement)
        if names is None:
            names = list(masks)
        return flat_mask(masks, names)

    eps_list = [float(e) for e in epsilons]
    fit_in = np.zeros((targets, n_fit))
    fit_out = np.zeros((targets, n_fit))
    obs = np.zeros((targets, 2))
    rr_fit_in = np.zeros((len(eps_list), targets, n_fit))
    rr_fit_out = np.zeros((len(eps_list), targets, n_fit))
    rr_obs = np.zeros((len(eps_list), targets, 2))
    target_hamming, naturals, support_sizes = [], [], []
    n_bits = None
    for t in range(targets):
        others = np.delete(np.arange(P), t)
        ins, outs = [], []
        for _ in range(pairs):
            pick = rng.choice(others, samples, replace=False)
            rest, swap = pick[: samples - 1].tolist(), int(pick[-1])
            ins.append(mask_of(rest + [t]))
            outs.append(mask_of(rest + [swap]))
        member_obs = mask_of(rng.choice(others, samples - 1, replace=False).tolist() + [t])
        nonmember_obs = mask_of(rng.choice(others, samples, replace=False).tolist())
        n_bits = member_obs.numel()
        target_hamming += [float((a ^ b).sum()) / n_bits for a, b in zip(ins, outs)]
        if len(naturals) < natural:
            naturals.append(nonmember_obs)
        d = target_direction(ins[:n_dir], outs[:n_dir])
        support = torch.nonzero(d).flatten()
        support_sizes.append(int(support.numel()))
        ds = d[support]
        norm = float(ds.abs().sum())

        def stat(bits: torch.Tensor) -> float:
            return float(bits.to(torch.float64) @ ds) / norm if norm > 0 else 0.0

        fit_masks = ins[n_dir:] + outs[n_dir:]
        observed = [member_obs, nonmember_obs]
        sub_fit = [m[support] for m in fit_masks]
        sub_obs = [m[support] for m in observed]
        fit_in[t] = [stat(b) for b in sub_fit[:n_fit]]
        fit_out[t] = [stat(b) for b in sub_fit[n_fit:]]
        obs[t] = [stat(b) for b in sub_obs]
        for e, eps in enumerate(eps_list):
            q = rr_flip_probability(eps)
            gen = seeded_generator(seed, "membership-rr", eps, t)

            def noisy(bits, q=q, gen=gen):
                return stat(bits ^ (torch.rand(bits.shape, generator=gen) < q))

            rr_fit_in[e, t] = [noisy(b) for b in sub_fit[:n_fit]]
            rr_fit_out[e, t] = [noisy(b) for b in sub_fit[n_fit:]]
            rr_obs[e, t] = [noisy(b) for b in sub_obs]
        if t % 8 == 0 or t == targets - 1:
            _log(f"membership: target {t + 1}/{targets} ({time.perf_counter() - t0:.0f}s)")

    def scores(o, fi, fo):
        member = lira_scores(o[:, 0], fi, fo, global_variance=True)
        nonmember = lira_scores(o[:, 1], fi, fo, global_variance=True)
        return member, nonmember

    members, nonmembers = scores(obs, fit_in, fit_out)
    natural_pairs = [float((naturals[i] ^ naturals[j]).sum()) / n_bits
                     for i in range(len(naturals)) for j in range(i + 1, len(naturals))]
    natural_mean = float(np.mean(natural_pairs)) if natural_pairs else float("nan")
    th = float(np.mean(target_hamming))
    result = {
        "analysis": "membership", "model_fingerprint": fingerprint(model),
        "population": int(P), "targets": targets, "samples": samples, "pairs": pairs,
        "direction_pairs": n_dir, "fit_pairs": n_fit, "blocks": blocks,
        "seqlen": int(population.shape[1]), "observed_layers": len(names or []),
        "observed_bits": int(n_bits), "method": method, "group": group, "sparsity": sparsity,
        "seed": seed, "confidence": confidence, "fprs": list(fprs),
        "scores_members": members.tolist(), "scores_nonmembers": nonmembers.tolist(),
        "attack": attack_summary(members, nonmembers, fprs, confidence, seed),
        "signal_strength": {
            "target_hamming": th, "target_hamming_std": float(np.std(target_hamming)),
            "natural_hamming": natural_mean, "natural_pairs": len(natural_pairs),
            "ratio": th / natural_mean if natural_mean > 0 else None,
        },
        "direction_support_mean": float(np.mean(support_sizes)),
        "rr": [],
        "seconds": time.perf_counter() - t0,
    }
    for e, eps in enumerate(eps_list):
        m, n = scores(rr_obs[e], rr_fit_in[e], rr_fit_out[e])
        summary = attack_summary(m, n, fprs, confidence, seed)
        result["rr"].append({"epsilon": eps, "flip_probability": rr_flip_probability(eps), **summary})
    return result


# --------------------------------------------------------------------------- inversion


def unigram_distribution(token_files: Sequence[Path], vocab_size: int) -> torch.Tensor:
    """Token frequencies (add-0.5 smoothed) of public text: what any server knows."""
    from fedlib.data import load_tokens

    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for path in token_files:
        ids, _ = load_tokens(Path(path))
        ids = ids.flatten()
        counts += torch.bincount(ids[ids < vocab_size], minlength=vocab_size).double()
    counts += 0.5
    return counts / counts.sum()


def _inversion_row(r, target, T, unigram, extra) -> dict:
    from fedlib.privacy.inversion import _round_histogram, bag_overlap

    row = {**extra, "tokens": T, **r.summary(), "decoded_tokens": r.tokens, "target_tokens": target,
           "text": r.text, "target_text": r.target_text}
    if unigram is not None:
        row["unigram_bag_overlap"] = bag_overlap(_round_histogram(unigram, T).tolist(), target)
    return row


def inversion_audit(
    model,
    tokenizer,
    texts: Mapping[int, torch.Tensor],
    sparsity: float = 0.5,
    group: str = "row",
    seed: int = 0,
    steps: int = 300,
    restarts: int = 1,
    prior: torch.Tensor | None = None,
    use_prior: bool = False,
    tiny_lengths: Sequence[int] = (1, 2, 3),
    tiny_steps: int = 200,
    time_limit: float | None = None,
) -> dict:
    """Invert the client's block-0 ``q_proj`` mask of each text (``texts``: length T ->
    (n, T) token rows) with :func:`invert_block0_masks`; ``prior`` is a public unigram
    distribution used for the unigram-guess baseline (and as the attack's initial logits
    when ``use_prior``). Then the tiny-model case (vocabulary 32, hidden 64), where the
    information is there and recovery is exact.

    The attack uses only the embedding and block 0; it runs on the CPU in float32 whatever the
    model's size (block 0 is the only block read from a lazy model)."""
    from fedlib.models import ModelHandle
    from fedlib.privacy.inversion import invert_block0_masks, wanda_block0_masks
    from fedlib.runner import CPU, resident_block

    handle = ModelHandle.of(model)
    with resident_block(handle, 0, CPU):
        rows = _invert_texts(handle.model, tokenizer, texts, sparsity, group, seed, steps, restarts, prior,
                             use_prior, time_limit, invert_block0_masks, wanda_block0_masks)
    tiny = tiny_inversion_cases(tiny_lengths, seed, sparsity, group, tiny_steps)
    return {
        "analysis": "inversion", "model_fingerprint": handle.fingerprint(), "layers": ["self_attn.q_proj"],
        "sparsity": sparsity, "group": group, "seed": seed, "steps": steps, "restarts": restarts,
        "use_prior": bool(use_prior and prior is not None), "rows": rows, "tiny": tiny,
    }


def _invert_texts(model, tokenizer, texts, sparsity, group, seed, steps, restarts, prior, use_prior,
                  time_limit, invert_block0_masks, wanda_block0_masks) -> list[dict]:
    layers = ["self_attn.q_proj"]
    rows = []
    init = torch.log(prior).float() if (prior is not None and use_prior) else None
    for T, ids in sorted(texts.items()):
        for i, row in enumerate(ids):
            target = [int(x) for x in row]
            masks = wanda_block0_masks(model, target, layers, sparsity, group, seed)
            r = invert_block0_masks(model, masks, T, sparsity, group, seed, steps=steps, restarts=restarts,
                                    init_logits=init, target_tokens=target, tokenizer=tokenizer,
                                    time_limit=time_limit)
            rows.append(_inversion_row(r, target, T, prior, {"model": "real", "text_index": i}))
            _log(f"inversion: T={T} text {i}: bag {r.bag_overlap:.3f}, agreement {r.mask_agreement:.5f} "
                 f"({r.seconds:.0f}s)")
    return rows


def tiny_llama_for_inversion(seed: int, vocab: int = 32, hidden: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=hidden // 4)
    return LlamaForCausalLM(cfg).eval()


def tiny_inversion_cases(lengths: Sequence[int], seed: int = 0, sparsity: float = 0.5,
                         group: str = "row", steps: int = 200) -> list[dict]:
    """The attack where the mask does hold the text: a random tiny LLaMA (vocabulary 32,
    hidden 64, so 64 x 64 = 4096 mask bits for at most a few tokens)."""
    from fedlib.privacy.inversion import invert_block0_masks, wanda_block0_masks

    rows = []
    for k, T in enumerate(lengths):
        model = tiny_llama_for_inversion(seed + k)
        gen = torch.Generator().manual_seed(seed + 1000 + k)
        target = torch.randint(0, 32, (T,), generator=gen).tolist()
        masks = wanda_block0_masks(model, target, ["self_attn.q_proj"], sparsity, group, seed)
        r = invert_block0_masks(model, masks, T, sparsity, group, seed, steps=steps, target_tokens=target)
        row = _inversion_row(r, target, T, None, {"model": "tiny (vocab 32, hidden 64)", "text_index": 0})
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- defence


def rr_count_cdf(n_clients: int, epsilon: float) -> torch.Tensor:
    """(m+1, m+1) table: row C is the CDF over the observed count of Bin(C, p) + Bin(m-C, q),
    the number of "pruned" reports among m clients applying randomized response (keep
    probability p, flip probability q) to a weight that C of them truly pruned."""
    from scipy import stats

    from fedlib.privacy.defence import rr_keep_probability

    p = rr_keep_probability(epsilon)
    m = n_clients
    table = np.zeros((m + 1, m + 1))
    k = np.arange(m + 1)
    for c in range(m + 1):
        a = stats.binom.pmf(k[: c + 1], c, p)
        b = stats.binom.pmf(k[: m - c + 1], m - c, 1 - p)
        table[c] = np.convolve(a, b)
    return torch.from_numpy(np.cumsum(table, axis=1))


def sample_rr_counts(true_counts: torch.Tensor, n_clients: int, epsilon: float,
                     generator: torch.Generator, cdf: torch.Tensor | None = None) -> torch.Tensor:
    """Vote counts the server observes when each of ``n_clients`` clients applies randomized
    response (per-bit ε) to its mask, given the true counts: one uniform per weight and the
    exact CDF (:func:`rr_count_cdf`). Same distribution as summing
    :func:`fedlib.privacy.defence.randomized_response` over the clients' masks (the flips are
    independent across clients and weights), at a cost independent of the number of clients."""
    cdf = rr_count_cdf(n_clients, epsilon) if cdf is None else cdf
    u = torch.rand(true_counts.shape, generator=generator, dtype=torch.float64).numpy().reshape(-1)
    c = true_counts.to(torch.int64).numpy().reshape(-1)
    # observed = #{k < m : u > CDF_c(k)}: per true count c (entries sorted by c), a search of
    # u in that row of the CDF
    order = np.argsort(c.astype(np.uint8 if n_clients <= 255 else np.int16), kind="stable")  # radix sort
    table = cdf.numpy()
    observed = np.empty(c.size, dtype=np.int16)
    start = 0
    for value, n in enumerate(np.bincount(c, minlength=n_clients + 1)):
        if n:
            rows = order[start : start + n]
            observed[rows] = np.searchsorted(table[value][:-1], u[rows], side="left")
            start += n
    return torch.from_numpy(observed).reshape(true_counts.shape)


def rr_aggregate(
    model,
    mask_paths: Sequence[Path],
    epsilon: float,
    group: str,
    sparsity: float,
    seed: int,
    out: Path,
    per_client: bool = False,
    clean_global: Path | None = None,
) -> dict:
    """The defence end to end: every client applies randomized response with per-bit ε to
    its mask (``per_client``: literally, with :func:`randomized_response`; default: the
    server's noisy counts sampled exactly, :func:`sample_rr_counts`), the FedPrLLM server
    takes the top-k of the noisy counts per comparison group and writes the global mask
    file. Its ``votes:`` tensors hold the debiased counts (rounded, clipped to 0..m), so
    weight scaling (``--scale``) would use debiased counts; top-k on debiased counts equals
    top-k on raw counts (an increasing affine map), which is checked here on block 0.
    ``clean_global``: the noise-free FedPrLLM global mask file of the same clients (from
    ``fedlib aggregate``), read instead of recomputed for the distance to the noisy one."""
    from fedlib.groups import seeded_generator
    from fedlib.maskfile import write_mask_file
    from fedlib.models import fingerprint, prunable_layers
    from fedlib.privacy.defence import debias_counts, randomized_response, rr_flip_probability
    from fedlib.server.fedprllm import global_mask_from_votes

    layers = prunable_layers(model)
    fp = fingerprint(model)
    q = rr_flip_probability(epsilon)
    t0 = time.perf_counter()
    global_masks, votes = {}, {}
    stats = {"bits": 0, "global_diff": 0, "abs_err": 0.0, "flips": 0, "client_bits": 0,
             "zero_entries": 0, "zero_reports": 0, "full_entries": 0, "full_reports": 0,
             "topk_debiased_equal": True}
    clean_file = None
    if clean_global is not None:
        from fedlib.maskfile import MaskFile

        clean_file = MaskFile(Path(clean_global), fp, layers)
        h = clean_file.header
        if (h.role, h.group, h.sparsity, h.seed, h.n_clients) != ("global", group, sparsity, seed, len(mask_paths)):
            raise ValueError(f"{clean_global}: a {h.role} mask ({h.group}, {h.sparsity}, seed {h.seed}, "
                             f"{h.n_clients} clients) is not the noise-free global mask of this aggregation")
    with open_mask_files(mask_paths, fp, layers) as (files, packed):
        m = len(files)
        cdf = None if per_client or math.isinf(epsilon) else rr_count_cdf(m, epsilon)
        for info in layers:
            numel = math.prod(info.shape)
            # one client's bits at a time: memory does not grow with the number of clients
            total = np.zeros(numel, dtype=np.int16)
            noisy_total = torch.zeros(info.shape, dtype=torch.int16) if per_client else None
            for i in range(m):
                b = np.unpackbits(packed(i, info.name), count=numel, bitorder="little")
                total += b
                if per_client and not math.isinf(epsilon):
                    clean = torch.from_numpy(b.astype(bool)).reshape(info.shape)
                    gen = seeded_generator(seed, "rr", files[i].header.client_id, epsilon, info.name)
                    noisy = randomized_response(clean, epsilon, generator=gen)
                    stats["flips"] += int((noisy ^ clean).sum())
                    stats["client_bits"] += numel
                    noisy_total += noisy.to(torch.int16)
            true = torch.from_numpy(total).reshape(info.shape)
            if math.isinf(epsilon):
                observed = true.clone()
            elif per_client:
                observed = noisy_total
            else:
                gen = seeded_generator(seed, "rr-counts", epsilon, info.name)
                observed = sample_rr_counts(true, m, epsilon, gen, cdf)
            glob = global_mask_from_votes(observed, sparsity, group, seed, info.name)
            if clean_file is not None:
                clean_glob = clean_file.layer_mask(info.name)
            else:
                clean_glob = global_mask_from_votes(true, sparsity, group, seed, info.name)
            if math.isinf(epsilon):
                debiased = true.double()
            else:
                debiased = debias_counts(observed, m, epsilon)
                if info.block == 0:  # the invariance, checked exactly on block 0
                    again = global_mask_from_votes(debiased.float(), sparsity, group, seed, info.name)
                    stats["topk_debiased_equal"] &= bool(torch.equal(again, glob))
            zero, full = true == 0, true == m
            stats["zero_entries"] += int(zero.sum())
            stats["zero_reports"] += int(observed[zero].sum())
            stats["full_entries"] += int(full.sum())
            stats["full_reports"] += int((m - observed[full]).sum())
            stats["bits"] += numel
            stats["global_diff"] += int((glob ^ clean_glob).sum())
            stats["abs_err"] += float((debiased - true.double()).abs().sum())
            global_masks[info.name] = glob
            votes[info.name] = debiased.round().clamp(0, m).to(torch.int16)
        header = files[0].header
        n_samples = sum(f.header.n_samples for f in files)
    write_mask_file(
        Path(out), global_masks, layers, fingerprint=fp, role="global", client_id="server",
        method=f"fedprllm[{header.method}]+rr", group=group, sparsity=sparsity, n_samples=n_samples,
        seed=seed, n_clients=m, votes=votes,
        extra={"rr_epsilon_per_bit": repr(epsilon), "votes": "debiased counts, rounded and clipped"},
    )
    # measured flip rate: entries no client pruned report "pruned" only by a flip, and
    # entries every client pruned report "kept" only by a flip
    flip_rate_measured = (stats["zero_reports"] + stats["full_reports"]) / max(
        m * (stats["zero_entries"] + stats["full_entries"]), 1)
    return {
        "analysis": "defence", "model_fingerprint": fp, "epsilon": epsilon, "flip_probability": q,
        "n_clients": m, "group": group, "sparsity": sparsity, "seed": seed,
        "sampling": "per-client" if per_client else "exact count distribution",
        "bits_per_client": stats["bits"],
        "flip_rate_measured": flip_rate_measured,
        "flip_rate_per_client": stats["flips"] / stats["client_bits"] if stats["client_bits"] else None,
        "global_hamming_vs_clean": stats["global_diff"] / stats["bits"],
        "debiased_count_mae": stats["abs_err"] / stats["bits"],
        "topk_debiased_equal": stats["topk_debiased_equal"],
        "unanimous_fraction": (stats["zero_entries"] + stats["full_entries"]) / stats["bits"],
        "mask": str(out), "seconds": time.perf_counter() - t0,
    }


# --------------------------------------------------------------------------- CLI


def _write_json(path: Path, payload: dict) -> None:
    from fedlib.io import write_text_atomic

    write_text_atomic(Path(path), json.dumps(payload, indent=1, sort_keys=True, default=_json_default) + "\n")


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    raise TypeError(f"not JSON serializable: {type(x)}")


def _open(args, placed: bool = True):
    """(model handle, placement) of an analysis: the placement from ``--device`` / ``--dtype``
    for analyses that compute masks, the CPU otherwise."""
    from fedlib.models import open_model
    from fedlib.runner import CPU, Placement

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    placement = Placement.resolve(args.device, args.dtype) if placed else CPU
    return open_model(args.model, placement.dtype), placement


def _cmd_entropy(args) -> None:
    handle, _ = _open(args, placed=False)
    _write_json(args.out, entropy_audit(handle, [Path(p) for p in args.masks]))


def _cmd_similarity(args) -> None:
    model, placement = _open(args)
    windows = []
    if args.seeds:
        from fedlib.data import calibration_windows
        from fedlib.models import load_tokenizer

        tokenizer = load_tokenizer(args.model)
        data_dir = None if args.data_dir in (None, "", "hub") else Path(args.data_dir)
        docs = tuple(args.docs) if args.docs else None
        windows = [calibration_windows(tokenizer, args.dataset, data_dir, args.seed_samples, args.seqlen, s, docs)
                   for s in args.seeds]
    result = similarity_audit(model, [Path(p) for p in args.masks], windows, args.seeds or [], args.method,
                              args.sparsity, args.group, args.seed, args.batch_size, placement)
    _write_json(args.out, result)


def _cmd_sensitivity(args) -> None:
    from fedlib.data import load_tokens

    model, placement = _open(args)
    ids, _ = load_tokens(Path(args.calib))
    reps = torch.cat([load_tokens(Path(p))[0] for p in args.replacements])
    base = _base_masks(model, args, ids) if args.base_mask else None
    result = sensitivity_audit(model, ids, reps, args.neighbours, args.method, args.sparsity, args.group,
                               args.seed, args.blocks, args.batch_size, base, placement)
    result["calib"] = str(args.calib)
    result["base_mask"] = args.base_mask
    _write_json(args.out, result)


def _base_masks(model, args, ids) -> dict[str, torch.Tensor]:
    """D's masks from the client's shared mask file, after checking it was computed the
    way this analysis computes masks (else the comparison would mix two computations)."""
    from fedlib.maskfile import MaskFile
    from fedlib.models import fingerprint, prunable_layers

    mf = MaskFile(Path(args.base_mask), fingerprint(model), prunable_layers(model))
    h = mf.header
    wanted = {"method": args.method, "group": args.group, "sparsity": args.sparsity, "seed": args.seed,
              "n_samples": int(ids.shape[0])}
    found = {"method": h.method, "group": h.group, "sparsity": h.sparsity, "seed": h.seed, "n_samples": h.n_samples}
    if found != wanted:
        raise ValueError(f"{args.base_mask}: computed with {found}, not {wanted}; omit --base-mask to recompute")
    masks = mf.masks()
    if args.blocks is not None:
        masks = {n: m for n, m in masks.items() if _block_of(n) < args.blocks}
    return masks


def _cmd_membership(args) -> None:
    from fedlib.data import load_tokens

    model, placement = _open(args)
    pop, _ = load_tokens(Path(args.population))
    result = membership_audit(model, pop, args.targets, args.samples, args.pairs, args.blocks, args.method,
                              args.sparsity, args.group, args.seed, args.epsilons, args.fprs,
                              args.confidence, batch_size=args.batch_size, placement=placement)
    result["population_file"] = str(args.population)
    _write_json(args.out, result)


def _cmd_inversion(args) -> None:
    from fedlib.data import load_tokens

    from fedlib.models import load_tokenizer

    model, _ = _open(args, placed=False)
    tokenizer = load_tokenizer(args.model)
    texts = {}
    for path in args.texts:
        ids, _ = load_tokens(Path(path))
        texts[int(ids.shape[1])] = ids[: args.per_length]
    vocab = model.model.get_input_embeddings().weight.shape[0]
    prior = unigram_distribution(args.prior_tokens, vocab) if args.prior_tokens else None
    result = inversion_audit(model, tokenizer, texts, args.sparsity, args.group, args.seed, args.steps,
                             args.restarts, prior, args.use_prior, args.tiny_lengths, args.tiny_steps,
                             args.time_limit)
    result["prior_tokens"] = [str(p) for p in args.prior_tokens or []]
    _write_json(args.out, result)


def _cmd_rr_aggregate(args) -> None:
    model, _ = _open(args, placed=False)
    record = rr_aggregate(model, [Path(p) for p in args.masks], args.epsilon, args.group.replace("of", ":"),
                          args.sparsity, args.seed, Path(args.out), args.per_client,
                          Path(args.clean_global) if args.clean_global else None)
    _write_json(args.record, record)
    _log(f"wrote {args.out}: ε={args.epsilon}, global mask differs from the noise-free one in "
         f"{record['global_hamming_vs_clean']:.4%} of the weights")


def _cmd_report(args) -> None:
    from fedlib.privacy.audit_report import write_reports

    for path in write_reports(json.loads(args.spec)):
        _log(f"wrote {path}")


COMMANDS = {
    "entropy": _cmd_entropy, "similarity": _cmd_similarity, "sensitivity": _cmd_sensitivity,
    "membership": _cmd_membership, "inversion": _cmd_inversion, "rr-aggregate": _cmd_rr_aggregate,
    "report": _cmd_report,
}
