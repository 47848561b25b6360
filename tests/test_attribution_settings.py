"""Each attribution method's own settings: ``method=`` a name or a settings object, the flat keywords as
shorthands giving the very same tensors, and every setting a method does not read refused in one line
(the pairs built from the method table, so that a new method is covered as it joins)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.attribution import TOKEN_METHODS, readers, settings_of
from hookscope.analysis.attribution._methods import SETTINGS, TABLE
from hookscope.errors import SettingError

from helpers import no_hooks

# a value for every setting some method reads, none of them the default (None means "not given")
VALUES: dict[str, Any] = {"baseline": 0.25, "steps": 4, "rule": "gausslegendre", "samples": 3, "noise": 0.2,
                          "seed": 5, "batch_size": 2, "memory": 10**9, "composite": "epsilon_plus",
                          "canonize": False, "bounds": (0.0, 1.0), "window": (2, 2), "stride": 1,
                          "features": "channels", "kernel_width": 0.5, "distance": "euclidean", "alpha": 0.5,
                          "progress": False}
NOT_READ = [(m, s) for m in TABLE for s in SETTINGS if s not in settings_of(m)]


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()


def _x() -> torch.Tensor:
    return torch.rand(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))


def _state(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in net.state_dict().items()}


def test_every_setting_has_a_value_here_and_every_method_a_class():
    assert set(VALUES) == set(SETTINGS)
    for name, family in TABLE.items():
        assert family.settings.name == name and family.settings() == family.settings()
        assert hookscope.analysis.attribution.__dict__[family.settings.__name__] is family.settings


@pytest.mark.parametrize("method", list(TABLE))
def test_the_object_the_name_and_the_flat_keywords_give_the_same_tensors(method):
    net, x = _net(), _x()
    own = {k: VALUES[k] for k in settings_of(method)}
    cls = TABLE[method].settings
    by_name = hookscope.attribute(net, x, method=method, target=1)
    by_default = hookscope.attribute(net, x, method=cls(), target=1)
    assert torch.equal(by_name.maps, by_default.maps) and by_name.settings == by_default.settings
    flat = hookscope.attribute(net, x, method=method, target=1, **own)
    made = hookscope.attribute(net, x, method=cls(**own), target=1)
    both = hookscope.attribute(net, x, method=cls(**own), target=1, **own)  # the same values twice: no conflict
    for r in (made, both):
        assert torch.equal(r.maps, flat.maps) and r.settings == flat.settings and r.forwards == flat.forwards
        assert (r.delta is None) == (flat.delta is None) and (r.delta is None or torch.equal(r.delta, flat.delta))
    if own:  # the settings change the maps: they were read
        assert not torch.equal(flat.maps, by_name.maps)
    assert no_hooks(net)


@pytest.mark.parametrize(("method", "setting"), NOT_READ, ids=[f"{m}-{s}" for m, s in NOT_READ])
def test_every_setting_a_method_does_not_read_is_refused_naming_who_reads_it(method, setting):
    net = _net()
    before = _state(net)
    reading = readers(setting)
    said = (f"{setting}= is not a setting of {method} ({', '.join(reading)} read{'s' if len(reading) == 1 else ''} "
            f'it); drop it or use method="{reading[0]}"')
    for given in (method, TABLE[method].settings()):
        with pytest.raises(SettingError) as e:
            hookscope.attribute(net, _x(), method=given, **{setting: VALUES[setting]})
        assert str(e.value) == said
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items()) and no_hooks(net)


def test_the_message_of_the_brief_example():
    with pytest.raises(hookscope.HookscopeError) as e:
        hookscope.attribute(_net(), _x(), method="saliency", steps=5)
    assert str(e.value) == ('steps= is not a setting of saliency (integrated_gradients reads it); drop it or use '
                            'method="integrated_gradients"')
    assert isinstance(e.value, TypeError)  # as Python's own refusal of a keyword


@pytest.mark.parametrize(("given", "flat", "said"), [
    (hookscope.IntegratedGradients(steps=8), {"steps": 16}, "steps=16 conflicts with method=IntegratedGradients(steps=8"),
    (hookscope.SmoothGrad(noise=0.3), {"noise": 0.2}, "noise=0.2 conflicts with method=SmoothGrad("),
    (hookscope.LRP(canonize=False), {"canonize": True}, "canonize=True conflicts with method=LRP("),
    (hookscope.IntegratedGradients(baseline=torch.zeros(3, 6, 6)), {"baseline": torch.ones(3, 6, 6)},
     "baseline=tensor(3x6x6, float32) conflicts"),
])
def test_an_object_and_a_flat_setting_with_another_value_are_refused(given, flat, said):
    with pytest.raises(SettingError, match=r"give \w+ in one place") as e:
        hookscope.attribute(_net(), _x(), method=given, **flat)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_the_same_value_said_another_way_is_no_conflict():
    net, x = _net(), _x()
    ig = hookscope.IntegratedGradients(steps=4, rule="gausslegendre", baseline=torch.zeros(3, 6, 6))
    again = hookscope.attribute(net, x, method=ig, rule="Gauss-Legendre", baseline=torch.zeros(3, 6, 6), target=0)
    assert torch.equal(again.maps, hookscope.attribute(net, x, method=ig, target=0).maps)
    noisy = hookscope.SmoothGrad(samples=2, noise=1.0)  # an int and a float of one value are one value
    assert torch.equal(hookscope.attribute(net, x, method=noisy, noise=1, target=0).maps,
                       hookscope.attribute(net, x, method=noisy, target=0).maps)
    with pytest.raises(hookscope.HookscopeError, match="canonize=1 must be True or False"):  # checked as the object is
        hookscope.attribute(net, x, method=hookscope.LRP(canonize=True), canonize=1)


@pytest.mark.parametrize(("typo", "near"), [("stpes", "'steps'"), ("metod", "'method'"), ("compsite", "'composite'"),
                                            ("target_class", "'target'")])
def test_a_misspelt_keyword_gets_a_did_you_mean(typo, near):
    with pytest.raises(SettingError) as e:
        hookscope.attribute(_net(), _x(), **{typo: 5})
    text = str(e.value)
    assert text.startswith(f"attribute() got an unexpected keyword argument {typo!r}. Did you mean {near}")
    assert "kwargs=" in text and "\n" not in text


def test_a_misspelt_method_keeps_its_did_you_mean_and_a_class_is_not_an_object():
    with pytest.raises(hookscope.HookscopeError, match="Did you mean 'integrated_gradients'"):
        hookscope.attribute(_net(), _x(), method="integrated_gradient")
    with pytest.raises(SettingError, match=r"method=IntegratedGradients is the class; pass IntegratedGradients\(\)"):
        hookscope.attribute(_net(), _x(), method=hookscope.IntegratedGradients)
    with pytest.raises(hookscope.HookscopeError, match="method=3 is not an attribution method"):
        hookscope.attribute(_net(), _x(), method=3)


@pytest.mark.parametrize(("make", "said"), [
    (lambda: hookscope.IntegratedGradients(steps=1), "steps=1 is too few for rule='riemann_trapezoid'"),
    (lambda: hookscope.IntegratedGradients(rule="simpson"), "rule='simpson' is not an integration rule"),
    (lambda: hookscope.IntegratedGradients(baseline="zeros"), "baseline= is a str"),
    (lambda: hookscope.SmoothGrad(samples=0), "samples=0 must be a positive int"),
    (lambda: hookscope.VarGrad(noise=float("nan")), "noise=nan must be a finite number >= 0"),
    (lambda: hookscope.SmoothGradSq(seed=1.5), "seed=1.5 must be an int"),
    (lambda: hookscope.SmoothGrad(batch_size=True), "batch_size=True must be a positive int"),
    (lambda: hookscope.IntegratedGradients(memory=0), "memory=0 must be positive"),
    (lambda: hookscope.LRP(composite="epsilon_pluss"), "Did you mean 'epsilon_plus'"),
    (lambda: hookscope.LRP(canonize=1), "canonize=1 must be True or False"),
    (lambda: hookscope.LRP(bounds=1.0), "bounds=1.0 must be a pair"),
])
def test_a_settings_object_checks_its_values_when_made(make, said):
    with pytest.raises(hookscope.HookscopeError) as e:
        make()
    assert said in str(e.value) and "\n" not in str(e.value)


def test_settings_objects_are_frozen_keyword_only_and_compare_by_value():
    ig = hookscope.IntegratedGradients(steps=8, baseline=torch.zeros(3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ig.steps = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        hookscope.IntegratedGradients(8)  # type: ignore[misc]
    assert ig == hookscope.IntegratedGradients(steps=8, baseline=torch.zeros(3))
    assert ig != hookscope.IntegratedGradients(steps=8, baseline=torch.ones(3))
    assert hookscope.SmoothGrad() != hookscope.SmoothGradSq() and hookscope.Saliency() != hookscope.Gradient()
    assert len({hookscope.SmoothGrad(), hookscope.SmoothGrad(), hookscope.VarGrad()}) == 2
    assert repr(hookscope.IntegratedGradients(rule="riemann-left")) == (
        "IntegratedGradients(steps=50, rule='riemann_left', baseline=None, batch_size=64, memory=None)")
    assert dataclasses.replace(ig, steps=4).steps == 4 and ig.steps == 8


def test_the_flat_keywords_are_the_settings_of_the_table_and_nothing_else():
    import inspect
    params = inspect.signature(hookscope.attribute).parameters
    flat = [n for n in params if n not in ("model", "inputs", "method", "target", "layers", "kwargs", "unknown")]
    assert sorted(flat) == sorted(SETTINGS)
    assert all(params[n].default is None for n in flat)  # None: not given, the method's own default


# --- attribute_tokens: the methods of token ids, the same settings -------------------------------------
def _lm() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 7))


IDS = torch.tensor([[1, 2, 3], [4, 5, 6]])
TOKEN_NOT_READ = [(m, s) for m in TOKEN_METHODS for s in ("steps", "rule", "baseline", "batch_size")
                  if s not in settings_of(m)]


@pytest.mark.parametrize(("method", "setting"), TOKEN_NOT_READ, ids=[f"{m}-{s}" for m, s in TOKEN_NOT_READ])
def test_attribute_tokens_refuses_a_setting_its_method_does_not_read(method, setting):
    value = {"baseline": 0}.get(setting, VALUES[setting])
    with pytest.raises(SettingError) as e:
        hookscope.attribute_tokens(_lm(), IDS, method=method, target=2, **{setting: value})
    assert str(e.value) == (f"{setting}= is not a setting of {method} (integrated_gradients reads it); drop it or "
                            'use method="integrated_gradients"')


def test_attribute_tokens_takes_the_object_and_gives_what_the_flat_keywords_give():
    lm = _lm()
    flat = hookscope.attribute_tokens(lm, IDS, target=2, steps=4, rule="gausslegendre", baseline=0, batch_size=3)
    made = hookscope.attribute_tokens(lm, IDS, target=2, method=hookscope.IntegratedGradients(
        steps=4, rule="gausslegendre", baseline=0, batch_size=3))
    assert all(torch.equal(a.scores, b.scores) and a.delta == b.delta for a, b in zip(flat.rows, made.rows))
    assert made.settings == flat.settings == {"steps": 4, "rule": "gausslegendre", "baseline": "token 0"}
    plain = hookscope.attribute_tokens(lm, IDS, target=2, method=hookscope.InputXGradient())
    assert torch.equal(plain.rows[0].scores, hookscope.attribute_tokens(lm, IDS, target=2,
                                                                         method="input_x_gradient").rows[0].scores)
    with pytest.raises(SettingError, match="steps=8 conflicts"):
        hookscope.attribute_tokens(lm, IDS, target=2, method=hookscope.IntegratedGradients(steps=4), steps=8)
    with pytest.raises(hookscope.HookscopeError, match="method=SmoothGrad.. is not a token attribution method"):
        hookscope.attribute_tokens(lm, IDS, target=2, method=hookscope.SmoothGrad())
    with pytest.raises(SettingError, match="unexpected keyword argument 'stesp'. Did you mean 'steps'"):
        hookscope.attribute_tokens(lm, IDS, target=2, stesp=4)
    assert no_hooks(lm)
