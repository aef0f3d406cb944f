"""Stage ``inversion``: the honest-but-curious server reconstructs calibration tokens from the
client's block-0 ``q_proj`` mask (:func:`fedlib.privacy.inversion.invert_block0_masks`), on the
real model and on a tiny model where recovery is exact; and :func:`client_inversion`, the same
attack on a client's uploaded mask file against the bag of its whole calibration set."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch


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
            print(f"inversion: T={T} text {i}: bag {r.bag_overlap:.3f}, agreement {r.mask_agreement:.5f} "
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


def read_upload(model_handle, mask_path: Path, shard_rows: int, layers: Sequence[str]) -> tuple[dict, dict]:
    """(block-0 masks {full layer name: mask}, the header's settings) of a client's mask file as the
    server receives it: header-checked against the model; it must be a Wanda client mask of a
    uniform group (the attack's model of the mask) over ``shard_rows`` samples."""
    from fedlib.groups import GROUPS
    from fedlib.maskcode import MagnitudeReference
    from fedlib.maskfile import MaskFile, MaskFileError, read_header
    from fedlib.privacy.inversion import layer_name

    reference = MagnitudeReference.of_model(model_handle) if read_header(mask_path).format_version == 2 else None
    mf = MaskFile(Path(mask_path), model_handle.fingerprint(), model_handle.layers(), reference=reference)
    h = mf.header
    checks = (("role", h.role, "client"), ("method", h.method, "wanda"), ("allocation", h.allocation, "uniform"))
    for name, found, wanted in checks:
        if found != wanted:
            raise MaskFileError(mask_path, name, f"{found!r}; the inversion inverts a {wanted!r} client mask")
    if h.group not in GROUPS:
        raise MaskFileError(mask_path, "group", f"{h.group!r}; the inversion supports {', '.join(GROUPS)}")
    if h.n_samples != shard_rows:
        raise MaskFileError(mask_path, "n_samples", f"{h.n_samples}, but the client's shard has {shard_rows} rows")
    masks = {layer_name(s): mf.layer_mask(layer_name(s)) for s in layers}
    return masks, {"sparsity": h.sparsity, "group": h.group, "seed": h.seed, "client_id": h.client_id}


def client_inversion(
    model,
    mask_path: Path,
    shard: torch.Tensor,
    priors: Mapping[str, torch.Tensor],
    init_prior: str | None,
    steps: int = 300,
    refine_moves: int = 0,
    n_candidates: int = 2048,
    layers: Sequence[str] | None = None,
) -> dict:
    """The server inverts one client's uploaded block-0 q/k/v masks (``mask_path``) back to the
    bag of all its calibration tokens (``shard``, (n, seqlen), used only to score the attack).

    The sparsity, group and tie-break seed are the upload's (its header: the server knows them);
    T = the shard's token count (n_samples x seqlen: the server knows both). First a check that
    can fail: the uploaded masks equal the Wanda masks of the shard's tokens taken as one bag
    (the statistic has no positions). ``priors``: public unigram distributions by name; each
    gives a unigram-guess baseline (the bag of T tokens a server guesses without the mask), and
    ``init_prior`` names the one the attack starts from."""
    from fedlib.models import ModelHandle
    from fedlib.privacy.inversion import QKV, _round_histogram, bag_overlap, invert_block0_masks, wanda_block0_masks
    from fedlib.runner import CPU, resident_block

    layers = list(layers or QKV)
    handle = ModelHandle.of(model)
    target_masks, settings = read_upload(handle, Path(mask_path), int(shard.shape[0]), layers)
    target = [int(t) for t in shard.flatten()]
    T = len(target)
    if init_prior is not None and init_prior not in priors:
        raise ValueError(f"init_prior {init_prior!r} is not one of the priors {sorted(priors)}")
    sparsity, group, seed = settings["sparsity"], settings["group"], settings["seed"]
    with resident_block(handle, 0, CPU):
        bag_masks = wanda_block0_masks(handle.model, target, layers, sparsity, group, seed)
        init = torch.log(priors[init_prior]).float() if init_prior is not None else None
        r = invert_block0_masks(handle.model, target_masks, T, sparsity, group, seed, steps=steps,
                                refine_sweeps=0, refine_moves=refine_moves, n_candidates=n_candidates,
                                init_logits=init, target_tokens=target)
    return {
        "analysis": "inversion_client", "model_fingerprint": handle.fingerprint(), "mask_file": str(mask_path),
        **settings, "layers": list(target_masks), "tokens": T, "samples": int(shard.shape[0]),
        "seqlen": int(shard.shape[1]), "distinct_tokens": len(set(target)), "steps": steps,
        "refine_moves": refine_moves, "candidates": n_candidates, "init_prior": init_prior,
        "upload_is_bag_mask": {n: bool(torch.equal(bag_masks[n], m)) for n, m in target_masks.items()},
        "bag_overlap": r.bag_overlap, "gradient_bag_overlap": bag_overlap(r.gradient_tokens, target),
        "mask_agreement": r.mask_agreement, "gradient_agreement": r.gradient_agreement,
        "baseline_agreement": r.baseline_agreement, "true_tokens_agreement": r.true_tokens_agreement,
        "moves": sum(1 for h in r.history if "refine_move" in h),
        "unigram_bag_overlap": {name: bag_overlap(_round_histogram(p, T).tolist(), target)
                                for name, p in priors.items()},
        "decoded_tokens": r.tokens, "gradient_tokens": r.gradient_tokens, "target_tokens": target,
    }
