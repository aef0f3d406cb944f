"""The layer-by-layer recursion and the local methods against direct computations."""

import copy

import pytest
import torch

from fedlib.groups import prune_lowest
from fedlib.methods import get_method
from fedlib.methods.wanda import wanda_scores
from fedlib.models import UnsupportedModelError, block_linears, fingerprint, prunable_layers
from fedlib.client import Pruning, prune_locally
from fedlib.runner import BlockRunner


def test_blockwise_dense_pass_equals_full_forward(model):
    ids = torch.randint(0, 128, (5, 16))
    with torch.no_grad():
        full = model(ids, output_hidden_states=True)
    hidden = full.hidden_states
    runner = BlockRunner(model, [ids], batch_size=2, final_outputs=True)  # uneven batches on purpose
    torch.testing.assert_close(torch.cat(runner.states[0]), hidden[0], rtol=0, atol=0)
    for step in runner.steps():
        step.propagate(0)
        if step.index == 0:
            torch.testing.assert_close(torch.cat(runner.states[0]), hidden[1], rtol=1e-6, atol=1e-6)
    # the model's last hidden state is after the final norm
    torch.testing.assert_close(model.model.norm(torch.cat(runner.states[0])), hidden[2], rtol=1e-5, atol=1e-5)
    # the model's own head on the last block's outputs: the full forward's logits
    torch.testing.assert_close(torch.cat(list(runner.logits(0))), full.logits, rtol=1e-5, atol=1e-5)


def _inputs_of_linears(model, ids):
    """Inputs of every linear, captured from an ordinary full forward of ``model``."""
    captured = {}

    def hook(name):
        def record(_module, inputs, _output):
            captured[name] = inputs[0].detach()
        return record

    handles = [
        module.register_forward_hook(hook(name))
        for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
    ]
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return captured


def test_wanda_masks_against_direct_recursive_computation(model):
    """Block 0's masks come from dense inputs; block 1's from inputs through block 0 pruned."""
    ids = torch.randint(0, 128, (3, 12))
    result = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0))
    pruned_model = copy.deepcopy(model)
    reference = {}
    for block in range(2):
        inputs = _inputs_of_linears(pruned_model, ids)
        for info in prunable_layers(model):
            if info.block != block:
                continue
            x = inputs[info.name].reshape(-1, info.shape[1]).double()
            weight = dict(model.named_modules())[info.name].weight.detach()
            scores = weight.abs() * (x.pow(2).mean(0)).sqrt().float()
            reference[info.name] = prune_lowest(scores, 0.5, "row", 0, info.name)
            with torch.no_grad():
                dict(pruned_model.named_modules())[info.name].weight[reference[info.name]] = 0
    assert reference.keys() == result.masks.keys()
    for name in reference:
        assert torch.equal(reference[name], result.masks[name]), name
    # the base model is untouched
    assert fingerprint(model) != fingerprint(pruned_model)
    assert all((m.weight != 0).all() for m in block_linears(model.model.layers[0]).values())


def test_wanda_scores_formula():
    weight = torch.tensor([[1.0, -2.0], [-3.0, 0.5]])
    pruner = get_method("wanda")(torch.nn.Linear(2, 2, bias=False), "x")
    pruner.layer.weight.data = weight
    pruner.add_batch(torch.tensor([[[1.0, 2.0]], [[3.0, 0.0]]]))
    # mean over tokens of x^2: [5, 2]
    expected = weight.abs() * torch.tensor([[5.0, 2.0]]).sqrt()
    torch.testing.assert_close(pruner.scores(), expected)
    torch.testing.assert_close(wanda_scores(weight, torch.tensor([5.0, 2.0])), expected)


def test_magnitude_needs_no_data_and_groups_apply(model):
    result = prune_locally(model, None, Pruning("magnitude", 0.5, "layer", 0))
    for info in prunable_layers(model):
        weight = dict(model.named_modules())[info.name].weight.detach()
        assert torch.equal(result.masks[info.name], prune_lowest(weight.abs(), 0.5, "layer", 0, info.name))


@pytest.mark.parametrize("group", ["row", "column", "layer", "2:4"])
def test_local_groups_give_exact_sparsity(model, group):
    ids = torch.randint(0, 128, (2, 8))
    masks = prune_locally(model, ids, Pruning("wanda", 0.5, group, 0)).masks
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total // 2


def test_deterministic(model):
    ids = torch.randint(0, 128, (2, 8))
    a = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0)).masks
    b = prune_locally(model, ids, Pruning("wanda", 0.5, "row", 0)).masks
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_unknown_architecture_and_method(model):
    model.config.model_type = "unknownformer"
    with pytest.raises(UnsupportedModelError, match="unknownformer"):
        prunable_layers(model)
    with pytest.raises(ValueError, match="unknown pruning method"):
        get_method("nope")


def test_a_method_plugs_in_through_the_declared_points(model):
    """A new method is a class: its allocate_block ratios reach the masks, with no registry
    entry and no change to the loop (checked against counts computed here)."""
    from fedlib.client import Pruning, prune_locally
    from fedlib.groups import pruned_count
    from fedlib.methods import LayerPruner

    class FirstLayerHeavier(LayerPruner):
        name = "first_layer_heavier"
        allocation = "nonuniform"

        def scores(self):
            return self.layer.weight.detach().abs().float()

        @classmethod
        def allocate_block(cls, step, client, pruners, sparsity, group, seed, options):
            names = list(pruners)
            return {n: (0.75 if i == 0 else sparsity) for i, n in enumerate(names)}

    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    result = prune_locally(model, ids, Pruning(FirstLayerHeavier, 0.5, "layer", 0))
    firsts = {name for name in result.masks if name.endswith("q_proj")}
    for name, mask in result.masks.items():
        expected = pruned_count(mask.numel(), 0.75 if name in firsts else 0.5)
        assert int(mask.sum()) == expected, name
