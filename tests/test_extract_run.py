"""Running an extract, each hostile case pinned: a resume that would mix two runs, rows silently
missing, samplers ignored, the probe changing row 0, and errors that were tracebacks."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import operator
import os
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hookscope
import hookscope.store
from hookscope.errors import HookscopeError

from extract_job import Samples, build
from helpers import no_hooks


def _unfinish(out: Path) -> None:
    """Make a finished store look like one a killed run left."""
    m = json.loads((out / "manifest.json").read_text())
    m["complete"] = False
    (out / "manifest.json").write_text(json.dumps(m))


def test_a_stream_that_grew_is_refused_instead_of_leaving_a_gap(tmp_path: Path) -> None:
    model, out = build(), tmp_path / "s"
    x = torch.stack([Samples(14)[i] for i in range(14)])
    shard = 3 * (16 * 4 + 8)  # three samples per shard
    hookscope.extract(model, iter(x[:10].split(2)), layers={"5": "max"}, out=out, shard_size=shard)
    _unfinish(out)
    with pytest.raises(HookscopeError, match="shard 3 holds 1 samples where the data gives 3"):
        hookscope.extract(model, iter(x.split(2)), layers={"5": "max"}, out=out, shard_size=shard, resume=True)


@pytest.mark.parametrize("change", ["function", "activation", "buffer", "later sample"])
def test_resume_refuses_what_would_mix_two_runs(tmp_path: Path, change: str) -> None:
    class Net(nn.Module):
        def __init__(self, act: nn.Module) -> None:
            super().__init__()
            self.lin, self.act = nn.Linear(4, 4), act
            self.register_buffer("shift", torch.zeros(4), persistent=False)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.act(self.lin(t) + self.shift)

    torch.manual_seed(0)
    model, data = Net(nn.ReLU()).eval(), torch.randn(40, 4)
    kw: dict[str, Any] = {"out": tmp_path / "s", "shard_size": 10 * (4 * 4 + 8), "batch_size": 5}
    hookscope.extract(model, data, layers={"act": lambda t: t * 1}, **kw)
    _unfinish(tmp_path / "s")
    how: Any = lambda t: t * 1  # noqa: E731  (the same name, other code below)
    if change == "function":
        how = lambda t: t * 2  # noqa: E731
    elif change == "activation":
        model = Net(nn.GELU()).eval()
        torch.manual_seed(0)
        model.lin = nn.Linear(4, 4)
    elif change == "buffer":
        model.shift += 1
    else:
        data = data.clone()
        data[30] += 1
    with pytest.raises(HookscopeError, match="cannot resume"):
        hookscope.extract(model, data, layers={"act": how}, resume=True, **kw)


@pytest.mark.parametrize("loader", [
    lambda d: torch.utils.data.DataLoader(d, batch_size=2, sampler=[3, 1, 4]),
    lambda d: torch.utils.data.DataLoader(d, batch_size=2, drop_last=True),
    lambda d: torch.utils.data.DataLoader(d, batch_sampler=[[0, 1], [5]]),
    lambda d: torch.utils.data.DataLoader(d, batch_size=2, sampler=torch.utils.data.SubsetRandomSampler([1, 2])),
])
def test_a_loader_whose_order_extract_cannot_follow_is_refused(tmp_path: Path, loader: Any) -> None:
    with pytest.raises(HookscopeError, match="cannot follow shard by shard"):
        hookscope.extract(build(), loader(Samples(7)), layers="5", out=tmp_path / "s")


def test_a_model_writing_into_its_input_does_not_change_row_0(tmp_path: Path) -> None:
    class Zeroing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            y = self.lin(t)
            t.zero_()
            return y

    data = torch.randn(4, 3)
    kept = data.clone()
    store = hookscope.extract(Zeroing().eval(), data, layers="lin", keep="input", out=tmp_path / "s")
    assert torch.equal(store["lin"][0], kept[0])


def test_former_tracebacks_are_one_line(tmp_path: Path) -> None:
    model = build()
    x = torch.stack([Samples(4)[i] for i in range(4)])
    for reduce, message in (("mean:5", "does not fit a tensor of shape"), ("mean:1,1", "names a dimension twice")):
        with pytest.raises(HookscopeError, match=message) as e:
            hookscope.extract(model, x, layers="3", reduce=reduce, out=tmp_path / "a")
        assert "\n" not in str(e.value)
    sizes = [torch.randn(3, 8 + i, 8) for i in range(4)]
    for workers in (0, 1):
        with pytest.raises(HookscopeError, match="cannot be put in one batch") as e:
            hookscope.extract(nn.Sequential(nn.Conv2d(3, 2, 3)).eval(), sizes, layers="0", reduce="mean", batch_size=2,
                              workers=workers, out=tmp_path / f"b{workers}")
        assert "\n" not in str(e.value)
    with pytest.raises(HookscopeError, match="dtype object"):
        hookscope.extract(model, np.array([None, 1], dtype=object), layers="3", out=tmp_path / "c")
    store = hookscope.extract(model, x, layers="5", ids=[10, 11, 12, 13], out=tmp_path / "d")  # ints become text
    assert store.ids == ["10", "11", "12", "13"]


def test_refused_outputs_leave_the_folder_free(tmp_path: Path) -> None:
    class Complex(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return torch.complex(t, t)

    model, out = nn.Sequential(nn.Linear(2, 2), Complex()).eval(), tmp_path / "s"
    with pytest.raises(HookscopeError, match="safetensors cannot hold"):
        hookscope.extract(model, torch.randn(3, 2), layers="1", out=out)
    store = hookscope.extract(model, torch.randn(3, 2), layers="0", out=out)  # no --overwrite needed
    assert store["0"].shape == (3, 2) and no_hooks(model)


def test_messages_name_the_right_thing(tmp_path: Path) -> None:
    model = build()
    with pytest.raises(HookscopeError, match="the model itself"):
        hookscope.extract(model, torch.randn(2, 3, 16, 16), layers="", out=tmp_path / "a")
    with pytest.raises(HookscopeError, match="device='meta' holds no values"):
        hookscope.extract(model, torch.randn(2, 3, 16, 16), layers="5", device="meta", out=tmp_path / "b")

    class Keywords(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Bilinear(2, 2, 2)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.inner(input1=t, input2=t)

    with pytest.raises(HookscopeError, match="keyword arguments only"):
        hookscope.extract(Keywords().eval(), torch.randn(3, 2), layers="inner", keep="input", out=tmp_path / "c")


def test_samples_attribute_without_paths_gives_no_ids(tmp_path: Path) -> None:
    class Pairs(torch.utils.data.Dataset[Any]):
        samples = [(torch.randn(3, 16, 16), 0) for _ in range(3)]

        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> Any:
            return self.samples[i]

    store = hookscope.extract(build(), Pairs(), layers="5", out=tmp_path / "s")
    assert store.ids == ["0", "1", "2"]


def test_a_failure_mid_run_says_the_shards_are_kept(tmp_path: Path) -> None:
    class Breaks(Samples):
        def __getitem__(self, i: int) -> torch.Tensor:
            if i == 30:
                raise OSError("disk went away")
            return super().__getitem__(i)

    shard = 12 * (16 * 4 + 8)
    with pytest.raises(HookscopeError, match="complete shards are kept.*resume"):
        hookscope.extract(build(), Breaks(40), layers={"5": "max"}, out=tmp_path / "s", shard_size=shard, batch_size=4)
    store = hookscope.extract(build(), Samples(40), layers={"5": "max"}, out=tmp_path / "s", shard_size=shard,
                              batch_size=4, resume=True)
    assert store.indices.tolist() == list(range(40))


def test_two_runs_never_write_one_folder_at_once(tmp_path: Path) -> None:
    out = tmp_path / "s"
    with hookscope.store.locked(out):  # another run holds the folder
        with pytest.raises(HookscopeError, match="being written by another run"):
            hookscope.extract(build(), torch.randn(3, 3, 16, 16), layers="5", out=out)
    store = hookscope.extract(build(), torch.randn(3, 3, 16, 16), layers="5", out=out)  # free again, lock gone
    assert store["5"].shape == (3, 16, 8, 8) and not (out / hookscope.store.LOCK_NAME).exists()


# second review -------------------------------------------------------------------------------------------
SCALE = 1.0


def _scaled(t: torch.Tensor) -> torch.Tensor:
    return t * SCALE


@pytest.mark.parametrize("change", ["method name", "global value", "module attribute", "method code"])
def test_resume_sees_code_globals_and_attributes(tmp_path: Path, change: str) -> None:
    global SCALE

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.k = nn.Linear(4, 4), 1.0

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.lin(t) * self.k

    torch.manual_seed(0)
    model, data = Scaled().eval(), torch.randn(40, 4)
    kw: dict[str, Any] = {"out": tmp_path / "s", "shard_size": 10 * (4 * 4 + 8), "batch_size": 5}
    how: Any = (lambda t: t.mean(1, keepdim=True)) if change == "method name" else _scaled
    hookscope.extract(model, data, layers={"lin": how}, **kw)
    _unfinish(tmp_path / "s")
    if change == "method name":
        how = lambda t: t.amax(1, keepdim=True)  # noqa: E731
    elif change == "global value":
        SCALE = 3.0
    elif change == "module attribute":
        model.k = 3.0
    else:
        Scaled.extra = lambda self: 3  # a method added to the class: its code is part of the model
    try:
        with pytest.raises(HookscopeError, match="cannot resume"):
            hookscope.extract(model, data, layers={"lin": how}, resume=True, **kw)
    finally:
        SCALE = 1.0


def test_one_layer_given_two_reductions_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HookscopeError, match="two reductions"):
        hookscope.extract(build(), torch.randn(2, 3, 16, 16), layers=[{"5": "mean"}, {"5": "max"}], out=tmp_path / "s")


def test_a_reduction_that_loses_the_samples_is_caught_by_the_probe(tmp_path: Path) -> None:
    out = tmp_path / "s"
    with pytest.raises(HookscopeError, match="must keep the samples as dimension 0"):
        hookscope.extract(build(), torch.randn(6, 3, 16, 16), layers={"8": hookscope.at[None]}, out=out)
    assert not (out / "manifest.json").exists()


def test_a_model_failure_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(hookscope.ForwardError, match="RuntimeError") as e:
        hookscope.extract(build(), torch.zeros(4, 3, 16, 16, dtype=torch.int64), layers="5", out=tmp_path / "s")
    assert "\n" not in str(e.value)


def test_a_failure_before_the_first_shard_leaves_the_folder_free(tmp_path: Path) -> None:
    class Late(Samples):
        def __getitem__(self, i: int) -> torch.Tensor:
            if i == 5:
                raise OSError("unreadable")
            return super().__getitem__(i)

    out = tmp_path / "s"
    with pytest.raises(HookscopeError, match="sample 5 cannot be read") as e:
        hookscope.extract(build(), Late(20), layers={"5": "max"}, out=out, batch_size=4)
    assert "resume" not in str(e.value)
    store = hookscope.extract(build(), Samples(20), layers={"5": "max"}, out=out, batch_size=4)  # no flag needed
    assert store["5"].shape == (20, 16)


# what a resume hashes: reductions and the model, wherever their behaviour hides -------------------------
class _Tokens(nn.Module):
    """N x 3 x 4 rows through a linear layer: a reduction over dimension 1 keeps N x 4."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.lin(t)


_TOKENS = torch.randn(40, 3, 4, generator=torch.Generator().manual_seed(1))
_KW: dict[str, Any] = {"shard_size": 10 * (4 * 4 + 8), "batch_size": 5}  # four shards of ten samples


def _killed(out: Path) -> None:
    """Make a finished four-shard store look like one a run killed after its first two shards left."""
    _unfinish(out)
    for shard in sorted((out / "shards").iterdir())[2:]:
        shard.unlink()


def _lin(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _Tokens()(t)


class _Scale:
    def __init__(self, k: float) -> None:
        self.k = k

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t[:, 0] * self.k


def _other_scale_class() -> type:
    class _Scale:  # the same name, other code
        def __init__(self, k: float) -> None:
            self.k = k

        def __call__(self, t: torch.Tensor) -> torch.Tensor:
            return t[:, 1] * self.k

    return _Scale


def _helper(t: torch.Tensor) -> torch.Tensor:
    return t[:, 0]


def _other_helper(t: torch.Tensor) -> torch.Tensor:
    return t[:, 1]


def _closing_over(opts: dict[str, float]) -> Any:
    return lambda t: t[:, 0] * opts["k"]


_W1, _W2 = torch.full((4,), 2.0), torch.full((4,), 3.0)
REDUCTIONS: dict[str, tuple[Any, Any]] = {
    "partial mean/amax": (lambda: functools.partial(torch.mean, dim=1), lambda: functools.partial(torch.amax, dim=1)),
    "partial keyword": (lambda: functools.partial(torch.mul, other=2.0), lambda: functools.partial(torch.mul, other=3.0)),
    "nested partial": (lambda: functools.partial(functools.partial(torch.sum, dim=1)),
                       lambda: functools.partial(functools.partial(torch.prod, dim=1))),
    "object state": (lambda: _Scale(2.0), lambda: _Scale(3.0)),
    "object code": (lambda: _Scale(2.0), lambda: _other_scale_class()(2.0)),
    "C function": (lambda: torch.abs, lambda: torch.neg),
    "tensor method": (lambda: torch.Tensor.abs, lambda: torch.Tensor.neg),
    "bound to a tensor": (lambda: _W1.mul, lambda: _W2.mul),
    "itemgetter": (lambda: operator.itemgetter((slice(None), 0)), lambda: operator.itemgetter((slice(None), 1))),
    "global helper": (lambda: lambda t: _helper(t), "swap helper"),
    "closure dict": (lambda: _closing_over({"k": 2.0}), lambda: _closing_over({"k": 3.0})),
}


@pytest.mark.parametrize("case", list(REDUCTIONS))
@pytest.mark.parametrize("given", ["mapping", "reduce="])
def test_resume_refuses_another_reduction_of_any_form(tmp_path: Path, case: str, given: str) -> None:
    global _helper
    first, second = REDUCTIONS[case]
    out, model = tmp_path / "s", _Tokens().eval()

    def run(how: Any, **kw: Any) -> hookscope.store.Store:
        if given == "mapping":
            return hookscope.extract(model, _TOKENS, layers={"lin": how}, out=out, **_KW, **kw)
        return hookscope.extract(model, _TOKENS, layers="lin", reduce=how, out=out, **_KW, **kw)

    run(first())
    _killed(out)
    kept = {p.name: p.read_bytes() for p in (out / "shards").iterdir()}
    saved = _helper
    try:
        if second == "swap helper":
            _helper, other = _other_helper, first()
        else:
            other = second()
        with pytest.raises(HookscopeError, match="cannot resume") as e:
            run(other, resume=True)
        assert "\n" not in str(e.value)
    finally:
        _helper = saved
    assert {p.name: p.read_bytes() for p in (out / "shards").iterdir()} == kept  # nothing of the other run written
    store = run(first(), resume=True)  # the same reduction, made anew, resumes and completes
    assert torch.equal(store["lin"][:], reducer_of(first())(_lin(_TOKENS)))


def reducer_of(fn: Any) -> Any:
    return hookscope.analysis.extract.reducer(fn)


def test_a_reduction_is_named_by_what_it_is(tmp_path: Path) -> None:
    names = {"a": functools.partial(torch.amax, dim=1), "b": torch.Tensor.abs, "c": operator.itemgetter((slice(None), 0)),
             "d": _Scale(2.0), "e": _helper}
    texts = {k: reducer_of(fn).text for k, fn in names.items()}
    assert texts == {"a": "fn:functools.partial(torch.amax, dim=1)", "b": "fn:TensorBase.abs",
                     "c": "fn:operator.itemgetter((slice(None, None, None), 0))", "d": f"fn:{__name__}._Scale",
                     "e": f"fn:{__name__}._helper"}
    store = hookscope.extract(_Tokens().eval(), _TOKENS[:6], layers={"lin": names["a"]}, out=tmp_path / "s")
    assert store.manifest["arrays"][0]["reduction"] == "fn:functools.partial(torch.amax, dim=1)"
    assert torch.equal(store["lin"][:], _lin(_TOKENS[:6]).amax(1))


def test_a_reduction_that_cannot_be_checked_warns_and_is_not_resumed(tmp_path: Path) -> None:
    opaque = np.frompyfunc(abs, 1, 1)  # a compiled callable found under no name
    how = lambda t: t[:, 0] if opaque is not None else t  # noqa: E731
    out = tmp_path / "s"
    with pytest.warns(UserWarning, match="could not be resumed if it stopped.*abs \\(vectorized\\)"):
        store = hookscope.extract(_Tokens().eval(), _TOKENS, layers={"lin": how}, out=out, **_KW)
    assert torch.equal(store["lin"][:], _lin(_TOKENS)[:, 0])
    _killed(out)
    with pytest.raises(HookscopeError, match="cannot resume .*the reduction fn:.*<lambda> of 'lin' cannot be compared "
                                             "with the run that began the store .*abs \\(vectorized\\).*"
                                             "functools.partial.*overwrite=True") as e:
        hookscope.extract(_Tokens().eval(), _TOKENS, layers={"lin": how}, out=out, resume=True, **_KW)
    assert "\n" not in str(e.value)


class Mode(enum.Enum):
    KEEP = 1
    DOUBLE = 2


@dataclasses.dataclass
class Inner:
    scale: float = 1.0


@dataclasses.dataclass
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)


def _scaler(k: float) -> Any:
    return lambda t: t * k


_OPTS = {"scale": 1.0}  # a global dict the model's forward reads


def _model_helper(y: torch.Tensor) -> torch.Tensor:
    return y * 1.0


def _other_model_helper(y: torch.Tensor) -> torch.Tensor:
    return y * 5.0


_first_model_helper = _model_helper


class Hidden(nn.Module):
    """A linear layer whose output is scaled by whatever ``how`` names, read in forward."""

    factor = 1.0

    def __init__(self, how: str, k: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.how = nn.Linear(4, 4), how
        values: dict[str, Any] = {
            "dict": {"scale": k}, "list of floats": [1.0, k], "nested dataclass": Outer(Inner(k)),
            "namespace": types.SimpleNamespace(scale=k), "enum": Mode.KEEP if k == 1.0 else Mode.DOUBLE,
            "dtype": torch.float32 if k == 1.0 else torch.float64, "numpy array": np.array([k]),
            "numpy scalar": np.float32(k), "tensor in a dict": {"w": torch.tensor([k])},
            "partial": functools.partial(torch.mul, other=k), "lambda": (lambda t: t * 1.0) if k == 1.0 else
            (lambda t: t * 5.0), "closure": _scaler(k), "set": {k}, "underscore": k, "deep": [[[[{"s": (k,)}]]]]}
        if how == "underscore":
            self._k = k
        elif how in values:
            self.value = values[how]

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        y, v, how = self.lin(t), getattr(self, "value", None), self.how
        if how in ("dict",):
            return y * v["scale"]
        if how in ("list of floats",):
            return y * v[1]
        if how == "nested dataclass":
            return y * v.inner.scale
        if how == "namespace":
            return y * v.scale
        if how == "enum":
            return y * v.value
        if how == "dtype":
            return y.to(v).float()  # the same values: the change is in the code path alone
        if how in ("numpy array", "numpy scalar"):
            return y * float(v if how == "numpy scalar" else v[0])
        if how == "tensor in a dict":
            return y * v["w"]
        if how in ("partial", "lambda", "closure"):
            return v(y)
        if how == "set":
            return y * next(iter(v))
        if how == "underscore":
            return y * self._k
        if how == "deep":
            return y * v[0][0][0][0]["s"][0]
        if how == "global dict":
            return y * _OPTS["scale"]
        if how == "global helper":
            return _model_helper(y)
        return y * self.factor


HIDING = ["dict", "list of floats", "nested dataclass", "namespace", "enum", "dtype", "numpy array", "numpy scalar",
          "tensor in a dict", "partial", "lambda", "closure", "set", "underscore", "deep", "class attribute",
          "forward hook", "global forward hook", "forward replaced", "global dict", "global helper"]


@pytest.mark.parametrize("how", HIDING)
def test_resume_refuses_a_model_changed_where_its_behaviour_hides(tmp_path: Path, how: str) -> None:
    global _model_helper
    out, data = tmp_path / "s", torch.randn(40, 4, generator=torch.Generator().manual_seed(2))
    first = Hidden(how, 1.0).eval()
    hookscope.extract(first, data, layers="lin", out=out, **_KW)
    _killed(out)
    kept = {p.name: p.read_bytes() for p in (out / "shards").iterdir()}
    changed = Hidden(how, 5.0).eval()
    handle = None
    if how == "class attribute":
        Hidden.factor = 5.0
    elif how == "forward hook":
        changed = Hidden(how, 1.0).eval()
        handle = changed.lin.register_forward_hook(lambda m, a, y: y * 5)
    elif how == "global forward hook":
        changed = Hidden(how, 1.0).eval()
        handle = nn.modules.module.register_module_forward_hook(lambda m, a, y: y * 5 if m is changed.lin else None)
    elif how == "forward replaced":
        changed = Hidden(how, 1.0).eval()
        changed.forward = types.MethodType(lambda self, t: self.lin(t) * 5, changed)  # type: ignore[method-assign]
    elif how == "global dict":
        _OPTS["scale"] = 5.0
    elif how == "global helper":
        _model_helper = _other_model_helper
    try:
        with pytest.raises(HookscopeError, match="cannot resume .*model"):
            hookscope.extract(changed, data, layers="lin", out=out, resume=True, **_KW)
    finally:
        Hidden.factor, _OPTS["scale"] = 1.0, 1.0
        _model_helper = _first_model_helper
        if handle is not None:
            handle.remove()
    assert {p.name: p.read_bytes() for p in (out / "shards").iterdir()} == kept
    store = hookscope.extract(Hidden(how, 1.0).eval(), data, layers="lin", out=out, resume=True, **_KW)  # rebuilt alike
    with torch.no_grad():
        assert torch.equal(store["lin"][:], first.lin(data))


def test_a_model_part_that_cannot_be_checked_warns_and_is_not_resumed(tmp_path: Path) -> None:
    out, model = tmp_path / "s", _Tokens().eval()
    model.fn = np.frompyfunc(abs, 1, 1)
    with pytest.warns(UserWarning, match="could not be resumed if it stopped: the model .*model.fn"):
        hookscope.extract(model, _TOKENS, layers="lin", out=out, **_KW)
    _killed(out)
    with pytest.raises(HookscopeError, match="cannot resume .*model.fn: abs \\(vectorized\\).*overwrite=True"):
        hookscope.extract(model, _TOKENS, layers="lin", out=out, resume=True, **_KW)


_DIGEST = '''
import dataclasses, enum, functools, sys, threading, types
import numpy as np, torch
from hookscope.analysis.extract._hash import code_hash, model_digest
class Mode(enum.Enum):
    A = 1
@dataclasses.dataclass
class Cfg:
    names: frozenset
    opts: dict
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 3)
        self.cfg = Cfg(frozenset({"alpha", "beta", "gamma", "delta"}), {"z": 1.0, "a": [1, 2], "m": Mode.A})
        self.tags = {"q", "w", "e", "r", "t", "y"}
        self.ns = types.SimpleNamespace(f=functools.partial(torch.mul, other=2.0), g=lambda t: t + 1)
        self.lock = threading.Lock()
        self.cycle = {"x": 1}
        self.cycle["self"] = self.cycle
        self.arr = np.arange(4.0)
        self.a, self.b, self.c = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3), torch.compile(torch.nn.Linear(3, 3))
        torch.nn.utils.parametrizations.weight_norm(self.a)  # classes made at run time, of one name
        torch.nn.utils.parametrize.register_parametrization(self.b, "weight", torch.nn.Identity())
    def forward(self, t):
        return self.lin(t)
print(model_digest(Net())[0]["structure_sha256"], code_hash(torch.compile(lambda t: t * 2))[0])
'''


def test_the_model_hash_is_the_same_in_every_process(tmp_path: Path) -> None:
    script = tmp_path / "digest.py"
    script.write_text(_DIGEST)
    found = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
        found.add(done.stdout.strip())
    assert len(found) == 1 and len(found.pop()) == 64 * 2 + 1


def test_digest_follows_containers_cycles_and_depth() -> None:
    from hookscope.analysis.extract._hash import Digest

    def digest(v: Any) -> tuple[str, list[str]]:
        d = Digest()
        d.add(v, "v")
        return d.hexdigest(), d.opaque

    cyclic: dict[str, Any] = {"a": 1}
    cyclic["self"] = cyclic
    assert digest(cyclic)[1] == [] and digest(cyclic) == digest(cyclic)
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})  # keys in a stable order
    assert digest([1.0, 2.0]) != digest([1.0, 5.0]) and digest((1.0,)) != digest([1.0])
    assert digest({1.0, 2.0})[0] == digest({2.0, 1.0})[0] and digest({1.0})[0] != digest({5.0})[0]
    assert digest(types.SimpleNamespace(a=1))[0] != digest(types.SimpleNamespace(a=2))[0]
    assert digest(torch.tensor([1.0]))[0] != digest(torch.tensor([2.0]))[0]
    assert digest(np.array([1.0]))[0] != digest(np.array([2.0]))[0]
    assert digest(torch.device("cpu"))[0] != digest(torch.device("meta"))[0]
    assert digest(threading.Lock())[0] == digest(threading.Lock())[0]  # nothing of it to see, and no address
    deep: list[Any] = []
    cur = deep
    for _ in range(40):
        cur.append([])
        cur = cur[0]
    assert "nested more than" in digest(deep)[1][0]
