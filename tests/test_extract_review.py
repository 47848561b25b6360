"""Findings of the hostile review of extract, each pinned: a resume that would mix two runs, rows silently
missing, samplers ignored, the probe changing row 0, and errors that were tracebacks."""

from __future__ import annotations

import json
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
    hookscope.extract(model, iter(x[:10].split(2)), {"5": "max"}, out=out, shard_size=shard)
    _unfinish(out)
    with pytest.raises(HookscopeError, match="shard 3 holds 1 samples where the data gives 3"):
        hookscope.extract(model, iter(x.split(2)), {"5": "max"}, out=out, shard_size=shard, resume=True)


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
    hookscope.extract(model, data, {"act": lambda t: t * 1}, **kw)
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
        hookscope.extract(model, data, {"act": how}, resume=True, **kw)


@pytest.mark.parametrize("loader", [
    lambda d: torch.utils.data.DataLoader(d, batch_size=2, sampler=[3, 1, 4]),
    lambda d: torch.utils.data.DataLoader(d, batch_size=2, drop_last=True),
    lambda d: torch.utils.data.DataLoader(d, batch_sampler=[[0, 1], [5]]),
    lambda d: torch.utils.data.DataLoader(d, batch_size=2, sampler=torch.utils.data.SubsetRandomSampler([1, 2])),
])
def test_a_loader_whose_order_extract_cannot_follow_is_refused(tmp_path: Path, loader: Any) -> None:
    with pytest.raises(HookscopeError, match="cannot follow shard by shard"):
        hookscope.extract(build(), loader(Samples(7)), "5", out=tmp_path / "s")


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
    store = hookscope.extract(Zeroing().eval(), data, "lin", keep="input", out=tmp_path / "s")
    assert torch.equal(store["lin"][0], kept[0])


def test_former_tracebacks_are_one_line(tmp_path: Path) -> None:
    model = build()
    x = torch.stack([Samples(4)[i] for i in range(4)])
    for reduce, message in (("mean:5", "does not fit a tensor of shape"), ("mean:1,1", "names a dimension twice")):
        with pytest.raises(HookscopeError, match=message) as e:
            hookscope.extract(model, x, "3", reduce=reduce, out=tmp_path / "a")
        assert "\n" not in str(e.value)
    sizes = [torch.randn(3, 8 + i, 8) for i in range(4)]
    for workers in (0, 1):
        with pytest.raises(HookscopeError, match="cannot be put in one batch") as e:
            hookscope.extract(nn.Sequential(nn.Conv2d(3, 2, 3)).eval(), sizes, "0", reduce="mean", batch_size=2,
                              workers=workers, out=tmp_path / f"b{workers}")
        assert "\n" not in str(e.value)
    with pytest.raises(HookscopeError, match="dtype object"):
        hookscope.extract(model, np.array([None, 1], dtype=object), "3", out=tmp_path / "c")
    store = hookscope.extract(model, x, "5", ids=[10, 11, 12, 13], out=tmp_path / "d")  # ints become text
    assert store.ids == ["10", "11", "12", "13"]


def test_refused_outputs_leave_the_folder_free(tmp_path: Path) -> None:
    class Complex(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return torch.complex(t, t)

    model, out = nn.Sequential(nn.Linear(2, 2), Complex()).eval(), tmp_path / "s"
    with pytest.raises(HookscopeError, match="safetensors cannot hold"):
        hookscope.extract(model, torch.randn(3, 2), "1", out=out)
    store = hookscope.extract(model, torch.randn(3, 2), "0", out=out)  # no --overwrite needed
    assert store["0"].shape == (3, 2) and no_hooks(model)


def test_messages_name_the_right_thing(tmp_path: Path) -> None:
    model = build()
    with pytest.raises(HookscopeError, match="the model itself"):
        hookscope.extract(model, torch.randn(2, 3, 16, 16), "", out=tmp_path / "a")
    with pytest.raises(HookscopeError, match="device='meta' holds no values"):
        hookscope.extract(model, torch.randn(2, 3, 16, 16), "5", device="meta", out=tmp_path / "b")

    class Keywords(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Bilinear(2, 2, 2)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.inner(input1=t, input2=t)

    with pytest.raises(HookscopeError, match="keyword arguments only"):
        hookscope.extract(Keywords().eval(), torch.randn(3, 2), "inner", keep="input", out=tmp_path / "c")


def test_samples_attribute_without_paths_gives_no_ids(tmp_path: Path) -> None:
    class Pairs(torch.utils.data.Dataset[Any]):
        samples = [(torch.randn(3, 16, 16), 0) for _ in range(3)]

        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> Any:
            return self.samples[i]

    store = hookscope.extract(build(), Pairs(), "5", out=tmp_path / "s")
    assert store.ids == ["0", "1", "2"]


def test_a_failure_mid_run_says_the_shards_are_kept(tmp_path: Path) -> None:
    class Breaks(Samples):
        def __getitem__(self, i: int) -> torch.Tensor:
            if i == 30:
                raise OSError("disk went away")
            return super().__getitem__(i)

    shard = 12 * (16 * 4 + 8)
    with pytest.raises(HookscopeError, match="complete shards are kept.*resume"):
        hookscope.extract(build(), Breaks(40), {"5": "max"}, out=tmp_path / "s", shard_size=shard, batch_size=4)
    store = hookscope.extract(build(), Samples(40), {"5": "max"}, out=tmp_path / "s", shard_size=shard,
                              batch_size=4, resume=True)
    assert store.indices.tolist() == list(range(40))


def test_two_runs_never_write_one_folder_at_once(tmp_path: Path) -> None:
    out = tmp_path / "s"
    with hookscope.store.locked(out):  # another run holds the folder
        with pytest.raises(HookscopeError, match="being written by another run"):
            hookscope.extract(build(), torch.randn(3, 3, 16, 16), "5", out=out)
    store = hookscope.extract(build(), torch.randn(3, 3, 16, 16), "5", out=out)  # free again, lock gone
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
    hookscope.extract(model, data, {"lin": how}, **kw)
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
            hookscope.extract(model, data, {"lin": how}, resume=True, **kw)
    finally:
        SCALE = 1.0


def test_one_layer_given_two_reductions_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HookscopeError, match="two reductions"):
        hookscope.extract(build(), torch.randn(2, 3, 16, 16), {"5": "mean"}, {"5": "max"}, out=tmp_path / "s")


def test_a_reduction_that_loses_the_samples_is_caught_by_the_probe(tmp_path: Path) -> None:
    out = tmp_path / "s"
    with pytest.raises(HookscopeError, match="must keep the samples as dimension 0"):
        hookscope.extract(build(), torch.randn(6, 3, 16, 16), {"8": hookscope.at[None]}, out=out)
    assert not (out / "manifest.json").exists()


def test_a_model_failure_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(hookscope.ForwardError, match="RuntimeError") as e:
        hookscope.extract(build(), torch.zeros(4, 3, 16, 16, dtype=torch.int64), "5", out=tmp_path / "s")
    assert "\n" not in str(e.value)


def test_a_failure_before_the_first_shard_leaves_the_folder_free(tmp_path: Path) -> None:
    class Late(Samples):
        def __getitem__(self, i: int) -> torch.Tensor:
            if i == 5:
                raise OSError("unreadable")
            return super().__getitem__(i)

    out = tmp_path / "s"
    with pytest.raises(HookscopeError, match="sample 5 cannot be read") as e:
        hookscope.extract(build(), Late(20), {"5": "max"}, out=out, batch_size=4)
    assert "resume" not in str(e.value)
    store = hookscope.extract(build(), Samples(20), {"5": "max"}, out=out, batch_size=4)  # no flag needed
    assert store["5"].shape == (20, 16)
