"""The audit's positive control (fedlib.privacy.control): the white-box release audit
(fedlib.privacy.stages.dp_release) must catch a DP client whose noise is calibrated to a sensitivity
10x too small, and must not accuse the honest one; its ceiling is above the claimed ε, so the check
can fail (unlike the 32-target membership game, whose ceiling is 2.10)."""

from __future__ import annotations

import math

import pytest
import torch

from fedlib.privacy.control import NoNoise, UnderstatedSensitivity
from fedlib.dp.gaussian import DPTarget
from fedlib.privacy.stages.dp_release import attention_inputs, release_audit


@pytest.fixture(scope="module")
def population():
    return torch.randint(0, 128, (40, 8), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("epsilon", [1.0, 2.0])
def test_broken_mechanism_fails_the_audit_honest_one_passes(model, population, epsilon):
    honest = release_audit(model, population, DPTarget(epsilon, 1e-5, 1.0), blocks=1)
    broken = release_audit(model, population, UnderstatedSensitivity(epsilon, 1e-5, 1.0, factor=10.0), blocks=1)
    for result in (honest, broken):
        assert result["ceiling"] > epsilon  # the game is large enough to refute the claim
        assert json_epsilon(result) == epsilon  # both claim the same ε
    assert honest["audit"]["epsilon_lb"] <= epsilon
    assert broken["audit"]["epsilon_lb"] > epsilon  # the control fails, as it must
    assert broken["noise_std"] == pytest.approx(honest["noise_std"] / 10)
    # the audited pair moves the sum by at most the mechanism's L2 sensitivity sqrt(2) * clip
    assert 0 < honest["shift"] <= math.sqrt(2) * 1.0 + 1e-12


def test_a_mechanism_whose_sampler_adds_no_noise_fails_the_audit(model, population):
    """The audit draws its releases through the mechanism's own noise path: an honest guarantee
    over a sampler that returns zeros is caught (every member scores the shift, every non-member
    0: the bound reaches the game's ceiling), the same guarantee over the real sampler is not."""
    target = DPTarget(1.0, 1e-5, 1.0)
    silent = release_audit(model, population, target, blocks=1, noise=NoNoise(0))
    assert silent["audit"]["epsilon_lb"] > 1.0 and silent["audit"]["epsilon_lb"] == pytest.approx(silent["ceiling"])
    assert silent["audit"]["fp"] == 0 and silent["audit"]["fn"] == 0
    honest = release_audit(model, population, target, blocks=1)
    assert honest["audit"]["epsilon_lb"] <= 1.0


def test_the_audited_release_is_the_pruners(model, population):
    """The DP pruner's noisy sum is the clipped sum plus the seeded source's draw times the
    guarantee's noise std, clamped at 0 (computed here by hand), and :func:`noisy_release`, which
    the audit attacks, gives it draw for draw."""
    from fedlib.dp.gaussian import clipped_sample_sum, dp_method, input_key, noisy_release
    from fedlib.dp.samplers import NoiseSource
    from fedlib.models import block_linears, decoder_blocks, prunable_layers

    names = [info.name for info in prunable_layers(model) if info.block < 1]
    name = next(n for n in names if n.endswith("self_attn.q_proj"))
    pruner_class, guarantee = dp_method("wanda", DPTarget(1.0, 1e-5, 1.0), names, NoiseSource(7))
    pruner = pruner_class(block_linears(decoder_blocks(model)[0])["self_attn.q_proj"], name)
    inputs = attention_inputs(model, population[:6])
    pruner.add_batch(inputs)
    draw = NoiseSource(7).normal(tuple(pruner.sq_sum.shape), "dp-noise", input_key(name))
    assert guarantee.noise_std > 0 and draw.abs().sum() > 0
    assert torch.equal(pruner.noisy_sum(), (clipped_sample_sum(inputs, 1.0) + draw * guarantee.noise_std).clamp_min(0))
    assert torch.equal(noisy_release(pruner.sq_sum, guarantee, NoiseSource(7), "dp-noise", input_key(name)),
                       pruner.noisy_sum())


def json_epsilon(result: dict) -> float:
    import json

    return json.loads(result["guarantee"])["epsilon"]


def test_the_audited_statistic_is_the_mechanisms(model, population):
    """The release audited is the attention input of block 0, as a forward hook on q_proj sees it
    inside the whole model's forward pass (an independent capture)."""
    from fedlib.models import block_linears, decoder_blocks

    seen = []
    q = block_linears(decoder_blocks(model)[0])["self_attn.q_proj"]
    handle = q.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    with torch.no_grad():
        model(population[:5])
    handle.remove()
    assert torch.equal(attention_inputs(model, population[:5]), seen[0])


def test_control_must_understate():
    with pytest.raises(ValueError, match="factor must be > 1"):
        UnderstatedSensitivity(1.0, 1e-5, 1.0, factor=1.0)


def test_the_controls_table_names_what_each_row_can_show(model, population):
    """release_audit_with_controls (the privacy_dp target's release audit): at a claim below the
    game's ceiling the honest client stays within it and the noiseless control is caught (every
    member above every non-member: its bound is the ceiling); at a claim above the ceiling
    (computed here from the evaluated counts, as a perfect attack's bound) every row says it
    cannot fail, whatever its bound."""
    from fedlib.privacy.membership import epsilon_ceiling
    from fedlib.privacy.stages.dp_release import release_audit_with_controls

    record = release_audit_with_controls(model, population, [40.0, 1.0], 1e-5, 1.0, trials=400, factor=10.0)
    rows = {(r["claimed"]["epsilon"], r["mechanism"]): r for r in record["rows"]}
    assert list(rows) == [(e, m) for e in (1.0, 40.0) for m in ("honest", "understated", "no-noise")]
    for row in record["rows"]:
        evaluated = row["audit"]["tp"] + row["audit"]["fn"], row["audit"]["fp"] + row["audit"]["tn"]
        assert evaluated == (200, 200)
        assert row["ceiling"] == pytest.approx(epsilon_ceiling(*evaluated, 0.95, 1e-5))
    assert 1.0 < rows[1.0, "honest"]["ceiling"] < 40.0
    assert rows[1.0, "honest"]["audit"]["epsilon_lb"] <= 1.0 and rows[1.0, "honest"]["verdict"] == "within claim"
    assert rows[1.0, "no-noise"]["verdict"] == "caught"
    assert rows[1.0, "no-noise"]["audit"]["epsilon_lb"] == pytest.approx(rows[1.0, "no-noise"]["ceiling"])
    # the exact ε of the audited release for the pair: none without noise; the honest bound stays under it
    assert rows[1.0, "no-noise"]["pair_epsilon"] is None
    honest = rows[1.0, "honest"]
    assert honest["audit"]["epsilon_lb"] <= honest["pair_epsilon"] < 1.0
    understated = rows[1.0, "understated"]
    assert understated["pair_epsilon"] > honest["pair_epsilon"]
    assert understated["verdict"] == ("invisible in one release" if understated["pair_epsilon"] <= 1.0 else
                                      "caught" if understated["audit"]["epsilon_lb"] > 1.0 else "NOT CAUGHT")
    assert {rows[40.0, m]["verdict"] for m in ("honest", "understated", "no-noise")} == {"cannot fail"}


def test_the_release_audit_refuses_a_claim_that_is_not_a_finite_positive_epsilon():
    from fedlib.privacy_cli import _claimed_epsilon

    assert _claimed_epsilon("2") == 2.0
    for bad in ("0", "inf", "-1", "x"):
        with pytest.raises(Exception, match="ε"):
            _claimed_epsilon(bad)
