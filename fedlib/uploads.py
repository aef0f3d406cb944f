"""What a site uploads: its mask file (FedPrLLM: one-shot, or one round of iterative FedPrLLM) or
its weight file (FedSpaLLM), computed on its private tokens.

``fedlib client-mask`` / ``fedlib client-weights`` and the Flower ClientApp (``flower/``) both
call these functions, so an upload is the same bytes whichever transport carries it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from fedlib.client import Pruning
from fedlib.models import ModelHandle


def write_client_mask(
    handle: ModelHandle,
    ids: torch.Tensor | None,
    out: Path,
    pruning: Pruning,
    *,
    client_id: str,
    format_version: int = 1,
    round_index: int | None = None,
    global_masks: Path | None = None,
    scale: bool = False,
    dp=None,
    dp_noise_seed: int | None = None,
    allow_seeded_noise: bool = False,
    dtype: str = "float32",
) -> int:
    """Write this client's mask file ``out``, pruned as ``pruning`` says: every block (one-shot),
    or block ``round_index`` only (a round of iterative FedPrLLM: its input goes through the
    server's ``global_masks`` file of the earlier blocks, scaled with ``scale``). ``dp`` (a
    :class:`fedlib.dp.gaussian.DPTarget` or :class:`fedlib.dp.public.PublicDP`) makes it a
    DP Wanda mask: its noise from the OS's cryptographic generator, or, only with
    ``allow_seeded_noise``, from ``dp_noise_seed`` (a simulation, not private: x_dp says so).
    Returns the blocks computed."""
    from fedlib.client import prune_locally
    from fedlib.maskcode import MagnitudeReference
    from fedlib.maskfile import MaskWriter
    from fedlib.methods import method_allocation

    layers = handle.layers()
    if round_index is not None:
        layers = [info for info in layers if info.block == round_index]
        if not layers:
            raise ValueError(f"--round {round_index}: the model has blocks 0..{handle.n_blocks - 1}")
    elif global_masks or scale:
        raise ValueError("--previous-global and --scale belong to a round of iterative FedPrLLM (give --round)")
    method = pruning.method  # the registered name the file records (DP computes with its own class)
    extra = {"method_options": json.dumps(pruning.options), "dtype": dtype}
    mechanism = None  # a DP client's (fedlib.dp.gaussian.DPTarget or fedlib.dp.public.PublicDP)
    if dp is not None and dp.enabled:
        from fedlib.dp.samplers import NoiseSource
        from fedlib.dp.unit import WINDOW

        if round_index is not None or pruning.options:
            raise ValueError("--dp-epsilon: DP masks are one-shot Wanda without method options (no --round: "
                             "composition over rounds is not accounted)")
        if dp_noise_seed is not None and not allow_seeded_noise:
            raise ValueError("--dp-noise-seed: whoever knows the seed can subtract the noise, so the mask would not "
                             "be private; a simulation adds --dp-allow-seeded-noise (x_dp then says noise 'seeded')")
        if dp.unit.kind == WINDOW and not allow_seeded_noise:
            raise ValueError("--dp-epsilon: a site's release protects a document, a span or the client (calibration "
                             "windows cut by fedlib calibration-pool --unit, or --dp-unit client); one window is a "
                             "simulation's unit (--dp-allow-seeded-noise)")
        noise = NoiseSource(dp_noise_seed)
        if dp.shared:
            raise ValueError("--dp-mechanism distributed is the federation's secure sum, not one client's mask "
                             "(fedlib privacy dp-federation simulates it)")
        mechanism, guarantee = dp, replace(dp.guarantee([info.name for info in layers]), noise=noise.mode)
        extra["dp"] = guarantee.header()
        print(f"DP: {guarantee.header()}")
    with MaskWriter(
        Path(out), layers, fingerprint=handle.fingerprint(), role="client", client_id=client_id,
        method=method, group=pruning.group, sparsity=pruning.sparsity, allocation=method_allocation(method),
        n_samples=0 if ids is None else ids.shape[0], seed=pruning.seed, extra=extra,
        format_version=format_version, reference=MagnitudeReference.of_model(handle) if format_version == 2 else None,
    ) as writer:
        if mechanism is not None:
            mechanism.client_masks(handle, ids, pruning, noise=noise,
                                   sink=lambda _b, decision: [writer.add(n, m) for n, m in decision.masks.items()])
            return handle.n_blocks
        if round_index is None:
            # masks go to the file block by block: a 7B client never holds all of them
            prune_locally(handle, ids, pruning, keep=False,
                          on_block=lambda _i, decision: [writer.add(n, m) for n, m in decision.masks.items()])
            return handle.n_blocks
        for name, mask in _iterative_round_masks(handle, ids, round_index, pruning, global_masks, scale).items():
            writer.add(name, mask)
    return round_index + 1


def _iterative_round_masks(handle, ids, round_index, pruning, global_masks, scale) -> dict[str, torch.Tensor]:
    """Block ``round_index``'s masks of iterative FedPrLLM, its input through the global masks
    (and, with ``scale``, the scale factors) of the earlier blocks."""
    from fedlib.federation import iterative_client
    from fedlib.maskfile import MaskFile, MaskFileError
    from fedlib.server.fedprllm import scale_factors

    settled = [info for info in handle.layers() if info.block < round_index]
    masks, factors = {}, {}
    if settled:
        if not global_masks:
            raise ValueError(f"--round {round_index}: give --previous-global, the server's file of rounds "
                             f"0..{round_index - 1}")
        current = MaskFile(Path(global_masks), handle.fingerprint(), settled, whole_model=False)
        if current.header.role != "global":
            raise MaskFileError(global_masks, "role", f"expected 'global', got {current.header.role!r}")
        masks = current.masks()
        if scale:
            if not current.has_votes():
                raise MaskFileError(global_masks, "votes", "--scale needs the global file's vote counts")
            factors = {info.name: scale_factors(current.layer_votes(info.name, masks[info.name]),
                                                current.header.n_clients)
                       for info in settled}
    elif global_masks:
        raise ValueError("--round 0 starts from the dense model: no --previous-global")
    return iterative_client(handle, ids, round_index, pruning, global_masks=masks, factors=factors)


def write_client_weights(
    handle: ModelHandle,
    ids: torch.Tensor,
    out: Path,
    pruning: Pruning,
    *,
    blocks: Sequence[int],
    client_id: str,
    round_index: int,
    weight_dtype: str = "float16",
    global_weights: Path | None = None,
) -> list[int]:
    """Write this FedSpaLLM client's weight file ``out``: the ``blocks`` the server assigned,
    pruned as ``pruning`` says from the server's ``global_weights`` file (dense where it has none).
    Returns the blocks."""
    from fedlib.federation import fedspallm_client
    from fedlib.weightfile import WeightFileWriter, open_weight_file

    layers, base = handle.layers(), handle.fingerprint()
    blocks = sorted(set(int(b) for b in blocks))
    if not blocks or blocks[0] < 0 or blocks[-1] >= handle.n_blocks:
        raise ValueError(f"--blocks {blocks}: the model has blocks 0..{handle.n_blocks - 1}")
    masks, weights = {}, {}
    if global_weights:
        # the current global state of the assigned blocks (Algorithm 1, line 6); others stay dense
        current = open_weight_file(Path(global_weights), base, layers)
        for info in layers:
            if info.block in blocks and current.has_layer(info.name):
                masks[info.name] = current.layer_mask(info.name)
                weights[info.name] = current.layer_weight(info.name, masks[info.name])
    mine = [info for info in layers if info.block in blocks]
    with WeightFileWriter(
        Path(out), mine, fingerprint=base, role="client", client_id=client_id, method=pruning.method,
        group=pruning.group, sparsity=pruning.sparsity, n_samples=ids.shape[0], seed=pruning.seed,
        weight_dtype=weight_dtype, round_index=round_index,
    ) as writer:
        fedspallm_client(handle, ids, blocks, pruning, global_weights=weights, global_masks=masks, keep=False,
                         on_block=lambda _i, upload: [writer.add_layer(n, m, upload.weights[n])
                                                      for n, m in upload.masks.items()])
    return blocks
