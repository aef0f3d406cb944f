"""Stage: a white-box audit of one release of the DP client mechanism (:mod:`fedlib.dp.gaussian`),
the audit that its positive control (:mod:`fedlib.privacy.control`) must fail.

The mechanism releases, per distinct linear input, the sum of the samples' clipped per-channel
statistics plus Gaussian noise. Replacing one sample (target t for other o) moves the sum by
Δ = clip(v_t) − clip(v_o) whatever the other samples are. The auditor picks the worst pair it
can find and draws each trial's release through the mechanism's own code
(:func:`fedlib.dp.gaussian.noisy_release`: its noise source, its noise std, its clamp), so a
mechanism that adds less noise than its guarantee says, or none, is what the audit sees. Its
score, the projection of the release minus v_o on Δ/|Δ|, is the Neyman–Pearson statistic of
the pair before the clamp. Each trial is a fresh noise draw of the release, so the game can be
large for the price of one forward pass: ``trials`` per world, the threshold chosen on half
(among non-member quantiles), the ε lower bound on the other half
(:func:`fedlib.privacy.membership.audit_epsilon`), beside its ceiling.

Only the first decoder block's attention input is audited: its statistic comes from the dense
forward pass, so it is exactly the mechanism's. It is one of the mechanism's ``releases``
Gaussian releases, so a bound on it is a lower bound for the whole mask (post-processing of all
of them); for an honest mechanism it stays well below the proven ε (one release of many).
"""

from __future__ import annotations

import numpy as np
import torch

#: the false-positive rates whose non-member quantiles are the candidate thresholds
THRESHOLD_FPRS = (0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001)


def attention_inputs(model, rows: torch.Tensor) -> torch.Tensor:
    """The first decoder block's attention input (what q/k/v_proj read) for every row of token
    ids: (rows, tokens, channels), from a dense forward pass stopped after that block."""
    from fedlib.models import block_linears, decoder_blocks

    q_proj = block_linears(decoder_blocks(model)[0])["self_attn.q_proj"]
    seen: list[torch.Tensor] = []

    class _Stop(Exception):
        pass

    def hook(_module, args):
        seen.append(args[0].detach())
        raise _Stop

    handle = q_proj.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            model(rows)
    except _Stop:
        pass
    finally:
        handle.remove()
    return seen[0]


#: trials drawn at once (a trial is one release of the audited statistic)
CHUNK = 2048


def release_audit(model, population: torch.Tensor, dp, trials: int = 20000, blocks: int | None = None,
                  confidence: float = 0.95, seed: int = 0, noise=None, inputs: torch.Tensor | None = None) -> dict:
    """The white-box audit of the first block's attention-input release (module docstring) of the
    DP client ``dp`` (a :class:`fedlib.dp.gaussian.DPTarget`, or the broken control), accounted
    over ``blocks`` (``None``: every block, the released mechanism's guarantee), its noise from
    ``noise`` (a :class:`fedlib.dp.samplers.NoiseSource`; default seeded by ``seed``, so the
    audit repeats). The neighbours: the two ``population`` rows whose clipped statistics are
    farthest apart. ``inputs``: :func:`attention_inputs` of ``population``, where the caller
    audits several mechanisms on the same rows (one forward pass for all)."""
    from fedlib.dp.gaussian import clipped_sample_sum, gaussian_epsilon, noisy_release
    from fedlib.dp.samplers import NoiseSource, derive_seed
    from fedlib.models import prunable_layers
    from fedlib.privacy.membership import audit_ceilings, audit_epsilon, confusion_at_threshold, epsilon_lower_bound

    if trials < 4:
        raise ValueError(f"a release audit needs at least 4 trials per world, got {trials}")
    names = [info.name for info in prunable_layers(model) if blocks is None or info.block < blocks]
    guarantee = dp.guarantee(names)
    inputs = attention_inputs(model, population) if inputs is None else inputs
    vectors = torch.stack([clipped_sample_sum(inputs[i:i + 1], guarantee.clip) for i in range(inputs.shape[0])])
    distances = torch.cdist(vectors, vectors)
    t, o = divmod(int(torch.argmax(distances)), distances.shape[0])
    shift = float(distances[t, o])
    direction = (vectors[t] - vectors[o]) / shift
    noise = noise or NoiseSource(derive_seed(seed, "release-audit"))

    def scores(world: str, statistic: torch.Tensor) -> np.ndarray:
        out = []
        for start in range(0, trials, CHUNK):
            rows = min(CHUNK, trials - start)
            released = noisy_release(statistic.expand(rows, -1), guarantee, noise, "release-audit", world, start)
            out.append(((released - vectors[o]) @ direction).numpy())
        return np.concatenate(out)

    # the first half of each world chooses the threshold, the second is audited with it
    members, nonmembers = scores("member", vectors[t]), scores("non-member", vectors[o])
    half = trials // 2
    best, threshold = -1.0, 0.0
    for fpr in THRESHOLD_FPRS:  # candidate thresholds: non-member quantiles, not every score (CP is costly)
        # just above the quantile: non-members tied at it (a release without noise) stay out
        candidate = float(np.nextafter(np.quantile(nonmembers[:half], 1.0 - fpr), np.inf))
        eps = epsilon_lower_bound(*confusion_at_threshold(members[:half], nonmembers[:half], candidate),
                                  confidence, guarantee.delta)
        if eps > best:
            best, threshold = eps, candidate
    audit = audit_epsilon(members[half:], nonmembers[half:], confidence, guarantee.delta, threshold=threshold)
    evaluated = (audit["tp"] + audit["fn"], audit["fp"] + audit["tn"])
    # what this release really costs the pair: one Gaussian of sensitivity `shift` and the noise std it
    # draws with (the clamp at 0 is post-processing); unbounded where the source drew only zeros (every
    # non-member release the same)
    silent = np.ptp(nonmembers) == 0
    pair_epsilon = None if silent else gaussian_epsilon(guarantee.noise_std / shift, 1, guarantee.delta)
    return {
        "analysis": "dp_release", "claimed": {"epsilon": guarantee.epsilon, "delta": guarantee.delta},
        "guarantee": guarantee.header(), "release": "decoder block 0, attention input",
        "pair": [t, o], "shift": shift, "noise_std": guarantee.noise_std, "trials": trials,
        "pair_epsilon": pair_epsilon,
        "audit": audit, "ceiling": audit_ceilings(*evaluated, confidence, guarantee.delta)["lr1"],
    }


#: the mechanisms :func:`release_audit_with_controls` audits: the honest client and its two
#: positive controls (:mod:`fedlib.privacy.control`)
MECHANISMS = ("honest", "understated", "no-noise")


def release_audit_with_controls(model, population: torch.Tensor, epsilons, delta: float, clip: float,
                                trials: int, factor: float = 10.0, seed: int = 0, confidence: float = 0.95) -> dict:
    """:func:`release_audit` of the released mechanism (every block accounted) at each claimed ε,
    for the honest client and for its two positive controls: the client whose noise assumes a
    sensitivity ``factor`` times too small, and the honest client over a sampler that adds no
    noise. Each row's verdict says what the audit showed: for the honest client whether its bound
    stays at or below the claim; for a control whether the audit caught it (bound above the
    claim); and, where the game's ceiling is at or below the claim, that no attack could have
    refuted it at this size (the row then says nothing about the mechanism); for a control whose
    audited release alone stays within the claim (``pair_epsilon``, the exact ε of that release
    for the audited pair, at most the claim: the breakage spreads over releases this audit does
    not see), that no audit of this release could catch it."""
    from fedlib.dp.gaussian import DPTarget
    from fedlib.privacy.control import NoNoise, UnderstatedSensitivity

    rows, inputs = [], attention_inputs(model, population)
    for epsilon in sorted({float(e) for e in epsilons}):
        mechanisms = {"honest": (DPTarget(epsilon, delta, clip), None),
                      "understated": (UnderstatedSensitivity(epsilon, delta, clip, factor=factor), None),
                      "no-noise": (DPTarget(epsilon, delta, clip), NoNoise(0))}
        for name in MECHANISMS:
            dp, noise = mechanisms[name]
            result = release_audit(model, population, dp, trials=trials, confidence=confidence, seed=seed,
                                   noise=noise, inputs=inputs)
            bound, ceiling, exact = result["audit"]["epsilon_lb"], result["ceiling"], result["pair_epsilon"]
            if ceiling <= epsilon:
                verdict = "cannot fail"
            elif name == "honest":
                verdict = "within claim" if bound <= epsilon else "CLAIM REFUTED"
            elif exact is not None and exact <= epsilon:
                verdict = "invisible in one release"  # this release alone meets the claim: no audit of it can fail
            else:
                verdict = "caught" if bound > epsilon else "NOT CAUGHT"
            rows.append({**result, "mechanism": name, "verdict": verdict})
    return {"analysis": "dp_release", "factor": factor, "trials": trials, "confidence": confidence,
            "population": int(population.shape[0]), "tokens": int(population.shape[1]), "rows": rows}
