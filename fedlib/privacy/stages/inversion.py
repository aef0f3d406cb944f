"""Stage ``inversion``: the honest-but-curious server reconstructs calibration tokens from the
client's block-0 ``q_proj`` mask (:func:`fedlib.privacy.inversion.invert_block0_masks`), on the
real model and on a tiny model where recovery is exact."""

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
