"""The bundled models draw their weights from a seed without touching the caller's random generator."""

import torch

from hookscope.zoo import DemoNet, TinyResNet


def test_building_a_seeded_model_leaves_the_global_generator_alone():
    for build in (TinyResNet, DemoNet):
        torch.manual_seed(123)
        expected = torch.rand(3)
        torch.manual_seed(123)
        build(seed=0)
        assert torch.equal(torch.rand(3), expected), build.__name__


def test_the_same_seed_gives_the_same_weights():
    a, b = TinyResNet(seed=3), TinyResNet(seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(TinyResNet(seed=4).fc.weight, a.fc.weight)
