"""hookscope.extract: what the store returns equals a direct capture of the same samples; the folder rules,
resumption, skipping, early stop and the refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.extract._write import groups_for
from hookscope.errors import HookscopeError

from extract_job import LAYERS, SHARD, SIZE, Samples, build
from helpers import no_hooks


def _reference(model: nn.Module, data: Any, layers: dict[str, Any], groups: list[list[int]]) -> dict[str, torch.Tensor]:
    """Each layer's reduced rows by hookscope.capture, over the same batches the store used."""
    out: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
    for g in groups:
        x = torch.stack([data[i] for i in g])
        with torch.no_grad(), hookscope.capture(model, *layers) as rec:
            model(x)
        for n, how in layers.items():
            t = rec[n].output
            out[n].append(hookscope.analysis.extract.reducer(how)(t))
    return {n: torch.cat(v) for n, v in out.items()}


def _groups(store: hookscope.store.Store, batch: int) -> list[list[int]]:
    m = store.manifest
    shards = len(m["shards"])
    return groups_for(list(range(shards)), m["samples_per_shard"], m["samples"]["count"], batch)[0]


def test_round_trip_equals_capture_of_the_same_samples(tmp_path: Path) -> None:
    model, data = build(), Samples(SIZE)
    store = hookscope.extract(model, data, layers=LAYERS, out=tmp_path / "s", batch_size=5, shard_size=SHARD)
    assert no_hooks(model)
    assert store.manifest["samples_per_shard"] == 12 and len(store.manifest["shards"]) == 5
    ref = _reference(model, data, LAYERS, _groups(store, 5))
    for name in LAYERS:
        assert store[name].shape == tuple(ref[name].shape)
        assert torch.equal(store[name][:], ref[name]), name
    # the in-place ReLU after layer 3 did not rewrite what was stored: conv outputs keep their negatives
    assert bool((store["3"][:] < 0).any())
    assert store.indices.tolist() == list(range(SIZE))
    assert torch.equal(store["3"][13], ref["3"][13]) and torch.equal(store["3"][-1], ref["3"][-1])


def test_one_batch_equals_the_whole_data_at_once(tmp_path: Path) -> None:
    model = build()
    x = torch.stack([Samples(SIZE)[i] for i in range(20)])
    store = hookscope.extract(model, x, layers={"3": None}, out=tmp_path / "s", batch_size=20)
    with torch.no_grad(), hookscope.capture(model, "3") as rec:
        model(x)
    assert torch.equal(store["3"][:], rec["3"].output)


def test_later_layers_are_not_computed(tmp_path: Path) -> None:
    class Counted(nn.Module):
        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Counted.calls += 1
            return x

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), Counted()).eval()
    store = hookscope.extract(model, torch.randn(70, 3), layers="1", out=tmp_path / "s", batch_size=3)
    assert store["1"].shape == (70, 4)
    assert Counted.calls == 1  # the one-sample probe runs the whole forward (to see layers that run twice); no batch does
    assert no_hooks(model)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cast_equals_the_cast_of_the_float32_rows(tmp_path: Path, dtype: torch.dtype) -> None:
    model, x = build(), torch.stack([Samples(SIZE)[i] for i in range(9)])
    full = hookscope.extract(model, x, layers={"3": None}, out=tmp_path / "a", batch_size=4)
    cast = hookscope.extract(model, x, layers={"3": None}, out=tmp_path / "b", batch_size=4, dtype=dtype)
    assert cast["3"].dtype == dtype
    assert torch.equal(cast["3"][:], full["3"][:].to(dtype))


def test_input_keep_positions_and_functions(tmp_path: Path) -> None:
    class Tokens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.mix = nn.Embedding(11, 6), nn.Linear(6, 6)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.mix(self.emb(input_ids) * attention_mask[..., None])

    torch.manual_seed(0)
    model = Tokens().eval()
    ids = torch.randint(0, 11, (9, 5))
    batches = [{"input_ids": ids[i:i + 4], "attention_mask": torch.ones(len(ids[i:i + 4]), 5)} for i in range(0, 9, 4)]
    store = hookscope.extract(model, iter(batches), layers={"mix": hookscope.at[:, -1]}, out=tmp_path / "a")
    with torch.no_grad():
        full = model(ids, torch.ones(9, 5))
    assert torch.allclose(store["mix"][:], full[:, -1], atol=1e-6)
    inputs = hookscope.extract(model, iter(batches), layers={"mix": "mean:1"}, keep="input", out=tmp_path / "b")
    with torch.no_grad():
        assert torch.allclose(inputs["mix"][:], model.emb(ids).mean(1), atol=1e-6)
    norms = hookscope.extract(model, iter(batches), layers="mix", reduce=lambda t: t.norm(dim=-1), out=tmp_path / "c")
    assert torch.allclose(norms["mix"][:], full.norm(dim=-1), atol=1e-5)
    assert norms.manifest["arrays"][0]["reduction"].startswith("fn:")


def test_dataloader_pairs_and_shuffle_refused(tmp_path: Path) -> None:
    model = build()
    pairs = [(Samples(SIZE)[i], i % 3) for i in range(10)]
    loader = torch.utils.data.DataLoader(pairs, batch_size=3)
    store = hookscope.extract(model, loader, layers={"5": "max"}, out=tmp_path / "s")
    assert store.manifest["batch_size"] == 3
    direct = hookscope.extract(model, torch.stack([p[0] for p in pairs]), layers={"5": "max"}, out=tmp_path / "t",
                               batch_size=3)
    assert torch.equal(store["5"][:], direct["5"][:])
    with pytest.raises(HookscopeError, match="shuffles"):
        hookscope.extract(model, torch.utils.data.DataLoader(pairs, batch_size=3, shuffle=True), layers="5",
                          out=tmp_path / "u")


def test_stream_straddling_shards_equals_indexed(tmp_path: Path) -> None:
    model, data = build(), Samples(SIZE)
    loader = torch.utils.data.DataLoader(data, batch_size=5)
    streamed = hookscope.extract(model, (b for b in loader), layers=LAYERS, out=tmp_path / "a", shard_size=SHARD)
    indexed = hookscope.extract(model, data, layers=LAYERS, out=tmp_path / "b", batch_size=5, shard_size=SHARD)
    assert streamed.manifest["samples"]["count"] == SIZE
    for n in LAYERS:  # the same batches of 5, whatever shard their rows went to
        assert torch.allclose(streamed[n][:], indexed[n][:], atol=1e-6)


def test_different_sizes_need_a_reduction(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3)).eval()
    images = [torch.randn(3, 8 + i, 8) for i in range(4)]
    with pytest.raises(HookscopeError, match="reduce='mean'"):
        hookscope.extract(model, images, layers="0", out=tmp_path / "a", batch_size=1)
    assert no_hooks(model)
    store = hookscope.extract(model, images, layers="0", reduce="mean", out=tmp_path / "b", batch_size=1)
    for i, img in enumerate(images):
        with torch.no_grad():
            assert torch.allclose(store["0"][i], model(img[None]).mean((2, 3))[0], atol=1e-6)


class Flaky(Samples):
    def __getitem__(self, i: int) -> torch.Tensor:
        if i in (3, 7):
            raise OSError(f"cannot read sample file {i}.png")
        return super().__getitem__(i)


def test_unreadable_samples_stop_or_are_skipped(tmp_path: Path) -> None:
    model, data = build(), Flaky(10)
    ids = [f"img{i}.png" for i in range(10)]
    with pytest.raises(HookscopeError, match=r"sample img3.png cannot be read .*on_error='skip'"):
        hookscope.extract(model, data, layers={"5": "max"}, out=tmp_path / "a", batch_size=4, ids=ids)
    store = hookscope.extract(model, data, layers={"5": "max"}, out=tmp_path / "b", batch_size=4, ids=ids, on_error="skip")
    kept = [i for i in range(10) if i not in (3, 7)]
    assert store.indices.tolist() == kept
    assert store.ids == [ids[i] for i in kept]
    assert [s["id"] for s in store.manifest["samples"]["skipped"]] == ["img3.png", "img7.png"]
    with torch.no_grad():
        want = model[:6](torch.stack([Samples(10)[i] for i in kept])).amax((2, 3))
    assert torch.allclose(store["5"][:], want, atol=1e-6)


def test_folder_rules(tmp_path: Path) -> None:
    model, x = build(), torch.stack([Samples(SIZE)[i] for i in range(6)])
    out = tmp_path / "s"
    hookscope.extract(model, x, layers={"5": "max"}, out=out)
    with pytest.raises(HookscopeError, match="already holds a hookscope store.*--resume.*--overwrite"):
        hookscope.extract(model, x, layers={"5": "max"}, out=out)
    again = hookscope.extract(model, x, layers={"3": None}, out=out, overwrite=True)
    assert again.layers == ("3",)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(HookscopeError, match="not empty and holds no hookscope store"):
            hookscope.extract(model, x, layers="5", out=foreign, **flags)
    assert (foreign / "notes.txt").read_text() == "keep me"
    with pytest.raises(HookscopeError, match="pick one"):
        hookscope.extract(model, x, layers="5", out=tmp_path / "n", resume=True, overwrite=True)


def test_resume_refuses_other_settings_naming_them(tmp_path: Path) -> None:
    model, x = build(), torch.stack([Samples(SIZE)[i] for i in range(6)])
    out = tmp_path / "s"
    hookscope.extract(model, x, layers={"5": "max"}, out=out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(HookscopeError, match=r"cannot resume .*arrays\[0\]\.name was '5' and is now '3'"):
        hookscope.extract(model, x, layers={"3": "max"}, out=out, resume=True)
    with pytest.raises(HookscopeError, match="reduction was 'max' and is now 'mean'"):
        hookscope.extract(model, x, layers={"5": "mean"}, out=out, resume=True)
    other = build()
    with torch.no_grad():
        other[0].weight[0, 0, 0, 0] += 1
    with pytest.raises(HookscopeError, match="model.weights_sha256 was"):
        hookscope.extract(other, x, layers={"5": "max"}, out=out, resume=True)
    done = hookscope.extract(model, x, layers={"5": "max"}, out=out, resume=True)
    assert done.manifest["complete"] is True and done["5"].shape == (6, 16)


def test_shared_module_is_refused(tmp_path: Path) -> None:
    lin = nn.Linear(3, 3)
    model = nn.Sequential(lin, nn.ReLU(), lin).eval()
    with pytest.raises(HookscopeError, match="also registered as '2'"):
        hookscope.extract(model, torch.randn(4, 3), layers="0", out=tmp_path / "s")

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.out = nn.Linear(3, 3), nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.lin(torch.relu(self.lin(x))))

    twice = Twice().eval()
    with pytest.raises(HookscopeError, match="more than once in one forward"):
        hookscope.extract(twice, torch.randn(4, 3), layers=["lin", "out"], out=tmp_path / "t")
    with pytest.raises(HookscopeError, match="more than once in one forward"):  # also when it is the last selected
        hookscope.extract(twice, torch.randn(4, 3), layers="lin", out=tmp_path / "u")
    assert no_hooks(twice)


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    model, x = build(), torch.randn(4, 3, 16, 16)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"reduce": "median"}, "is not a reduction"), ({"reduce": "mean:0"}, "dimension 0"),
        ({"shard_size": "lots"}, "is not a size"), ({"batch_size": 0}, "positive int"),
        ({"keep": "grad_output"}, "'output' or its 'input'"), ({"dtype": torch.int8}, "floating-point"),
        ({"on_error": "ignore"}, "on_error="),
    ]
    for kwargs, message in cases:
        with pytest.raises(HookscopeError, match=message) as e:
            hookscope.extract(model, x, layers="3", out=tmp_path / "s", **kwargs)
        assert "\n" not in str(e.value)
    with pytest.raises(HookscopeError, match="needs layers"):
        hookscope.extract(model, x, out=tmp_path / "s")
    with pytest.raises(HookscopeError, match="not a dataset"):
        hookscope.extract(model, "images/", layers="3", out=tmp_path / "s")
    assert no_hooks(model) and not (tmp_path / "s").exists()


def test_wrapped_model_is_keyed_by_inner_names(tmp_path: Path) -> None:
    model, x = build(), torch.randn(5, 3, 16, 16)
    store = hookscope.extract(nn.DataParallel(model), x, layers={"module.5": "max"}, out=tmp_path / "s")
    assert store.layers == ("5",)
    with torch.no_grad():
        assert torch.allclose(store["5"][:], model[:6](x).amax((2, 3)), atol=1e-6)


def test_manifest_describes_the_run(tmp_path: Path) -> None:
    model = build()
    store = hookscope.extract(model, Samples(8), layers={"5": "max"}, out=tmp_path / "s", dtype=torch.float16,
                              describe={"model": {"spec": "extract_job:build"}, "preprocessing": {"size": 16}})
    m = store.manifest
    assert m["schema_version"] == 1 and m["kind"] == "samples" and m["complete"] is True
    assert m["arrays"] == [{"name": "5", "shape": [16], "dtype": "float16", "field": "output", "reduction": "max"}]
    assert m["model"]["spec"] == "extract_job:build" and m["model"]["class"] == "Sequential"
    assert len(m["model"]["weights_sha256"]) == 64 and m["preprocessing"] == {"size": 16}
    assert m["versions"]["torch"] == torch.__version__ and m["samples"]["count"] == 8
    assert os.path.isfile(tmp_path / "s" / m["shards"][0]["file"])


def test_resume_of_a_complete_store_checks_settings_and_data(tmp_path: Path) -> None:
    model, x = build(), torch.stack([Samples(SIZE)[i] for i in range(6)])
    out = tmp_path / "s"
    first = hookscope.extract(model, x, layers={"5": "max"}, out=out)
    manifest = (out / "manifest.json").read_bytes()
    again = hookscope.extract(model, x, layers={"5": "max"}, out=out, resume=True)  # nothing to do, nothing rewritten
    assert (out / "manifest.json").read_bytes() == manifest and torch.equal(again["5"][:], first["5"][:])
    with pytest.raises(HookscopeError, match="arrays"):
        hookscope.extract(model, x, layers={"3": None}, out=out, resume=True)
    with pytest.raises(HookscopeError, match="data_check.samples_sha256"):  # same length, other samples
        hookscope.extract(model, x.flip(0), layers={"5": "max"}, out=out, resume=True)


def test_a_run_that_failed_before_any_shard_leaves_nothing_in_the_way(tmp_path: Path) -> None:
    model, out = build(), tmp_path / "s"
    with pytest.raises(HookscopeError, match="sample 0 cannot be read"):
        hookscope.extract(model, _FirstBad(4), layers={"5": "max"}, out=out)
    store = hookscope.extract(model, Samples(4), layers={"5": "max"}, out=out)  # neither --resume nor --overwrite needed
    assert store["5"].shape == (4, 16)


class _FirstBad(Samples):
    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 0:
            raise OSError("unreadable")
        return super().__getitem__(i)


def test_the_model_comes_back_as_it_was(tmp_path: Path) -> None:
    model = build().train()  # batch statistics would move in train mode
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(UserWarning, match="train mode"):
        hookscope.extract(model, Samples(10), layers={"3": None}, out=tmp_path / "s", batch_size=4)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.training and all(m.training for m in model.modules()) and no_hooks(model)


# a stored dtype of a smaller range refuses the values it would make inf ----------------------------------
class Passes(nn.Module):
    """Stores its input as it is (``out``), so the test sets the stored values exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x)


_HALF = {"shard_size": 10 * (4 * 2 + 8), "batch_size": 5}  # ten samples a shard in float16


def _rows(big_at: int | None = None, big: float = 7e4) -> torch.Tensor:
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(5))
    if big_at is not None:
        x[big_at, 2] = -big
    return x


def _stored_shards(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "shards").glob("*.safetensors")) if (out / "shards").is_dir() else []


@pytest.mark.parametrize("row", [0, 35])  # in the probe's samples, or in the fourth shard (three written before)
@pytest.mark.parametrize("given", ["tensor", "stream", "dataset"])
def test_float16_refuses_values_beyond_its_range_and_leaves_no_store(tmp_path: Path, row: int, given: str) -> None:
    x, out = _rows(row), tmp_path / "s"
    data: Any = {"tensor": x, "stream": iter(x.split(5)), "dataset": list(x)}[given]
    with pytest.raises(HookscopeError, match=r"'out' gives values up to 70000, beyond float16's range \(largest "
                                             r"finite 65504\), so they would be stored as inf; store them as bfloat16 "
                                             r"or float32 \(dtype=torch.bfloat16, --dtype bfloat16\)$") as e:
        hookscope.extract(Passes(), data, layers="out", dtype=torch.float16, out=out, **_HALF)
    assert "\n" not in str(e.value) and "resume" not in str(e.value)
    assert not (out / "manifest.json").exists() and _stored_shards(out) == []
    again = {"tensor": x, "stream": iter(x.split(5)), "dataset": list(x)}[given]
    store = hookscope.extract(Passes(), again, layers="out", dtype=torch.bfloat16, out=out, **_HALF)  # no flag needed
    assert torch.equal(store["out"][:], x.to(torch.bfloat16)) and store["out"][row, 2].item() == -70144.0


def test_the_float16_limit_is_where_values_round_to_inf(tmp_path: Path) -> None:
    x = _rows()
    x[3, 0], x[4, 1] = 65519.0, -65519.0  # round to +-65504
    store = hookscope.extract(Passes(), x, layers="out", dtype=torch.float16, out=tmp_path / "a", **_HALF)
    assert torch.equal(store["out"][:], x.half()) and store["out"][:].isfinite().all()
    assert store["out"][3, 0].item() == 65504.0 and store["out"][4, 1].item() == -65504.0
    x[30, 3] = 65520.0  # rounds to inf
    with pytest.raises(HookscopeError, match="values up to 65520, beyond float16's range"):
        hookscope.extract(Passes(), x, layers="out", dtype=torch.float16, out=tmp_path / "b", **_HALF)


def test_the_models_own_inf_and_nan_are_stored_as_they_are(tmp_path: Path) -> None:
    x = _rows()
    x[0, 0], x[12, 1], x[33, 2], x[7, 3] = float("inf"), float("-inf"), float("nan"), 60000.0
    store = hookscope.extract(Passes(), x, layers="out", dtype=torch.float16, out=tmp_path / "s", **_HALF)
    got, want = store["out"][:], x.half()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert got[0, 0].item() == float("inf") and got[12, 1].item() == float("-inf") and got[33, 2].isnan()


@pytest.mark.parametrize("source, cast, value, limit", [
    (torch.float64, torch.float32, 1e300, "float32's range \\(largest finite 3.40282e\\+38\\)"),
    (torch.float64, torch.float16, 1e5, "float16's range"),
    (torch.float32, torch.bfloat16, 3.4e38, "bfloat16's range \\(largest finite 3.38953e\\+38\\)"),
])
def test_every_narrower_dtype_refuses_what_it_cannot_hold(tmp_path: Path, source: torch.dtype, cast: torch.dtype,
                                                          value: float, limit: str) -> None:
    x = _rows().to(source)
    x[21, 1] = value
    with pytest.raises(HookscopeError, match=limit):
        hookscope.extract(Passes(), x, layers="out", dtype=cast, out=tmp_path / "s", **_HALF)
    x[21, 1] = 1e30 if cast == torch.bfloat16 else 1.0  # within range: stored as the cast
    store = hookscope.extract(Passes(), x, layers="out", dtype=cast, out=tmp_path / "s", **_HALF)
    assert torch.equal(store["out"][:], x.to(cast))


def test_a_resumed_float16_store_that_meets_such_values_says_start_again(tmp_path: Path) -> None:
    out = tmp_path / "s"
    hookscope.extract(Passes(), _rows(), layers="out", dtype=torch.float16, out=out, **_HALF)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    for shard in _stored_shards(out)[2:]:
        (out / "shards" / shard).unlink()
    with pytest.raises(HookscopeError, match="beyond float16's range.*start it again with overwrite=True"):
        hookscope.extract(Passes(), _rows(35), layers="out", dtype=torch.float16, out=out, resume=True, **_HALF)
    kept = _stored_shards(out)  # shard 2 holds no such value: the writer may have finished it meanwhile
    assert kept[:2] == ["000000.safetensors", "000001.safetensors"] and "000003.safetensors" not in kept
    assert json.loads((out / "manifest.json").read_text())["complete"] is False


# the model gets its own copy of the caller's tensors --------------------------------------------------------
class Overwrites(nn.Module):
    """Halves its input in place before its linear layer and zeroes it after."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x.div_(2))
        x.zero_()
        return y


class ReluFirst(nn.Module):
    """An in-place ReLU on the input, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.relu, self.lin = nn.ReLU(inplace=True), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.relu(x))


SOURCES: dict[str, Any] = {
    "tensor": lambda x: x,
    "numpy": lambda x: x.numpy(),
    "TensorDataset": lambda x: torch.utils.data.TensorDataset(x),
    "list of tensors": lambda x: list(x),
    "dict samples": lambda x: [{"x": r} for r in x],
    "DataLoader": lambda x: torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4),
    "DataLoader of views": lambda x: torch.utils.data.DataLoader(  # each batch a slice of the caller's tensor
        range(len(x)), batch_size=4, collate_fn=lambda idx: x[idx[0]:idx[-1] + 1]),
    "stream": lambda x: iter(x.split(4)),
}


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("model", ["div_ and zero_", "ReLU(inplace=True) first"])
def test_the_model_never_writes_into_the_callers_data(tmp_path: Path, source: str, model: str) -> None:
    x = torch.randn(10, 4, generator=torch.Generator().manual_seed(6))
    before = x.clone()
    net = (Overwrites() if model == "div_ and zero_" else ReluFirst()).eval()
    with torch.no_grad():
        want = net.lin(before / 2 if model == "div_ and zero_" else before.relu())
    for run in range(2):  # a second run over the same data sees it unchanged too
        data = SOURCES[source](x)
        store = hookscope.extract(net, data, layers="lin", out=tmp_path / f"s{run}", batch_size=3)
        assert torch.equal(x, before), f"run {run} changed the caller's data"
        assert torch.allclose(store["lin"][:], want, atol=1e-6, rtol=0) and store["lin"].shape == (10, 3)
    assert no_hooks(net)


def test_the_model_gets_one_copy_of_the_callers_tensors_or_the_runs_own() -> None:
    from hookscope.analysis.extract._source import model_call

    x, seen = torch.ones(2, 3), []
    model_call(lambda t: seen.append(t), x, torch.device("cpu"))
    model_call(lambda t: seen.append(t), {"t": x}, torch.device("cpu"))
    model_call(lambda t: seen.append(t), x, torch.device("cpu"), own=True)
    assert seen[0] is not x and seen[1] is not x and torch.equal(seen[0], x) and seen[0].data_ptr() != x.data_ptr()
    assert seen[2] is x  # a gather or a collate is the run's own: no second copy
