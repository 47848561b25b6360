"""One result protocol and one vocabulary across every analysis (issue 10).

Every public result: ``table()`` (also ``str()``), ``to_dict()``, ``to_json(indent=None)`` on one line
that round-trips through ``json.loads`` to ``to_dict()``'s JSON form, ``rows`` where tabular, and
name lookups that raise a ``KeyError``-compatible hookscope error with ``in`` agreeing. Every public
function refuses an unknown keyword with one line. The tables below must name every public result
type and every public callable, so a new one cannot arrive without its row.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope import metrics
from hookscope.core.result import jsonable
from hookscope.zoo import TinyResNet

from helpers import no_hooks

PUBLIC = {n: getattr(m, n) for m in (hookscope, metrics) for n in m.__all__}
RESULT_TYPES = {n: o for n, o in PUBLIC.items() if inspect.isclass(o) and hasattr(o, "to_json")}
LOOKUP_TYPES = {n for n, o in RESULT_TYPES.items() if hasattr(o, "__getitem__")}
# classes hookscope hands out and users only read (rows, records, the object edit() returns)
HANDED_OUT = {"CamRow", "DiffRow", "StatRow", "CurveRow", "CallRecord", "GradRecord", "LayerRecord", "Unmatched",
              "Edit", "FeatureRow", "ComparisonRow", "LayerArray"}
CALLED = {n for n, o in PUBLIC.items() if callable(o) and n not in RESULT_TYPES and n not in HANDED_OUT
          and not (inspect.isclass(o) and issubclass(o, BaseException))}

# a case is a public result type, and after a colon the kind of run it comes from
RESULT_CASES = ["Capture", "Recording: a module called twice", "Recording: keep='input'", "Trace", "Watch",
                "TensorGrads", "GradientFlow", "Summary", "Diff", "CamResult", "Curve", "FeatureMaps",
                "ReferenceComparison", "PruneResult", "ChannelPruning", "Groups", "Importance", "Comparison", "Store"]
LOOKUPS = [  # case, a name it holds, a name it does not
    ("Capture", "fc", "fcc"),
    ("Recording: a module called twice", "fc", "fcc"),
    ("Recording: keep='input'", "fc", "fcc"),
    ("Trace", "fc", "fcc"),
    ("Watch", "fc", "fcc"),  # the last calls watched: fc runs last
    ("Summary", "fc", "fcc"),
    ("GradientFlow", "fc", "fcc"),
    ("Diff", "fc", "fcc"),
    ("TensorGrads", "y", "z"),
    ("PruneResult", "fc", "fcc"),
    ("Importance", "stem.2", "fcc"),
    ("Comparison", "parameters", "params"),
    ("Store", "fc", "fcc"),
]
# to_json's options that write all of to_dict(): CamResult writes its maps as shape and dtype unless asked
FULL_JSON: dict[str, dict[str, Any]] = {"CamResult": {"maps": True}, "FeatureMaps": {"maps": True},
                                        "ReferenceComparison": {"maps": True}}


def _kind(case: str) -> str:
    return case.split(":")[0]


@pytest.fixture(scope="module")
def net() -> nn.Module:
    torch.manual_seed(0)
    return TinyResNet().eval()


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _captures(net: nn.Module, x: torch.Tensor) -> dict[str, object]:
    with hookscope.capture(net, "layer1.0.conv1", "fc") as rec:
        net(x)
    with hookscope.capture(net, "fc") as twice:
        net(x)
        net(x)
    with hookscope.capture(net, "fc", keep="input") as inputs:
        net(x)
    return {"Capture": rec, "Recording: a module called twice": twice, "Recording: keep='input'": inputs}


@pytest.fixture(scope="module")
def results(net: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    x = _x()
    with hookscope.trace(net, "fc", "layer1") as t:
        net(x)
    with hookscope.watch(net) as w:
        net(x)
    xg = x.clone().requires_grad_(True)
    y = net(xg)
    with hookscope.grads(y=y) as g:
        y.sum().backward()
    net.zero_grad()
    net(x).sum().backward()
    flow = hookscope.gradient_flow(net)
    net.zero_grad(set_to_none=True)
    res = hookscope.cam(net, x, layers="layer2")
    curve = metrics.deletion(net, x, res.maps, steps=4)
    assert no_hooks(net)
    return {
        **_captures(net, x), "Trace": t, "Watch": w, "TensorGrads": g, "GradientFlow": flow,
        "Summary": hookscope.summary(net, x), "Diff": hookscope.diff(net, net, x), "CamResult": res, "Curve": curve,
        "FeatureMaps": hookscope.feature_maps(net, x, "layer1"),
        "ReferenceComparison": hookscope.compare_references(net, x, "layer1.0.bn1"),
        **_pruning(net, x),
        "Store": hookscope.extract(net, x, "layer1", "fc", reduce="mean", out=tmp_path_factory.mktemp("store") / "s"),
    }


def _pruning(net: nn.Module, x: torch.Tensor) -> dict[str, object]:
    masked, channels = copy.deepcopy(net), copy.deepcopy(net)
    chosen = hookscope.prune_channels(channels, x[:1], amount=0.5)
    return {"PruneResult": hookscope.prune(masked, amount=0.3), "ChannelPruning": chosen,
            "Groups": hookscope.channel_groups(net, x[:1]),
            "Importance": hookscope.channel_importance(net, x, {"stem.2": 1}),
            "Comparison": hookscope.compare_models(net, hookscope.compact(channels, x[:1]), x, repeats=1, warmup=0)}


def test_the_tables_name_every_public_result_type(results):
    assert {_kind(c) for c in RESULT_CASES} == set(RESULT_TYPES), "a public result type without a row"
    assert {_kind(c) for c, _, _ in LOOKUPS} == LOOKUP_TYPES, "a result with lookups without a row"
    assert set(results) == set(RESULT_CASES)
    for case, r in results.items():
        assert isinstance(r, RESULT_TYPES[_kind(case)]), case


@pytest.mark.parametrize("case", RESULT_CASES)
def test_every_result_has_a_table_that_is_its_str(results, case):
    r = results[case]
    text = r.table()
    assert isinstance(text, str) and text and str(r) == text
    if hasattr(type(r), "rows"):
        assert isinstance(r.rows, list) and r.rows


@pytest.mark.parametrize("case", RESULT_CASES)
def test_every_result_has_to_dict(results, case):
    assert isinstance(results[case].to_dict(), dict)


@pytest.mark.parametrize("case", RESULT_CASES)
def test_every_result_writes_one_line_of_json_by_default(results, case):
    r = results[case]
    text = r.to_json()
    assert "\n" not in text and text == r.to_json(indent=None)
    assert isinstance(json.loads(text), (dict, list))
    assert json.loads(r.to_json(indent=2)) == json.loads(text)


@pytest.mark.parametrize("case", RESULT_CASES)
def test_to_json_is_to_dict_as_json(results, case):
    r = results[case]
    assert r.to_json(**FULL_JSON.get(case, {})) == json.dumps(jsonable(r.to_dict()), allow_nan=False)


@pytest.mark.parametrize("case, good, bad", LOOKUPS)
def test_lookups_raise_a_key_error_and_in_agrees(results, case, good, bad):
    r = results[case]
    assert good in r and r[good] is not None
    assert bad not in r
    for name in (good, bad, "", "layer1", f"module.{good}", 0, None):
        try:
            r[name]
        except KeyError as e:
            assert name not in r, name
            assert isinstance(e, hookscope.HookscopeError) and "\n" not in str(e), name
        else:
            assert name in r, name


def _calls(net: nn.Module) -> dict[str, Callable[..., object]]:
    x, maps, masks = _x(), torch.rand(2, 32, 32), torch.ones(2, 32, 32, dtype=torch.bool)
    return {
        "capture": lambda **kw: hookscope.capture(net, "fc", **kw),
        "edit": lambda **kw: hookscope.edit(net, "fc", output=hookscope.scale(1.0), **kw),
        "scale": lambda **kw: hookscope.scale(1.0, **kw),
        "ablate": lambda **kw: hookscope.ablate(0, **kw),
        "grads": lambda **kw: hookscope.grads(y=torch.ones(2, requires_grad=True) * 2, **kw),
        "trace": lambda **kw: hookscope.trace(net, **kw),
        "watch": lambda **kw: hookscope.watch(net, **kw),
        "summary": lambda **kw: hookscope.summary(net, x, **kw),
        "diff": lambda **kw: hookscope.diff(net, net, x, **kw),
        "settings": lambda **kw: hookscope.settings(**kw),
        "Settings": lambda **kw: hookscope.Settings(**kw),
        "cam": lambda **kw: hookscope.cam(net, x, **kw),
        "feature_maps": lambda **kw: hookscope.feature_maps(net, x, "layer1", **kw),
        "compare_references": lambda **kw: hookscope.compare_references(net, x, "layer1", **kw),
        "channels_first": lambda **kw: hookscope.channels_first(torch.zeros(1, 2, 2, 3), **kw),
        "channels_last": lambda **kw: hookscope.channels_last(torch.zeros(1, 3, 2, 2), **kw),
        "tokens_to_grid": lambda **kw: hookscope.tokens_to_grid(**kw),
        "gradient_flow": lambda **kw: hookscope.gradient_flow(net, **kw),
        "layers": lambda **kw: hookscope.layers(net, "fc", **kw),
        "names": lambda **kw: hookscope.names(net, **kw),
        "unwrap": lambda **kw: hookscope.unwrap(net, **kw),
        "At": lambda **kw: hookscope.At((slice(None), -1), **kw),
        "Retention": lambda **kw: hookscope.Retention(**kw),
        "deletion": lambda **kw: metrics.deletion(net, x, maps, **kw),
        "insertion": lambda **kw: metrics.insertion(net, x, maps, **kw),
        "pointing_game": lambda **kw: metrics.pointing_game(maps, masks, **kw),
        "energy_pointing_game": lambda **kw: metrics.energy_pointing_game(maps, masks, **kw),
        "box_mask": lambda **kw: metrics.box_mask([[0, 0, 2, 2]], 4, 4, **kw),
        "blur": lambda **kw: metrics.blur(torch.rand(1, 3, 8, 8), **kw),
        "prune": lambda **kw: hookscope.prune(copy.deepcopy(net), amount=0.1, **kw),
        "remove_masks": lambda **kw: hookscope.remove_masks(copy.deepcopy(net), **kw),
        "sparsity": lambda **kw: hookscope.sparsity(net, **kw),
        "prune_channels": lambda **kw: hookscope.prune_channels(copy.deepcopy(net), x[:1], amount=0.1, **kw),
        "compact": lambda **kw: hookscope.compact(net, x[:1], **kw),
        "channel_groups": lambda **kw: hookscope.channel_groups(net, x[:1], **kw),
        "channel_importance": lambda **kw: hookscope.channel_importance(net, x, nn.ReLU, **kw),
        "compare_models": lambda **kw: hookscope.compare_models(net, net, x, repeats=1, warmup=0, **kw),
        "extract": lambda **kw: hookscope.extract(net, x, "fc", out="/nonexistent/never-written", **kw),
        "open_store": lambda **kw: hookscope.open_store("/nonexistent", **kw),
        "load": lambda **kw: hookscope.load("/nonexistent", **kw),
        "load_model": lambda **kw: hookscope.load_model("tiny", **kw),
        "load_weights": lambda **kw: hookscope.load_weights(net, "/nonexistent/w.pt", **kw),
        "class_names": lambda **kw: hookscope.class_names("demo", **kw),
    }


def test_the_table_of_calls_names_every_public_callable():
    assert set(_calls(nn.Linear(1, 1))) == CALLED, "a public function or class without a row"


@pytest.mark.parametrize("fn", list(_calls(nn.Linear(1, 1))))
def test_every_public_callable_refuses_an_unknown_keyword(net, fn):
    with pytest.raises((TypeError, hookscope.HookscopeError)) as e:
        _calls(net)[fn](dpeth=2)
    assert "dpeth" in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(net)
