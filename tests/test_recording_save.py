"""Recording.save / hookscope.records.load: every kept call and field round-trips, through the store
format (one safetensors shard and a JSON manifest), and nothing is ever pickled."""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from helpers import FakeModelOutput, Net, Pair, Structured, no_hooks
from torch import nn

import hookscope
from hookscope import HookscopeError, MutationError, RecordError
from hookscope.records import Recording, load
from hookscope.store import write_json

FIELDS = ("args", "kwargs", "output", "grad_output", "grad_args")


def _same(a, b) -> bool:
    """Equal values, dtypes and structure (tuples, lists, dicts, None); tensors by torch.equal. What was
    saved (``a``) may be a dataclass or a dict subclass (loaded as a dict of its fields) or a named
    tuple / struct sequence (loaded as a named tuple of the same name and fields)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if dataclasses.is_dataclass(a) and not isinstance(a, dict):
        a = {f.name: getattr(a, f.name) for f in dataclasses.fields(a)}
    if isinstance(a, tuple) and type(a) is not tuple:
        return type(a).__name__ == type(b).__name__ and all(_same(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _read(call, field):
    try:
        return "value", getattr(call, field)
    except HookscopeError as e:
        return type(e).__name__, str(e)


def _assert_round_trip(rec: Recording, again: Recording) -> None:
    assert [(c.name, c.index) for c in again.calls] == [(c.name, c.index) for c in rec.calls]
    assert again.keep == rec.keep and again.selected == rec.selected
    for a, b in zip(rec.calls, again.calls):
        assert a.returned == b.returned
        for field in FIELDS:
            (ka, va), (kb, vb) = _read(a, field), _read(b, field)
            assert ka == kb, (a, field, va, vb)
            assert _same(va, vb) if ka == "value" else va == vb, (a, field)
    assert again.table() == rec.table() and again.rows == rec.rows


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.lin(x) * scale
        return self.norm(h if mask is None else h * mask)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x, scale=0.5, mask=torch.ones(4))
        return self.head(x)


def test_every_call_and_field_round_trips_with_gradients(tmp_path):
    model = _Model()
    with hookscope.capture(model, keep="all") as rec:
        for _ in range(2):
            model(torch.randn(3, 4, requires_grad=True)).pow(2).sum().backward()
    assert len(rec.calls) == 2 * 7  # blocks.0 (lin, norm), blocks.1 (lin, norm), head
    folder = rec.save(tmp_path / "rec")
    assert folder == tmp_path / "rec"
    again = load(folder)
    _assert_round_trip(rec, again)
    assert torch.equal(again["blocks.1.lin"].calls[1].grad_output, rec["blocks.1.lin"].calls[1].grad_output)
    assert again["blocks.0"].calls[0].kwargs["scale"] == 0.5
    assert torch.equal(again["blocks.0"].calls[0].kwargs["mask"], torch.ones(4))
    assert again.to_json(field="grad_output") == rec.to_json(field="grad_output")
    assert no_hooks(model)


def test_structures_come_back(tmp_path):
    kinds = ("dict", "dataclass", "modeloutput", "namedtuple", "plain")
    nets = {k: Structured(k) for k in kinds}
    root = nn.ModuleDict(nets)
    x = torch.randn(2, 3)
    with hookscope.capture(root, *kinds, keep="io") as rec:
        outs = {k: nets[k](x) for k in kinds}
    again = load(rec.save(tmp_path / "r"))
    _assert_round_trip(rec, again)
    d = again["dict"].output
    assert isinstance(d, dict) and d["twice"][1] is None and torch.equal(d["twice"][0], outs["dict"]["twice"][0])
    pair = again["dataclass"].output  # a dataclass comes back as a dict of its fields
    assert type(pair) is dict and torch.equal(pair["main"], outs["dataclass"].main)
    assert type(pair["aux"]) is tuple and torch.equal(pair["aux"][0], outs["dataclass"].aux[0])
    mo = again["modeloutput"].output
    assert type(mo) is dict and list(mo) == ["logits", "hidden"] and torch.equal(mo["hidden"], outs["modeloutput"].hidden)
    nt = again["namedtuple"].output  # torch.return_types.max: a named tuple of the same fields
    assert nt.values.dtype == torch.float32 and nt.indices.dtype == torch.int64
    assert torch.equal(nt[1], outs["namedtuple"].indices) and type(nt).__name__ == "max"


class _Odd(nn.Module):
    """Returns what real models return besides tensors: numbers, strings, sizes, dtypes, empty tensors."""

    def forward(self, x: torch.Tensor) -> object:
        Point = collections.namedtuple("Point", ["x", "y"])
        return {"h": x.to(torch.bfloat16), "n": 3, "f": 0.1, "inf": float("inf"), "s": "tok", "flag": True,
                "size": x.shape, "dtype": x.dtype, 7: torch.zeros(0, 5), "scalar": x.sum(), "none": None,
                "mask": x > 0, "ids": x.to(torch.int32), "pt": Point(x, [x.half(), None]), "u8": x.to(torch.uint8)}


def test_dtypes_scalars_and_odd_shapes_round_trip(tmp_path):
    net = nn.Sequential(_Odd())
    x = torch.randn(2, 3) * 10
    with hookscope.capture(net, "0") as rec:
        net(x)
    out = load(rec.save(tmp_path / "r"))["0"].output
    want = rec["0"].output
    assert out["h"].dtype == torch.bfloat16 and torch.equal(out["h"], want["h"])
    assert (out["n"], out["f"], out["s"], out["flag"], out["dtype"]) == (3, 0.1, "tok", True, torch.float32)
    assert out["inf"] == float("inf") and out["none"] is None
    assert type(out["size"]) is torch.Size and out["size"] == (2, 3)
    assert out[7].shape == (0, 5) and out["scalar"].shape == () and torch.equal(out["scalar"], want["scalar"])
    assert out["mask"].dtype == torch.bool and torch.equal(out["mask"], want["mask"])
    assert torch.equal(out["ids"], want["ids"]) and torch.equal(out["u8"], want["u8"])
    assert out["pt"].x.shape == (2, 3) and out["pt"].y[1] is None and out["pt"].y[0].dtype == torch.float16
    assert list(out) == list(want)


class _Flaky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            raise ValueError("bad batch")
        return self.lin(x)


def test_a_call_that_raised_has_no_output_after_loading(tmp_path):
    flaky = _Flaky()
    net = nn.Sequential(flaky)
    with hookscope.capture(net, "0", keep="io") as rec:
        for _ in range(3):
            try:
                net(torch.ones(1, 2))
            except ValueError:
                pass
    again = load(rec.save(tmp_path / "r"))
    _assert_round_trip(rec, again)
    assert [c.returned for c in again["0"].calls] == [True, False, True]
    with pytest.raises(RecordError, match="call 1 of '0' raised before returning"):
        again["0"].calls[1].output
    assert torch.equal(again["0"].calls[1].input, torch.ones(1, 2))
    assert again.to_dict()["0"][1] is None
    _assert_round_trip(rec, load(again.save(tmp_path / "again")))  # a loaded recording saves as it loaded


def test_a_record_overwritten_in_place_still_refuses_after_loading(tmp_path):
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    with hookscope.capture(net, "0", copy="never") as rec:
        net(torch.randn(3, 2))
    again = load(rec.save(tmp_path / "r"))
    with pytest.raises(MutationError, match="overwritten in place") as e:
        again["0"].output
    with pytest.raises(MutationError) as e0:
        rec["0"].output
    assert str(e.value) == str(e0.value)
    with pytest.raises(MutationError, match="overwritten in place"):
        load(again.save(tmp_path / "again"))["0"].output


def test_bounded_recordings_keep_their_indices_and_aliases(tmp_path):
    lin = nn.Linear(3, 3)
    net = nn.Sequential(lin, nn.ReLU(), lin)
    with hookscope.capture(net, "0", "1", keep="all", last=1) as rec:
        for _ in range(3):
            net(torch.randn(2, 3, requires_grad=True)).sum().backward()
    again = load(rec.save(tmp_path / "r"))
    _assert_round_trip(rec, again)
    assert [c.index for c in again.calls] == [7, 8] and torch.equal(again["2"].output, rec["0"].output)
    assert torch.equal(again["module.2"].grad_output, torch.ones(2, 3))


def test_a_loaded_recording_speaks_the_protocol(tmp_path):
    net = Net()
    with hookscope.capture(net, keep="io") as rec:
        net(torch.ones(2, 2))
        net(torch.zeros(2, 2))
    again = load(rec.save(tmp_path / "r"))
    assert list(again) == ["l1", "l2"] and len(again) == 2 and "l1" in again and "l3" not in again
    assert str(again) == str(rec)
    assert json.loads(again.to_json()) == json.loads(rec.to_json())
    assert torch.equal(again["l2"].outputs[1], net(torch.zeros(2, 2)))
    with pytest.raises(RecordError, match="called 2 times"):
        again["l1"].output
    with pytest.raises(RecordError, match="Did you mean .l1."):
        again["l11"]
    with pytest.raises(RecordError, match="grad_output' of 'l1' was not recorded|gradients of 'l1' were not recorded"):
        again["l1"].calls[0].grad_output


def test_save_refuses_an_existing_folder_unless_overwrite(tmp_path):
    net = Net()
    with hookscope.capture(net, "l1") as rec:
        net(torch.ones(1, 2))
    rec.save(tmp_path / "r")
    with pytest.raises(HookscopeError, match="not empty.*overwrite=True") as e:
        rec.save(tmp_path / "r")
    assert "\n" not in str(e.value)
    with hookscope.capture(net, "l2") as rec2:
        net(torch.ones(1, 2))
    rec2.save(tmp_path / "r", overwrite=True)
    assert list(load(tmp_path / "r")) == ["l2"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(HookscopeError, match="holds no hookscope store"):
        rec.save(tmp_path / "other", overwrite=True)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_load_refuses_an_extract_store_and_what_is_no_recording(tmp_path):
    (tmp_path / "samples").mkdir()
    write_json(tmp_path / "samples" / "manifest.json", {"schema_version": 1, "kind": "samples", "complete": True})
    with pytest.raises(HookscopeError, match="samples is an extract store; open it with hookscope.open_store"):
        load(tmp_path / "samples")
    with pytest.raises(HookscopeError, match="manifest.json is missing"):
        load(tmp_path / "nothing")


def test_load_refuses_a_corrupted_shard_and_a_tampered_manifest(tmp_path):
    net = Net()
    with hookscope.capture(net, "l1") as rec:
        net(torch.ones(1, 2))
    folder = rec.save(tmp_path / "r")
    shard = next((folder / "shards").iterdir())
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(HookscopeError, match="truncated or corrupted"):
        load(folder)
    folder = rec.save(tmp_path / "r2")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["recording"]["calls"][0]["name"] = "l9"
    write_json(folder / "manifest.json", manifest)
    with pytest.raises(HookscopeError, match="does not select|does not describe"):
        load(folder)


def test_what_has_no_file_form_is_refused_naming_it(tmp_path):
    class Returns(nn.Module):
        def forward(self, x):
            return x, print  # a function: no file form

    net = nn.Sequential(Returns())
    with hookscope.capture(net, "0") as rec:
        net(torch.ones(1))
    with pytest.raises(RecordError, match=r"cannot save the output of '0' \(call 0\)\[1\]: it holds a "
                                          r"builtin_function_or_method") as e:
        rec.save(tmp_path / "r")
    assert "\n" not in str(e.value) and not (tmp_path / "r").exists()


def test_the_files_are_safetensors_and_json_only(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    net = Net()
    with hookscope.capture(net, keep="io") as rec:
        net(torch.randn(2, 2))
    folder = rec.save(tmp_path / "r")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "recording" and manifest["recording"]["selected"] == ["l1", "l2"]
    names = {n: t["tensor"] for n, t in (("l1", manifest["recording"]["calls"][0]["fields"]["output"]["value"]),)}
    with safetensors.safe_open(str(folder / "shards" / "000000.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor(names["l1"]), rec["l1"].output)
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == ["000000.safetensors", "manifest.json"]


def test_gradients_of_a_view_output_and_missing_gradients_round_trip(tmp_path):
    net = nn.Sequential(nn.Linear(2, 4), nn.Flatten(0), nn.Linear(8, 1))
    with hookscope.capture(net, keep="all") as rec:
        y = net(torch.randn(2, 2))
        F.mse_loss(y, torch.zeros(1)).backward()
        net(torch.randn(2, 2))  # no backward: its gradients are None
    again = load(rec.save(tmp_path / "r"))
    _assert_round_trip(rec, again)
    assert again["2"].calls[1].grad_output is None and again["0"].calls[0].grad_input is None


@pytest.mark.parametrize("make", [lambda x: x.to(torch.complex64), lambda x: x.to_sparse(),
                                  lambda x: (x, {"k": [x.to(torch.uint16)]})])
def test_tensors_a_store_cannot_hold_are_refused_naming_where(tmp_path, make):
    class Returns(nn.Module):
        def forward(self, x):
            return make(x)

    net = nn.Sequential(Returns())
    with hookscope.capture(net, "0", copy="always") as rec:
        net(torch.ones(2, 2))
    with pytest.raises(RecordError, match=r"cannot save the output of '0' \(call 0\).*has no file form") as e:
        rec.save(tmp_path / "r")
    assert "\n" not in str(e.value) and not (tmp_path / "r").exists()


def test_crafted_nodes_and_calls_are_refused(tmp_path):
    import json

    import torch

    import hookscope

    net = torch.nn.Linear(2, 2)
    with hookscope.capture(net, "", keep="io") as rec:
        net(torch.ones(1, 2))
    folder = rec.save(tmp_path / "r")
    manifest = json.loads((folder / "manifest.json").read_text())
    crafted = [
        lambda m: m["recording"]["calls"][0]["fields"]["output"].update(value={"dtype": "load"}),
        lambda m: m["recording"]["calls"][0]["fields"]["output"].update(value={"int": "12"}),
        lambda m: m["recording"]["calls"][0]["fields"]["output"].update(value={"bool": "false"}),
        lambda m: m["recording"]["calls"][0].update(index=-1),
        lambda m: m["recording"]["calls"].append(dict(m["recording"]["calls"][0])),
        lambda m: m["recording"].update(keep=["output", "bogus"]),
    ]
    for i, change in enumerate(crafted):
        m = json.loads(json.dumps(manifest))
        change(m)
        (folder / "manifest.json").write_text(json.dumps(m))
        try:
            hookscope.load(folder)
        except hookscope.HookscopeError as e:
            assert "does not describe a saved recording" in str(e) and "\n" not in str(e), i
        else:
            raise AssertionError(f"crafted manifest {i} loaded")


def test_an_output_nested_too_deep_to_save_is_one_line(tmp_path):
    import torch

    import hookscope

    class Deep(torch.nn.Module):
        def forward(self, x):
            out = x
            for _ in range(3000):
                out = (out,)
            return out

    with hookscope.capture(Deep(), "", copy="always") as rec:
        Deep()(torch.ones(1))
    try:
        rec.save(tmp_path / "r")
    except hookscope.HookscopeError as e:
        assert "\n" not in str(e)
