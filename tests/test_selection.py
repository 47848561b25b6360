import re

import pytest
import torch
from torch import nn

import hookscope
from hookscope import HookscopeError, SelectionError, layers


def tree() -> nn.Module:
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()),
        nn.Sequential(nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4), nn.ReLU()),
        nn.Flatten(),
    )


def names(pairs):
    return [n for n, _ in pairs]


def test_every_kind_of_selector_in_module_order():
    m = tree()
    assert names(layers(m, "1.0")) == ["1.0"]
    assert names(layers(m, "*.0")) == ["0.0", "1.0"]
    assert names(layers(m, "re:1\\.[01]")) == ["1.0", "1.1"]
    assert names(layers(m, re.compile(r"0\..*"))) == ["0.0", "0.1"]
    assert names(layers(m, nn.ReLU)) == ["0.1", "1.2"]
    assert names(layers(m, (nn.Conv2d, nn.BatchNorm2d))) == ["0.0", "1.0", "1.1"]
    assert names(layers(m, m[1][1])) == ["1.1"]
    assert names(layers(m, lambda n, mod: n.endswith("2"))) == ["1.2", "2"]
    # order follows the model, not the selectors; lists flatten; duplicates collapse
    assert names(layers(m, ["2", "0.0"], "0.0")) == ["0.0", "2"]


def test_no_selector_means_every_module_but_the_root():
    m = tree()
    assert names(layers(m)) == [n for n, _ in m.named_modules() if n]


def test_root_is_selectable_by_empty_name():
    m = tree()
    assert layers(m, "") == [("", m)]


def test_unknown_name_lists_the_closest_real_names():
    m = nn.Sequential()
    m.add_module("encoder", nn.Sequential())
    m.encoder.add_module("conv1", nn.Conv2d(1, 1, 1))
    with pytest.raises(SelectionError) as err:
        layers(m, "encoder.conv2")
    msg = str(err.value)
    assert "'encoder.conv2'" in msg and "'encoder.conv1'" in msg and "\n" not in msg
    with pytest.raises(SelectionError, match="encoder.conv1"):
        layers(m, "conv1")  # a leaf name alone still finds its full name


def test_bad_third_selector_fails_whole_selection():
    m = tree()
    with pytest.raises(SelectionError, match="nn.Linear|Linear"):
        layers(m, "0.0", "1.0", nn.Linear)


def test_selector_of_wrong_type_is_named():
    with pytest.raises(SelectionError, match="3.5 \\(float\\) is not a selector"):
        layers(tree(), 3.5)


def test_an_invalid_regular_expression_is_a_selection_error_and_leaves_nothing_registered():
    m = tree()
    with pytest.raises(SelectionError, match=r"selector 're:\(' is not a valid regular expression \(missing \)"):
        layers(m, "0.0", "re:(")
    with pytest.raises(SelectionError, match="not a valid regular expression"):
        hookscope.trace(m, "0.0", "re:[")
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in m.modules())


def test_non_module_is_refused():
    with pytest.raises(HookscopeError, match="expected a torch.nn.Module, got dict"):
        layers({"a": 1}, "a")


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_torchscript_is_refused_with_the_fix():
    scripted = torch.jit.script(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(HookscopeError, match="TorchScript"):
        hookscope.capture(scripted, "0")


def test_wrappers_are_seen_through_and_prefixed_names_accepted():
    inner = tree()
    dp = nn.DataParallel(inner)
    assert names(layers(dp, "1.0")) == ["1.0"]
    assert names(layers(dp, "module.1.0")) == ["1.0"]
    compiled = torch.compile(inner)  # lazy: nothing is compiled until it is called
    assert names(layers(compiled, "_orig_mod.0.0", "1.1")) == ["0.0", "1.1"]
    assert hookscope.unwrap(nn.DataParallel(compiled))[1] == "module._orig_mod."


def test_a_module_reachable_under_two_names_is_keyed_by_the_name_selected():
    # issue 9, item 16: selected as 'b', it was recorded as 'a' and rec['b'] said "did you mean 'a'"
    act = nn.ReLU()
    m = nn.Module()
    m.a = act
    m.b = act
    assert names(layers(m, "b")) == ["b"]
    assert names(layers(m, "a")) == ["a"]
    assert names(layers(m, "a", "b")) == ["a"]  # selected once, by its first name
    assert hookscope.names(m) == ["a"]


def test_empty_selections_are_refused():
    with pytest.raises(SelectionError, match="selection is empty"):
        layers(tree(), [])
    with pytest.raises(SelectionError, match="no submodules.*''"):
        hookscope.capture(nn.Linear(2, 2))
    assert names(layers(nn.Linear(2, 2), "")) == [""]
