"""Job sizes from checkpoint headers (fedlib.jobsize), against counts taken from the model
itself and against what a real client job uses."""

import subprocess
import sys

import pytest
import torch

from fedlib.data import save_tokens
from fedlib.jobsize import BASE_MIB, HEADROOM, host_mem_mb, measured_run, model_size, tokens_in

from conftest import tiny_llama


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    model = tiny_llama(layers=3, hidden=64)
    folder = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(folder, max_shard_size="100KB")  # several shards + index
    assert (folder / "model.safetensors.index.json").is_file()
    return model, folder


def test_model_size_counts_what_the_model_holds(sharded):
    model, folder = sharded
    blocks = [sum(p.numel() for p in block.parameters()) for block in model.model.layers]
    total = sum(p.numel() for p in model.parameters())
    size = model_size(folder)
    assert size.total == total and size.block == max(blocks)
    assert size.outside == total - sum(blocks)
    assert size.layer == max(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert (size.hidden, size.heads, size.vocab, size.stored_bytes) == (64, 4, 128, 4)
    linears = [m for m in model.model.layers[0].modules() if isinstance(m, torch.nn.Linear)]
    assert (size.blocks, size.block_inputs) == (len(model.model.layers), sum(m.in_features for m in linears))


def test_estimates_grow_with_what_the_job_holds(sharded, tmp_path):
    _, folder = sharded
    small, large = tmp_path / "small.safetensors", tmp_path / "large.safetensors"
    save_tokens(small, torch.zeros(2, 16, dtype=torch.long))
    save_tokens(large, torch.zeros(4000, 512, dtype=torch.long))
    assert tokens_in([small, large]) == (2 * 16 + 4000 * 512, 512)
    few, many = (host_mem_mb(folder, "blocks", tokens=tokens_in([p])) for p in (small, large))
    assert BASE_MIB <= few < many and few % 256 == 0
    # 2M tokens x hidden 64 x 4 bytes, in and out: 1 GB of activations on top
    assert many - few >= 2 * 4000 * 512 * 64 * 4 / 2**20
    assert host_mem_mb(folder, "blocks", "bfloat16", tokens_in([large])) < many
    with pytest.raises(ValueError, match="kind must be one of"):
        host_mem_mb(folder, "everything")


def test_the_headroom_analysis_asks_for_what_it_keeps_across_blocks(sharded, tmp_path):
    """On top of the block runner: float64 deviations of every sample at every linear's input
    of every block, the blocks' float32 weights and the scoring model (counted from the model)."""
    model, folder = sharded
    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.zeros(50_000, 16, dtype=torch.long))
    tokens = tokens_in([calib])
    inputs = sum(m.in_features for block in model.model.layers for m in block.modules()
                 if isinstance(m, torch.nn.Linear))
    block_weights = sum(p.numel() for p in model.model.layers.parameters())
    kept = 8 * 50_000 * inputs + 4 * block_weights + 4 * sum(p.numel() for p in model.parameters())
    extra = host_mem_mb(folder, "headroom", tokens=tokens) - host_mem_mb(folder, "blocks", tokens=tokens)
    # both estimates are rounded up to 256 MiB, times the same headroom factor
    assert abs(extra - HEADROOM * kept / 2**20) <= 256


@pytest.mark.slow
def test_a_client_job_stays_within_its_estimate(sharded, tmp_path):
    """A real `fedlib client-mask` process, its peak RSS read from the kernel."""
    _, folder = sharded
    calib = tmp_path / "calib.safetensors"
    save_tokens(calib, torch.randint(0, 128, (8, 64)))
    with open(tmp_path / "stderr", "w+") as stderr:
        run = measured_run([sys.executable, "-m", "fedlib", "client-mask", "--model", str(folder), "--calib",
                            str(calib), "--device", "cpu", "--out", str(tmp_path / "m.mask.safetensors")],
                           stdout=subprocess.DEVNULL, stderr=stderr)
    assert run.returncode == 0, (tmp_path / "stderr").read_text()
    assert run.peak_rss_mib <= host_mem_mb(folder, "blocks", tokens=tokens_in([calib]))


def test_a_measured_run_counts_the_command_not_its_caller():
    """ru_maxrss of a process forked from a large one starts at the large one's peak: the
    launcher keeps the caller's memory out, and a command's own allocation still counts."""
    ballast = torch.ones(256 * 2**20 // 4)  # 256 MiB in this (the calling) process
    code = "import sys; b = bytearray({} * 2**20); b[::4096] = b'x' * len(b[::4096])"
    small = measured_run([sys.executable, "-c", code.format(1)])
    large = measured_run([sys.executable, "-c", code.format(300)])
    assert small.returncode == large.returncode == 0
    assert small.peak_rss_mib < 100 and 300 <= large.peak_rss_mib < 400
    assert measured_run([sys.executable, "-c", "raise SystemExit(3)"]).returncode == 3
    del ballast


# Blocks of 2 MiB freed between small survivors: the heap fragments a process computing mask
# after mask leaves behind. Prints the resident MiB left after freeing them.
_FRAGMENTS = """
import sys, torch
from fedlib.jobsize import unmap_freed_tensors
if sys.argv[1] == "capped":
    assert unmap_freed_tensors()
def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
torch.ones(1 << 19).sum()  # freeing a 2 MiB block raises glibc's dynamic threshold to it
before = rss_mib()
big, kept = [], []
for _ in range(200):
    big.append(torch.ones(1 << 19))  # 2 MiB, touched
    kept.append(torch.ones(1 << 12))  # 16 KiB survivor after it
del big
print(rss_mib() - before)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_tensors_go_back_to_the_system():
    def left(mode):
        out = subprocess.run([sys.executable, "-c", _FRAGMENTS, mode], capture_output=True, text=True, check=True)
        return float(out.stdout)

    default, capped = left("default"), left("capped")
    if default < 200:
        pytest.skip(f"this C library returned the fragments by itself ({default:.0f} MiB left of 400)")
    assert capped < 50, f"{capped:.0f} MiB of 400 freed MiB still resident (without the call: {default:.0f})"
