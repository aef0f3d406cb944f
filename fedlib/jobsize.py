"""The host memory a job needs, from what it will load: the model checkpoint's tensor sizes
(read from its safetensors headers, never the weights), the compute dtype and the token files
it is given. The workflow asks for this as each rule's ``mem_mb`` (Snakemake evaluates it once
the job's inputs exist), so a 7B job on a memory-enforcing cluster asks for what it uses and a
135M job does not ask for 64 GB.

What each kind of job holds at its peak (``kind``):

``blocks``
    The block runner (client masks, iterative, FedSpaLLM, perplexity, privacy masks): the
    non-block modules in the compute dtype, one block as stored plus its placed copy plus
    float32 working copies and statistics, and every client's activations between blocks
    (input and output of the block, in the compute dtype) plus one batch's intermediates.
``blocks+weights``
    FedSpaLLM: the block runner, plus the global model's pruned weights (2 bytes per
    parameter) and masks (1 byte), which are kept until the last round has been aggregated.
``headroom``
    The DP headroom analysis (:mod:`fedlib.privacy.dp_headroom`): the block runner, plus what
    it keeps from the first block to its last variant: every sample's relative channel
    deviations at every linear's input (float64), every block's weights (float32), and the
    scoring model (float32 at most) with one window's logits. Measured at SmolLM2-135M with
    1,056 x 512 tokens: a 6.5 GiB peak, against 4.5 GiB estimated for the block runner alone
    and 7.3 GiB estimated here.
``zeroshot``
    lm-evaluation-harness on the whole model placed at once: every parameter in the compute
    dtype (plus the stored copy of a block while it is read), lm-eval with the tasks'
    documents, and a batch of requests' float32 logits and log-probabilities (up to
    :data:`ZEROSHOT_TOKENS` tokens each).
``layers``
    Mask files only (server aggregation, random masks, randomized response, entropy): a few
    copies of the largest layer's votes, scores and sort keys.

Accelerator memory is not a Snakemake resource; on a GPU the device holds the placed block and
(when they fit) the activations, so the host figure here is an upper bound there too.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fedlib.checkpoint import Checkpoint, stored_tensors

#: every job: its python with torch, transformers and fedlib (measured 400-650 MiB with a
#: 135M model's non-block modules) and, on a cluster, the job-side Snakemake (about 350 MiB)
BASE_MIB = 1024
#: lm-eval, datasets and the seven tasks' documents (zero-shot of SmolLM2-135M peaks at 2.0 GB)
LM_EVAL_MIB = 512
#: tokens per zero-shot request, for the logits of a batch (the tasks' contexts are shorter)
ZEROSHOT_TOKENS = 256
#: multiplies the estimate: allocator fragmentation, transient copies
HEADROOM = 1.25
KINDS = ("blocks", "blocks+weights", "headroom", "zeroshot", "layers")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelSize:
    """Parameter counts of a checkpoint, split the way a block runner holds them."""

    total: int  # every stored parameter
    outside: int  # parameters outside the decoder blocks (embeddings, final norm, LM head)
    block: int  # the largest decoder block
    layer: int  # the largest 2-D tensor inside a block (one prunable linear)
    blocks: int  # decoder blocks
    block_inputs: int  # the largest block's input features, summed over its 2-D tensors
    stored_bytes: int  # bytes per stored parameter (the checkpoint's dtype)
    hidden: int
    heads: int
    vocab: int


def model_size(folder: Path | str) -> ModelSize:
    """Sizes from the checkpoint's headers and ``config.json`` (tensor names ``....layers.N.*``)."""
    folder = Path(folder)
    checkpoint = Checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    blocks: dict[str, int] = {}
    inputs: dict[str, int] = {}
    outside = layer = 0
    stored = 0
    for name, tensor in checkpoint.tensors.items():
        numel = math.prod(tensor.shape)
        stored = max(stored, tensor.itemsize)
        head, sep, rest = name.partition(".layers.")
        index = rest.split(".", 1)[0] if sep else ""
        if index.isdigit():
            blocks[index] = blocks.get(index, 0) + numel
            if len(tensor.shape) == 2:
                layer = max(layer, numel)
                inputs[index] = inputs.get(index, 0) + int(tensor.shape[1])
        else:
            outside += numel
    if not blocks:
        raise ValueError(f"{folder}: no decoder block tensors (names with '.layers.N.') in the checkpoint")
    return ModelSize(total=outside + sum(blocks.values()), outside=outside, block=max(blocks.values()),
                     layer=layer, blocks=len(blocks), block_inputs=max(inputs.values(), default=0),
                     stored_bytes=stored, hidden=int(config["hidden_size"]),
                     heads=int(config["num_attention_heads"]), vocab=int(config["vocab_size"]))


def tokens_in(paths: Iterable[Path | str]) -> tuple[int, int]:
    """(total tokens, tokens of the longest sample) of token files (their headers only)."""
    total = longest = 0
    for path in paths:
        ids = stored_tensors(Path(path))["input_ids"]
        total += math.prod(ids.shape)
        longest = max(longest, ids.shape[-1])
    return total, longest


def host_mem_mb(model_dir: Path | str, kind: str, dtype: str = "float32", tokens: tuple[int, int] = (0, 0),
                batch_size: int = 8, logits: bool = False) -> int:
    """Megabytes (MiB) a job of ``kind`` needs on the host (module docstring), rounded up to
    256 MiB. ``tokens``: (all samples' tokens, tokens per sample) the job runs through the
    blocks (:func:`tokens_in` of its token files); ``logits``: the job scores the model's
    outputs (perplexity), one batch at a time."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    size = model_size(model_dir)
    width = _DTYPE_BYTES[dtype]
    if kind == "layers":
        # the clients' unpacked masks, int16 votes, float32 scores, int64 sort keys and order,
        # with transient copies: 40 bytes per weight (measured: 8 clients at LLaMA-2-7B's
        # shape peak at 2.4 GB, 1.9 GB of it for its 45 M-weight MLP layers); the server
        # opens the model without reading a tensor
        need = 40 * size.layer
    elif kind == "zeroshot":
        logits = 2 * batch_size * ZEROSHOT_TOKENS * size.vocab * 4
        need = size.total * width + size.block * size.stored_bytes + logits + LM_EVAL_MIB * 2**20
    else:
        tokens, seqlen = tokens
        samples = tokens // seqlen if seqlen else 0
        batch_size = min(batch_size, samples)  # a batch holds at most every sample
        block = size.block * (size.stored_bytes + width + 8)  # as stored, placed, float32 work + statistics
        activations = 2 * tokens * size.hidden * width  # every client's block input and output
        # one batch's float32 intermediates: MLP and projections, attention scores (, logits)
        batch = 4 * batch_size * seqlen * (8 * size.hidden + size.heads * seqlen + 2 * size.vocab * logits)
        need = size.outside * width + block + activations + batch
        if kind == "blocks+weights":
            need += 3 * (size.total - size.outside)
        elif kind == "headroom":
            # linears that share an input share its deviations: summing every linear's inputs bounds them
            deviations = 8 * samples * size.block_inputs * size.blocks
            scoring = 4 * size.total + 2 * 4 * seqlen * size.vocab
            need += deviations + 4 * (size.total - size.outside) + scoring
    mib = BASE_MIB + HEADROOM * need / 2**20
    return int(256 * math.ceil(mib / 256))


#: glibc's M_MMAP_THRESHOLD (malloc.h)
_M_MMAP_THRESHOLD = -3


def unmap_freed_tensors(threshold: int = 1 << 20) -> bool:
    """Make glibc serve every allocation of ``threshold`` bytes or more (tensors) with its own
    mmap, returned to the system when freed. By default glibc raises that threshold to the size
    of the largest block freed so far (up to 32 MiB) and reuses the heap for such blocks; a
    process that computes whole-model masks one after another then grows by heap fragments that
    are free but cannot be returned (measured peak RSS of a ``privacy membership-shared`` game:
    32 x 512 tokens 12.5 GB, 0.84 GB with this call; 2 x 512 tokens 2.7-3.3 GB, 0.63 GB), far
    beyond what :data:`HEADROOM` allows. It costs time, since every such tensor is mapped and
    zeroed afresh (a whole-model mask of 32 x 512 tokens: 203 s against 139 s, medians of 4
    interleaved), so only analyses that compute many masks in one process call it. Returns
    False where the C library has no ``mallopt`` (not glibc: macOS's allocator returns large
    blocks by itself)."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))


@dataclass(frozen=True)
class MeasuredRun:
    returncode: int
    peak_rss_mib: float  # the command's own peak resident set (plus at most a bare python's)
    cpu_seconds: float
    seconds: float


# A fresh, small process starts the command: the kernel carries the peak RSS of the process a
# command was forked from into the command's own ru_maxrss (exec records the old memory map's
# high-water mark), so spawning it from a large process (pytest, a benchmark driver) would
# report that process's memory as the command's.
_LAUNCHER = """
import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump([os.waitstatus_to_exitcode(status), usage.ru_maxrss, usage.ru_utime + usage.ru_stime], out)
"""


def measured_run(argv: list[str], **popen_kwargs) -> MeasuredRun:
    """Run ``argv`` to its end (``popen_kwargs``: stdout, stderr, env, cwd as for Popen) and
    return its exit code, its own peak RSS as the kernel counted it (``ru_maxrss``), its CPU
    seconds and wall seconds. How large the calling process is does not matter."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "usage.json"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-c", _LAUNCHER, str(result), *argv], check=True, **popen_kwargs)
        seconds = time.perf_counter() - start
        returncode, maxrss_kib, cpu = json.loads(result.read_text())
    return MeasuredRun(returncode, maxrss_kib / 1024, cpu, seconds)
