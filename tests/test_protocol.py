"""One result protocol and one vocabulary across every analysis (issue 10).

Every public result: ``table()`` (also ``str()``), ``to_dict()``, ``to_json(indent=None)`` that
round-trips through ``json.loads``, ``rows`` where tabular, and name lookups that raise a
``KeyError``-compatible hookscope error with ``in`` agreeing. Every public function refuses an
unknown keyword with one line.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import hookscope
from hookscope.zoo import TinyResNet

from helpers import no_hooks


@pytest.fixture(scope="module")
def net() -> nn.Module:
    torch.manual_seed(0)
    return TinyResNet().eval()


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _results(net: nn.Module) -> dict[str, object]:
    x = _x()
    with hookscope.capture(net, "layer1.0.conv1", "fc") as rec:
        net(x)
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
    curve = hookscope.metrics.deletion(net, x, res.maps, steps=4)
    return {
        "Recording": rec, "Trace": t, "Watch": w, "TensorGrads": g, "GradientFlow": flow,
        "Summary": hookscope.summary(net, x), "Diff": hookscope.diff(net, net, x),
        "CamResult": res, "Curve": curve,
    }


def test_every_result_speaks_the_protocol(net):
    results = _results(net)
    assert set(results) == {"Recording", "Trace", "Watch", "TensorGrads", "GradientFlow", "Summary",
                            "Diff", "CamResult", "Curve"}
    for name, r in results.items():
        text = r.table()
        assert isinstance(text, str) and text and str(r) == text, name
        assert isinstance(r.to_dict(), dict), name
        for indent in (None, 2):
            assert isinstance(json.loads(r.to_json(indent=indent)), (dict, list)), name
        if name in ("Recording", "Trace", "Watch", "TensorGrads", "GradientFlow", "Summary", "Diff", "Curve"):
            assert isinstance(r.rows, list) and r.rows, name
    assert no_hooks(net)


@pytest.mark.parametrize("which, good, bad", [
    ("Recording", "fc", "fcc"),
    ("Diff", "fc", "fcc"),
    ("TensorGrads", "y", "z"),
])
def test_lookups_raise_a_key_error_and_in_agrees(net, which, good, bad):
    r = _results(net)[which]
    assert good in r and r[good] is not None
    assert bad not in r
    with pytest.raises(KeyError) as e:
        r[bad]
    assert isinstance(e.value, hookscope.HookscopeError) and "\n" not in str(e.value)


def _calls(net: nn.Module) -> dict[str, object]:
    x = _x()
    return {
        "capture": lambda **kw: hookscope.capture(net, "fc", **kw),
        "edit": lambda **kw: hookscope.edit(net, "fc", output=hookscope.scale(1.0), **kw),
        "trace": lambda **kw: hookscope.trace(net, **kw),
        "watch": lambda **kw: hookscope.watch(net, **kw),
        "summary": lambda **kw: hookscope.summary(net, x, **kw),
        "diff": lambda **kw: hookscope.diff(net, net, x, **kw),
        "cam": lambda **kw: hookscope.cam(net, x, **kw),
        "gradient_flow": lambda **kw: hookscope.gradient_flow(net, **kw),
        "settings": lambda **kw: hookscope.settings(**kw),
        "layers": lambda **kw: hookscope.layers(net, "fc", **kw),
        "deletion": lambda **kw: hookscope.metrics.deletion(net, x, torch.rand(2, 32, 32), **kw),
    }


@pytest.mark.parametrize("fn", list(_calls(nn.Linear(1, 1))))
def test_every_public_function_refuses_an_unknown_keyword(net, fn):
    with pytest.raises((TypeError, hookscope.HookscopeError)) as e:
        _calls(net)[fn](dpeth=2)
    assert "dpeth" in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(net)
