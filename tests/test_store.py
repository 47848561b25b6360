"""The store: shards written by our code are read back exactly (by us and by the reference safetensors
package), every corruption is refused naming the file, and no crash or full disk leaves a partial file
under a final name."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import textwrap
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from forked import Forks
from torch import nn

from hookscope.errors import HookscopeError, RecordError
from hookscope.store import (
    ArraySpec, StoreWriter, clear_store, complete_shards, is_store, load_tensors, open_store, read_manifest,
    remove_damaged, remove_partial, save_tensors, shard_path, weights_hash, write_json,
)
from hookscope.store._files import CRC_KEY, crc32_combine

SPECS = [ArraySpec("f32", (3,), torch.float32), ArraySpec("f16", (2, 2), torch.float16),
         ArraySpec("bf16", (), torch.bfloat16), ArraySpec("i64", (2,), torch.int64)]
PER = 4  # samples per shard
SKIP = {5, 13}  # dataset indices skipped as unreadable
N_DATA = 15  # shards 0..3, the last one partial (12..14)


def _value(spec: ArraySpec, index: int) -> torch.Tensor:
    """The row of dataset sample ``index`` for an array: distinct per array, row and element."""
    n = max(1, int(np.prod(spec.shape)))
    base = torch.arange(n, dtype=torch.float64) * 0.25 + index * 10 + len(spec.name)
    if spec.dtype == torch.int64:
        base = base * 4 - 1000  # negatives too
    return base.to(spec.dtype).reshape(spec.shape)


def _write(root: Path, specs=SPECS, per=PER, n_data=N_DATA, skip=SKIP, buffers=2) -> list:
    with StoreWriter(root, specs, per, buffers=buffers) as wr:
        for k in range((n_data + per - 1) // per):
            buf = wr.buffer()
            kept = [i for i in range(k * per, min(n_data, (k + 1) * per)) if i not in skip]
            for row, i in enumerate(kept):
                for s in specs:
                    buf.arrays[s.name][row] = _value(s, i)
                buf.index[row] = i
            gone = [{"index": i, "id": f"img{i}", "error": "bad"} for i in range(k * per, (k + 1) * per) if i in skip]
            wr.submit(k, buf, len(kept), gone)
        infos = wr.close()
    manifest = {"schema_version": 1, "kind": "samples", "complete": True,
                "arrays": [{"name": s.name, "shape": list(s.shape), "dtype": str(s.dtype).removeprefix("torch."),
                            "reduction": "mean" if s.name == "f32" else None} for s in specs],
                "samples_per_shard": per,
                "samples": {"count": sum(i.count for i in infos), "ids": None,
                            "skipped": [s for i in infos for s in i.skipped]},
                "shards": [i.to_dict() for i in infos]}
    write_json(root / "manifest.json", manifest)
    return infos


def _kept(n_data=N_DATA, skip=SKIP) -> list[int]:
    return [i for i in range(n_data) if i not in skip]


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    _write(tmp_path)
    return tmp_path


def _expected(spec: ArraySpec) -> torch.Tensor:
    return torch.stack([_value(spec, i) for i in _kept()])


INDEXES = [3, -1, -13, slice(None), slice(2, 11), slice(1, 13, 3), slice(None, None, -2), slice(11, 2, -4),
           slice(5, 5), [12, 0, 7, 7, 3], [-1, 0], torch.tensor([9, 2, 3, 4]), np.array([1, 6]),
           torch.tensor([True, False] * 6 + [True])]
ONE_SHARD = [slice(4, 7), slice(7, 11, 2), slice(-2, None), slice(0, 1)]  # shards hold rows 0-3, 4-6, 7-10, 11-12


@pytest.mark.parametrize("index", INDEXES + ONE_SHARD, ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_round_trip_every_dtype_and_index(store_dir: Path, spec: ArraySpec, index) -> None:
    store = open_store(store_dir)
    full = _expected(spec)
    rows = range(*index.indices(len(full))) if isinstance(index, slice) else None
    want = full[torch.tensor(list(rows), dtype=torch.long)] if rows is not None else full[index]
    got = store[spec.name][index]
    assert got.dtype == spec.dtype and got.shape == want.shape and torch.equal(got, want)
    if spec.dtype != torch.bfloat16:
        assert np.array_equal(store[spec.name].numpy(index), want.numpy())
    else:
        assert np.array_equal(store[spec.name].numpy(index, dtype=np.float32), want.float().numpy())


def test_store_layout_indices_ids_and_skipped(store_dir: Path) -> None:
    store = open_store(store_dir)
    assert store.layers == ("f32", "f16", "bf16", "i64") and list(store) == list(store.layers) and len(store) == 4
    assert store.samples == 13 and store["f16"].shape == (13, 2, 2) and len(store["i64"]) == 13
    assert store.indices.tolist() == _kept() and store.ids == [str(i) for i in _kept()]
    assert [s["id"] for s in store.skipped] == ["img5", "img13"]
    assert [e["count"] for e in store.manifest["shards"]] == [4, 3, 4, 2]
    assert torch.equal(store["f32"].tensor(), _expected(SPECS[0]))
    assert "f32" in store and "nope" not in store and 3 not in store


# ---- every read is the stored values, in a tensor of its own ----

def _file_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "shards").iterdir())}


def _writes(spec: ArraySpec) -> dict[str, object]:
    """In-place writes of every kind into a tensor a read returned (each changes every element it can)."""
    floats = spec.dtype.is_floating_point
    return {
        "sub_": lambda t: t.sub_(t.float().mean(0).to(t.dtype) if floats else t[:1] + 1 if t.ndim else t + 1),
        "zero_": lambda t: t.zero_(),
        "relu_": lambda t: t.relu_() if floats else t.clamp_(min=0),
        "neg_": lambda t: t.neg_(),
        "setitem": lambda t: t.__setitem__(..., 7),
        "out=": lambda t: torch.add(t, 3, out=t),
        "view_write": lambda t: t.view(-1).fill_(-5) if t.is_contiguous() else t.fill_(-5),
    }


TUPLES = [(3, 0), (slice(2, 11), 0), ([4, 1], 0), (Ellipsis, 0), (slice(None), slice(1, None)), (slice(4, 7), 1)]


@pytest.mark.parametrize("index", INDEXES + ONE_SHARD + TUPLES, ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_writes_into_a_read_change_no_later_read(store_dir: Path, spec: ArraySpec, index) -> None:
    if isinstance(index, tuple) and not spec.shape and index[0] is not Ellipsis:
        pytest.skip("a 0-d row has no second index")
    before = _file_bytes(store_dir)
    store = open_store(store_dir)
    arr = store[spec.name]
    full = _expected(spec)
    want = arr[index].clone()
    for name, write in _writes(spec).items():
        got = arr[index]
        if got.numel() == 0:
            continue
        write(got)
        assert not torch.equal(got, want) or name in ("relu_",), name  # the write did change the read
        assert torch.equal(arr[index], want), name  # the same read again: the stored values
        assert torch.equal(arr[:], full) and torch.equal(arr.tensor(), full), name
        assert torch.equal(arr[3], full[3]) and torch.equal(arr[[0, 12]], full[[0, 12]]), name
    if spec.dtype != torch.bfloat16:
        a = arr.numpy(index if not isinstance(index, tuple) else slice(None))
        if a.size:
            a[...] = 0
            a += 1
        assert np.array_equal(arr.numpy(), full.numpy())
    assert _file_bytes(store_dir) == before
    assert torch.equal(open_store(store_dir)[spec.name][:], full)


BIG = [ArraySpec("f32", (512,), torch.float32), ArraySpec("bf16", (512,), torch.bfloat16),
       ArraySpec("i64", (4,), torch.int64)]


def _file_maps(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, permissions) of this process's mappings of ``path``."""
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == str(path.resolve()):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            found.append((lo, hi, parts[1]))
    return found


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings from /proc")
def test_big_reads_are_private_maps_of_the_file_not_copies(tmp_path: Path) -> None:
    _write(tmp_path, specs=BIG, per=1024, n_data=2500, skip=set())  # f32 2 MiB and bf16 1 MiB a shard
    before = _file_bytes(tmp_path)
    store = open_store(tmp_path)
    arr = store["f32"]
    full = torch.stack([_value(BIG[0], i) for i in range(2500)])
    a, b = arr[0:1000], arr[0:1000]  # 2 MB each: one shard, zero-copy
    assert a.data_ptr() != b.data_ptr()
    maps = _file_maps(shard_path(tmp_path, 0))
    for t in (a, b):  # each read is a view of its own private (copy-on-write) mapping of the file
        assert [m for m in maps if m[0] <= t.data_ptr() < m[1] and m[2] == "rw-p"]
    a -= a.mean(0)
    b.relu_()
    b[5] = 0
    assert torch.equal(arr[0:1000], full[:1000]) and torch.equal(arr[10], full[10])
    assert torch.equal(arr[1024:2048:2], full[1024:2048:2])  # a strided view of another map
    small = arr[7]  # 2 KB: a copy, not a map
    assert not [m for m in _file_maps(shard_path(tmp_path, 0)) if m[0] <= small.data_ptr() < m[1]]
    bf = store["bf16"][1024:2048]  # bf16: 1 MiB, a view of a private map too
    bf.mul_(2)
    assert torch.equal(store["bf16"][1024:2048], torch.stack([_value(BIG[1], i) for i in range(1024, 2048)]))
    assert _file_bytes(tmp_path) == before


def test_a_one_shard_store_tensor_and_numpy_are_private(tmp_path: Path) -> None:
    _write(tmp_path, specs=BIG, per=1024, n_data=1000, skip=set())
    arr = open_store(tmp_path)["f32"]
    full = torch.stack([_value(BIG[0], i) for i in range(1000)])
    t = arr.tensor()
    t.zero_()
    a = arr.numpy()
    a -= a.mean(0)
    np.maximum(a, 0, out=a)
    assert torch.equal(arr.tensor(), full) and np.array_equal(arr.numpy(), full.numpy())
    assert torch.equal(arr[:], full) and torch.equal(open_store(tmp_path)["f32"][:], full)


def test_rows_over_a_mebibyte_are_private_maps_by_int_too(tmp_path: Path) -> None:
    spec = ArraySpec("huge", (3, 512, 256), torch.float32)  # 1.5 MiB a row
    _write(tmp_path, specs=[spec], per=2, n_data=5, skip=set())
    arr = open_store(tmp_path)["huge"]
    for i in (0, 3, -1):
        got = arr[i]
        assert [m for m in _file_maps(shard_path(tmp_path, (i % 5) // 2)) if m[0] <= got.data_ptr() < m[1]]
        got.mul_(-1)
        got[0, 0, 0] = 1e30
        assert torch.equal(arr[i], _value(spec, i % 5)) and torch.equal(arr[i, 1], _value(spec, i % 5)[1])


def test_a_shard_replaced_after_opening_is_refused_not_misread(tmp_path: Path) -> None:
    _write(tmp_path, specs=BIG, per=1024, n_data=2500, skip=set())
    store = open_store(tmp_path)
    arr = store["f32"]
    assert torch.equal(arr[5], _value(BIG[0], 5))  # shard 0 mapped by the store
    for k in (0, 2):  # another run writes them again: new files under the same names
        path = shard_path(tmp_path, k)
        copy = path.with_name("copy")
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)
    with pytest.raises(HookscopeError, match=r"000000\.safetensors was replaced since the store was opened"):
        arr[0:1000]
    with pytest.raises(HookscopeError, match=r"000002\.safetensors was replaced since the store was opened"):
        arr[2100]
    assert torch.equal(open_store(tmp_path)["f32"][0:1000], torch.stack([_value(BIG[0], i) for i in range(1000)]))


def test_many_live_big_reads_hold_no_file_descriptors(tmp_path: Path) -> None:
    _write(tmp_path, specs=BIG[:1], per=1024, n_data=2048, skip=set())
    arr = open_store(tmp_path)["f32"]
    arr[0]  # the store's own maps: opened once
    fds = len(os.listdir("/proc/self/fd"))
    live = [arr[(k % 2) * 1024:(k % 2) * 1024 + 600] for k in range(300)]
    assert len(os.listdir("/proc/self/fd")) - fds <= 2
    live[0].zero_()
    live[1].fill_(3)
    assert torch.equal(live[2], arr[0:600]) and torch.equal(live[3], arr[1024:1624])
    assert live[0].abs().sum() == 0 and bool((live[1] == 3).all())


def test_threads_read_while_others_write_their_own_copies(tmp_path: Path) -> None:
    _write(tmp_path, specs=BIG[:1], per=1024, n_data=2500, skip=set())
    arr = open_store(tmp_path)["f32"]
    full = torch.stack([_value(BIG[0], i) for i in range(2500)])
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            lo = rng.randrange(0, 2400)
            hi = min(2500, lo + rng.choice([1, 5, 700]))
            got = arr[lo:hi] if rng.random() < 0.7 else arr[lo]
            want = full[lo:hi] if got.ndim == 2 else full[lo]
            if not torch.equal(got, want):
                errors.append(f"thread {seed}: rows {lo}:{hi} differ")
            got.fill_(seed)  # this thread's copy only

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and torch.equal(arr[:], full)


def test_indices_are_a_copy_each_time(store_dir: Path) -> None:
    store = open_store(store_dir)
    got = store.indices
    got += 100
    assert store.indices.tolist() == _kept() and store.ids == [str(i) for i in _kept()]


def test_out_of_range_and_bad_indexes(store_dir: Path) -> None:
    arr = open_store(store_dir)["f16"]
    for bad in (13, -14, [0, 13], torch.tensor([-14])):
        with pytest.raises(IndexError):
            arr[bad]
    with pytest.raises(IndexError):
        arr[torch.tensor([True, False])]
    with pytest.raises(IndexError):
        arr[0, 2]
    assert torch.equal(arr[3, 1], _expected(SPECS[1])[3, 1]) and torch.equal(arr[2:9, :, 0], _expected(SPECS[1])[2:9, :, 0])
    assert torch.equal(arr[..., 1], _expected(SPECS[1])[..., 1]) and torch.equal(arr[[4, 1], 0, 1], _expected(SPECS[1])[[4, 1], 0, 1])
    assert arr[[]].shape == (0, 2, 2) and arr[20:30].shape == (0, 2, 2)


def test_bfloat16_numpy_refuses_without_dtype(store_dir: Path) -> None:
    with pytest.raises(HookscopeError, match=r"bfloat16.*numpy has no.*dtype=np.float32"):
        open_store(store_dir)["bf16"].numpy()


def test_store_speaks_the_result_protocol(store_dir: Path) -> None:
    store = open_store(store_dir)
    text = str(store)
    assert "13 samples in 4 shards" in text and "13x2x2" in text and "bfloat16" in text and "mean" in text
    assert "2 samples skipped" in text and "\n" not in repr(store) and "13 samples" in repr(store)
    d = json.loads(store.to_json())
    assert d["samples"] == 13 and [a["name"] for a in d["arrays"]] == list(store.layers)
    assert d["arrays"][0]["mb"] == pytest.approx(13 * 3 * 4 / 1e6)
    with pytest.raises(RecordError, match="f32"):
        store["f33"]


def test_reference_safetensors_reads_every_shard(store_dir: Path) -> None:
    safetensors = pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    store = open_store(store_dir)
    for entry in store.manifest["shards"]:
        path = store_dir / entry["file"]
        with safetensors.safe_open(str(path), "pt") as f:
            rows = f.get_tensor("__index__").tolist()
            assert f.metadata()["hookscope_shard"] == str(entry["shard"])
            gone = json.loads(f.metadata()["skipped"])
            assert [g["index"] for g in gone] == [i for i in SKIP if i // PER == entry["shard"]]
            for s in SPECS:
                want = torch.stack([_value(s, i) for i in rows]) if rows else torch.empty(0, *s.shape)
                assert torch.equal(f.get_tensor(s.name), want.to(s.dtype))
    _write(store_dir / "np", specs=[s for s in SPECS if s.dtype != torch.bfloat16])
    arrays = load_file(str(shard_path(store_dir / "np", 1)))
    assert arrays["__index__"].tolist() == [4, 6, 7] and arrays["f16"].dtype == np.float16
    assert np.array_equal(arrays["i64"], open_store(store_dir)["i64"][4:7].numpy())


ODD = {
    "scalar": torch.tensor(2.5), "empty": torch.ones(0, 3), "empty_bf16": torch.ones(2, 0, dtype=torch.bfloat16),
    "transposed": torch.arange(12.0).reshape(3, 4).t(), "strided": torch.arange(20, dtype=torch.int16)[::3],
    "bool": torch.tensor([[True, False], [False, True]]), "bf16": torch.randn(3, 5).to(torch.bfloat16),
    "f64": torch.randn(2, 1, 2, dtype=torch.float64), "u8": torch.arange(7, dtype=torch.uint8),
    "i8": torch.tensor([-128, 127], dtype=torch.int8), "i32": torch.tensor([-(2 ** 31)], dtype=torch.int32),
    "expanded": torch.ones(1, 3).expand(4, 3), "name with.dots/and spaces": torch.ones(1),
}


def test_save_tensors_round_trip_odd_shapes(tmp_path: Path) -> None:
    out = save_tensors(tmp_path / "rec", ODD, {"kind": "recording", "calls": {"a": 2}})
    tensors, manifest = load_tensors(out)
    assert list(tensors) == list(ODD)
    for name, t in ODD.items():
        assert tensors[name].dtype == t.dtype and tensors[name].shape == t.shape and torch.equal(tensors[name], t), name
    assert manifest["kind"] == "recording" and manifest["calls"] == {"a": 2} and manifest["complete"] is True
    assert set(manifest["versions"]) == {"hookscope", "torch", "python"}
    tensors["bf16"] += 1  # the loaded tensors are the caller's: writable, the file unchanged
    assert torch.equal(load_tensors(out)[0]["bf16"], ODD["bf16"])
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(out / "shards" / "000000.safetensors"), "pt") as f:
        for name, t in ODD.items():
            assert torch.equal(f.get_tensor(name), t), name


def test_save_tensors_refusals(tmp_path: Path) -> None:
    save_tensors(tmp_path / "a", {"x": torch.ones(2)}, {"kind": "recording"})
    with pytest.raises(HookscopeError, match="not empty.*overwrite=True"):
        save_tensors(tmp_path / "a", {"x": torch.ones(2)}, {"kind": "recording"})
    out = save_tensors(tmp_path / "a", {"y": torch.zeros(1)}, {"kind": "recording"}, overwrite=True)
    assert list(load_tensors(out)[0]) == ["y"]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    with pytest.raises(HookscopeError, match="holds no hookscope store"):
        save_tensors(tmp_path / "b", {"x": torch.ones(2)}, {"kind": "recording"}, overwrite=True)
    assert (tmp_path / "b" / "notes.txt").read_text() == "mine"
    with pytest.raises(HookscopeError, match="complex64.*cast it"):
        save_tensors(tmp_path / "c", {"z": torch.ones(2, dtype=torch.complex64)}, {"kind": "recording"})
    with pytest.raises(HookscopeError, match="kind"):
        save_tensors(tmp_path / "d", {"x": torch.ones(2)}, {})
    with pytest.raises(HookscopeError, match="shards"):
        save_tensors(tmp_path / "d", {"x": torch.ones(2)}, {"kind": "r", "shards": 1})


def test_load_tensors_refuses_corruption(tmp_path: Path) -> None:
    out = save_tensors(tmp_path / "r", {"x": torch.arange(10.0)}, {"kind": "recording"})
    shard = out / "shards" / "000000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(HookscopeError, match=r"000000\.safetensors.*crc32"):
        load_tensors(out)
    shard.write_bytes(bytes(data[:-1]))
    with pytest.raises(HookscopeError, match=r"000000\.safetensors"):
        load_tensors(out)
    (out / "manifest.json").write_text((out / "manifest.json").read_text()[:40])
    with pytest.raises(HookscopeError, match=r"manifest\.json is not valid JSON"):
        load_tensors(out)


# ---- refusals of a corrupted store: each message names the file ----

def _edit_manifest(root: Path, change) -> None:
    m = json.loads((root / "manifest.json").read_text())
    change(m)
    (root / "manifest.json").write_text(json.dumps(m))


def _refused(root: Path, pattern: str, *, read: bool = False, verify: bool = True) -> str:
    with pytest.raises(HookscopeError, match=pattern) as info:
        store = open_store(root, verify=verify)
        if read:
            for name in store.layers:
                store[name][:]
    message = str(info.value)
    assert "\n" not in message
    return message


def test_truncated_and_missing_manifest(store_dir: Path) -> None:
    text = (store_dir / "manifest.json").read_text()
    (store_dir / "manifest.json").write_text(text[: len(text) // 2])
    _refused(store_dir, r"manifest\.json is not valid JSON")
    (store_dir / "manifest.json").unlink()
    _refused(store_dir, r"manifest\.json is missing")


def test_missing_extra_and_truncated_shards(store_dir: Path) -> None:
    two = shard_path(store_dir, 2)
    data = two.read_bytes()
    two.write_bytes(data[:-1])
    _refused(store_dir, r"000002\.safetensors holds \d+ bytes but .*manifest\.json says")
    two.unlink()
    _refused(store_dir, r"000002\.safetensors is missing \(listed in .*manifest\.json\)")
    two.write_bytes(data)
    open_store(store_dir)
    shard_path(store_dir, 9).write_bytes(data)
    _refused(store_dir, r"000009\.safetensors is not listed in .*manifest\.json")


def test_every_flipped_header_byte_is_refused(store_dir: Path) -> None:
    path = shard_path(store_dir, 1)
    good = path.read_bytes()
    n = int.from_bytes(good[:8], "little")
    for at in range(0, 8 + n):
        bad = bytearray(good)
        bad[at] ^= 0x04
        path.write_bytes(bytes(bad))
        message = _refused(store_dir, "", read=True)
        assert "000001.safetensors" in message, (at, message)
    path.write_bytes(good)
    assert torch.equal(open_store(store_dir)["f32"][:], _expected(SPECS[0]))


def test_flipped_data_byte_refused_with_verify_read_without(store_dir: Path) -> None:
    path = shard_path(store_dir, 3)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor's data
    path.write_bytes(bytes(data))
    store = open_store(store_dir)  # headers are fine: opening succeeds, the first read of shard 3 refuses
    assert torch.equal(store["f32"][:4], _expected(SPECS[0])[:4])
    with pytest.raises(HookscopeError, match=r"000003\.safetensors is corrupted: its crc32.*verify=False"):
        store["f32"][-1]
    lax = open_store(store_dir, verify=False)
    assert lax.samples == 13 and lax["f32"][-2:].shape == (2, 3)


@pytest.mark.parametrize("change, pattern", [
    (lambda m: m.update(schema_version=2), r"manifest\.json has schema_version 2"),
    (lambda m: m.update(complete=False), r"is an unfinished store.*--resume"),
    (lambda m: m.update(kind="recording"), r"Recording\.save.*hookscope\.load"),
    (lambda m: m["arrays"][1].update(shape=[2, 3]), r"000000\.safetensors holds float16 4x2x2 as 'f16' but .*manifest\.json says float16 4x2x3"),
    (lambda m: m["arrays"][0].update(dtype="float64"), r"holds float32 4x3 as 'f32' but .*manifest\.json says float64"),
    (lambda m: m["arrays"].pop(2), r"holds bfloat16 4 as 'bf16' but .*manifest\.json says nothing"),
    (lambda m: m["arrays"].append({"name": "new", "shape": [1], "dtype": "float32"}), r"holds nothing as 'new'"),
    (lambda m: m["shards"][1].update(count=4), r"000001\.safetensors holds int64 3 as '__index__' but .*says int64 4"),
    (lambda m: m["shards"][1].update(bytes=1), r"000001\.safetensors holds \d+ bytes but"),
    (lambda m: m["samples"].update(count=14), r"manifest\.json says 14 samples but its shards hold 13"),
    (lambda m: m["samples"].update(ids=["a"]), r"manifest\.json lists 1 sample ids for 13"),
    (lambda m: m["shards"].pop(), r"000003\.safetensors is not listed"),
    (lambda m: m.update(shards="x"), r"manifest\.json has an invalid 'shards' list"),
], ids=range(13))
def test_manifest_that_does_not_match_the_shards(store_dir: Path, change, pattern) -> None:
    _edit_manifest(store_dir, change)
    _refused(store_dir, pattern)


def test_crc_in_manifest_checked_on_first_read_only(store_dir: Path) -> None:
    _edit_manifest(store_dir, lambda m: m["shards"][0].update(crc32=m["shards"][0]["crc32"] ^ 1))
    store = open_store(store_dir)
    assert torch.equal(store["f32"][4:7], _expected(SPECS[0])[4:7])  # shard 1 only
    with pytest.raises(HookscopeError, match=r"000000\.safetensors is corrupted"):
        store.indices


# ---- the writer ----

def test_buffers_are_reused_and_bounded(tmp_path: Path) -> None:
    seen: set[int] = set()
    spec = [ArraySpec("a", (64,), torch.float32)]
    with StoreWriter(tmp_path, spec, 8, buffers=3) as wr:
        writers = [t for t in threading.enumerate() if t.name == "hookscope-store-writer"]
        assert len(writers) == 1 and writers[0].daemon
        for k in range(12):
            buf = wr.buffer()
            seen.add(buf.arrays["a"].data_ptr())
            buf.arrays["a"].fill_(k)
            buf.index.copy_(torch.arange(8) + 8 * k)
            wr.submit(k, buf, 8)
        infos = wr.close()
    assert len(seen) == 3
    assert not [t for t in threading.enumerate() if t.name == "hookscope-store-writer"]
    assert [i.shard for i in infos] == list(range(12)) and infos == list(complete_shards(tmp_path).values())
    for k in range(12):
        data = shard_path(tmp_path, k).read_bytes()
        assert zlib.crc32(data) == infos[k].crc32 and len(data) == infos[k].bytes
    write_json(tmp_path / "manifest.json", {"schema_version": 1, "kind": "samples", "complete": True,
               "arrays": [{"name": "a", "shape": [64], "dtype": "float32"}], "samples": {"count": 96},
               "shards": [i.to_dict() for i in infos]})
    assert open_store(tmp_path)["a"][:, 0].tolist() == [float(i // 8) for i in range(96)]


def test_writer_error_is_raised_by_later_calls_and_leaves_no_tmp(tmp_path: Path) -> None:
    spec = [ArraySpec("a", (2,), torch.float32)]
    wr = StoreWriter(tmp_path, spec, 4)
    buf = wr.buffer()
    buf.index.zero_()
    wr.submit(0, buf, 4)

    def boom() -> None:
        raise RuntimeError("device lost")

    wr.submit(1, wr.buffer(), 4, ready=boom)
    with pytest.raises(HookscopeError, match=r"000001\.safetensors failed \(RuntimeError: device lost\)"):
        for _ in range(100):
            wr.buffer()
            time.sleep(0.01)
    with pytest.raises(HookscopeError, match="device lost"):
        wr.submit(2, buf, 1)
    with pytest.raises(HookscopeError, match="device lost"):
        wr.close()
    wr.abort()
    wr.abort()
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == ["000000.safetensors"]


def test_writer_refuses_bad_arguments(tmp_path: Path) -> None:
    spec = [ArraySpec("a", (2,), torch.float32)]
    with pytest.raises(HookscopeError, match="reserved"):
        StoreWriter(tmp_path, [ArraySpec("__index__", (), torch.int64)], 4)
    with pytest.raises(HookscopeError, match="share a name"):
        StoreWriter(tmp_path, spec * 2, 4)
    with pytest.raises(HookscopeError, match="complex64"):
        StoreWriter(tmp_path, [ArraySpec("c", (), torch.complex64)], 4)
    with StoreWriter(tmp_path, spec, 4) as wr:
        with pytest.raises(HookscopeError, match="count must lie in 0..4"):
            wr.submit(0, wr.buffer(), 5)
        with pytest.raises(HookscopeError, match="did not give"):
            wr.submit(0, StoreWriter(tmp_path / "o", spec, 4).buffer(), 1)
    with pytest.raises(HookscopeError, match="closed"):
        wr.buffer()


def test_abort_drops_queued_work(tmp_path: Path) -> None:
    gate = threading.Event()
    with pytest.raises(KeyboardInterrupt):
        with StoreWriter(tmp_path, [ArraySpec("a", (2,), torch.float32)], 4) as wr:
            wr.submit(0, wr.buffer(), 0, ready=gate.wait)
            wr.submit(1, wr.buffer(), 0)
            threading.Timer(0.05, gate.set).start()
            raise KeyboardInterrupt
    # shard 0 may have been written before the abort reached it; shard 1 was dropped
    assert not shard_path(tmp_path, 1).exists()
    assert all(not p.name.startswith(".") for p in (tmp_path / "shards").iterdir())


def test_complete_shards_ignores_and_remove_partial_removes_tmp(tmp_path: Path) -> None:
    infos = _write(tmp_path)
    tmp = tmp_path / "shards" / ".000004.safetensors.tmp-999"
    tmp.write_bytes(b"partial")
    (tmp_path / ".manifest.json.tmp-999").write_text("{")
    assert list(complete_shards(tmp_path).values()) == infos
    remove_partial(tmp_path)
    assert not tmp.exists() and not (tmp_path / ".manifest.json.tmp-999").exists()
    path = shard_path(tmp_path, 2)
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(HookscopeError, match=r"000002\.safetensors is not a valid shard"):
        complete_shards(tmp_path)


# ---- each shard carries the crc32 of its data ----

def _header(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(data[8:8 + int.from_bytes(data[:8], "little")])


def _data(path: Path) -> bytes:
    data = path.read_bytes()
    return data[8 + int.from_bytes(data[:8], "little"):]


def test_every_shard_carries_the_crc32_of_its_data(tmp_path: Path) -> None:
    infos = _write(tmp_path)
    for info in infos:
        path = tmp_path / info.file
        assert _header(path)["__metadata__"][CRC_KEY] == str(zlib.crc32(_data(path)))
        assert info.crc32 == zlib.crc32(path.read_bytes()) and info.bytes == path.stat().st_size
    saved = save_tensors(tmp_path / "saved", {"a": torch.arange(5)}, {"kind": "demo"})
    path = shard_path(saved, 0)
    assert _header(path)["__metadata__"][CRC_KEY] == str(zlib.crc32(_data(path)))
    assert load_tensors(saved)[0]["a"].tolist() == [0, 1, 2, 3, 4]


def test_crc32_combine_equals_zlib_on_every_split() -> None:
    rng = random.Random(0)
    for n in [0, 1, 2, 3, 7, 8, 255, 256, 4096, 100_003]:
        data = rng.randbytes(n)
        for cut in {0, n // 3, n // 2, n}:
            a, b = data[:cut], data[cut:]
            assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data), (n, cut)


def _restamp(path: Path, header: dict) -> None:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + _data(path))


@pytest.mark.parametrize("damage", ["data byte", "checksum", "no checksum"])
def test_complete_shards_refuses_and_remove_damaged_removes_a_damaged_shard(tmp_path: Path, damage: str) -> None:
    infos = _write(tmp_path)
    path = shard_path(tmp_path, 2)
    header = _header(path)
    if damage == "data byte":
        data = bytearray(path.read_bytes())
        data[-9] ^= 0x80  # a sign bit inside the i64 rows
        path.write_bytes(bytes(data))
        why = r"its data's crc32 is \d+ but its header says \d+"
    elif damage == "checksum":
        header["__metadata__"][CRC_KEY] = str(int(header["__metadata__"][CRC_KEY]) ^ 1)
        _restamp(path, header)
        why = r"its data's crc32 is \d+ but its header says \d+"
    else:
        header["__metadata__"].pop(CRC_KEY)
        _restamp(path, header)
        why = r"it carries no checksum of its data \(an older hookscope wrote it\)"
    with pytest.raises(HookscopeError, match=rf"000002\.safetensors is damaged: {why}; delete it and write it again"):
        complete_shards(tmp_path)
    lines = remove_damaged(tmp_path)
    assert len(lines) == 1 and re.search(rf"000002\.safetensors was removed and is written again: it is damaged: {why}$",
                                         lines[0])
    assert not path.exists() and list(complete_shards(tmp_path).values()) == [infos[0], infos[1], infos[3]]
    assert remove_damaged(tmp_path) == []  # the sound ones stay


def test_remove_damaged_leaves_sound_shards_and_takes_every_damaged_one(tmp_path: Path) -> None:
    _write(tmp_path)
    for k in (0, 3):
        path = shard_path(tmp_path, k)
        path.write_bytes(path.read_bytes()[:-1] + bytes([path.read_bytes()[-1] ^ 1]))
    shard_path(tmp_path, 5).write_bytes(b"12345678")  # a header length larger than the file
    lines = remove_damaged(tmp_path)
    assert [line.split("shards/")[1].split(" ")[0] for line in lines] == [
        "000000.safetensors", "000003.safetensors", "000005.safetensors"]
    assert "is not a valid shard (the header length" in lines[2]
    assert sorted(complete_shards(tmp_path)) == [1, 2]


def test_reading_checks_the_shards_own_checksum_too(store_dir: Path) -> None:
    path = shard_path(store_dir, 1)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))  # damaged, then certified with the damaged file's crc32 (as a bad copy would)
    _edit_manifest(store_dir, lambda m: m["shards"][1].update(crc32=zlib.crc32(bytes(data))))
    store = open_store(store_dir)
    assert torch.equal(store["f32"][:4], _expected(SPECS[0])[:4])
    with pytest.raises(HookscopeError, match=r"000001\.safetensors is corrupted: its data's crc32 is \d+ but its "
                                             r"header says \d+; .*verify=False"):
        store["f32"][5]
    assert open_store(store_dir, verify=False)["f32"][5].shape == (3,)


def test_clear_store_and_is_store(tmp_path: Path) -> None:
    assert not is_store(tmp_path)
    _write(tmp_path)
    assert is_store(tmp_path)
    (tmp_path / "shards" / ".000001.safetensors.tmp-7").write_bytes(b"x")
    (tmp_path / "shards" / "notes.txt").write_text("mine")
    with pytest.raises(HookscopeError, match=r"notes\.txt, which is not part of a hookscope store"):
        clear_store(tmp_path)
    assert shard_path(tmp_path, 0).exists() and (tmp_path / "manifest.json").exists()
    assert not is_store(tmp_path / "shards")
    (tmp_path / "shards" / "notes.txt").unlink()
    (tmp_path / "other").mkdir()
    with pytest.raises(HookscopeError, match="other"):
        clear_store(tmp_path)
    (tmp_path / "other").rmdir()
    clear_store(tmp_path)
    assert list(tmp_path.iterdir()) == [] and not is_store(tmp_path)


def test_read_manifest_refusals(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(HookscopeError, match=r"manifest\.json is not a hookscope manifest"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe")
    with pytest.raises(HookscopeError, match=r"manifest\.json is not valid JSON"):
        read_manifest(tmp_path)
    write_json(tmp_path / "manifest.json", {"schema_version": 1, "kind": "samples", "complete": False})
    assert read_manifest(tmp_path)["complete"] is False  # a resume reads an unfinished manifest


def test_weights_hash_sees_every_weight() -> None:
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    twin = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    twin.load_state_dict(net.state_dict())
    assert weights_hash(net) == weights_hash(twin)
    with torch.no_grad():
        twin[0].weight[2, 1] += 1e-6
    assert weights_hash(net) != weights_hash(twin)
    twin.load_state_dict(net.state_dict())
    twin[1].num_batches_tracked += 1  # buffers count too
    assert weights_hash(net) != weights_hash(twin)
    before = weights_hash(net)
    assert weights_hash(net.half()) != before  # dtypes count


# ---- real processes: a disk that fills up, a SIGKILL at any moment ----

CHILD = textwrap.dedent("""
    import resource, signal, sys, torch
    from hookscope.errors import HookscopeError
    from hookscope.store import ArraySpec, StoreWriter
    root, mode, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spec = [ArraySpec("a", (1024,), torch.float32)]
    if mode == "full":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        with StoreWriter(root, spec, 64, buffers=2) as wr:
            print("ready", flush=True)
            for step in range(10**6):
                k = step if mode == "full" else step % 40  # rewrites replace complete shards: atomic too
                buf = wr.buffer()
                count = min(64, 8 * (k + 1)) if mode == "full" else 64
                buf.arrays["a"][:count] = k
                buf.index[:count] = torch.arange(count) + 64 * k
                wr.submit(k, buf, count)
                if mode == "full" and k == 20:
                    break
    except HookscopeError as e:
        print(e, file=sys.stderr)
        sys.exit(3)
""")


def _child(forks: Forks, root: Path, mode: str, limit: int = 0) -> int:
    """Start the writer in a process of its own; its pid."""
    return forks.start(["-c", str(root), mode, str(limit)], code=CHILD)


def _all_final_files_valid(root: Path) -> dict:
    found = complete_shards(root)  # raises on any partial or corrupt file
    safetensors = pytest.importorskip("safetensors")
    for k, info in found.items():
        with safetensors.safe_open(str(root / info.file), "pt") as f:
            a = f.get_tensor("a")
            assert torch.equal(a, torch.full((info.count, 1024), float(k)))
            assert f.get_tensor("__index__").tolist() == list(range(64 * k, 64 * k + info.count))
    return found


def test_disk_full_keeps_complete_shards(tmp_path: Path, forks: Forks) -> None:
    # shard k holds 8(k+1) rows of 4 KiB: shards 0..2 fit in 120 KiB, shard 3 (128 KiB + header) does not
    done = forks.wait(_child(forks, tmp_path, "full", 120 * 1024))
    assert done.returncode == 3, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line
    assert line.startswith(f"disk full while writing {shard_path(tmp_path, 3)} (File too large)")
    assert "keeps its 3 complete shards" in line and "--resume" in line
    found = _all_final_files_valid(tmp_path)
    assert sorted(found) == [0, 1, 2] and [i.count for i in found.values()] == [8, 16, 24]
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [f"00000{k}.safetensors" for k in range(3)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_any_moment_leaves_only_complete_files(tmp_path: Path, seed: int, forks: Forks) -> None:
    pid = _child(forks, tmp_path, "loop")
    try:
        deadline = time.monotonic() + 120
        while forks.printed(pid) != "ready\n":
            assert forks.poll(pid) is None and time.monotonic() < deadline, forks.wait(pid).stderr
            time.sleep(0.005)
        time.sleep(random.Random(seed).uniform(0.05, 0.6))
    finally:
        if forks.poll(pid) is None:
            os.kill(pid, signal.SIGKILL)
    assert forks.wait(pid).returncode == -signal.SIGKILL
    found = _all_final_files_valid(tmp_path)
    assert sorted(found) == list(range(len(found)))  # written in order: no gap among complete shards
    assert len(found) >= 1
    remove_partial(tmp_path)
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [f"{k:06d}.safetensors" for k in found]


def test_a_shard_whose_samples_were_all_skipped(tmp_path: Path) -> None:
    skip = {4, 5, 6, 7, 14}
    _write(tmp_path, skip=skip)
    store = open_store(tmp_path)
    kept = _kept(skip=skip)
    assert [e["count"] for e in store.manifest["shards"]] == [4, 0, 4, 2] and store.samples == len(kept) == 10
    assert store.indices.tolist() == kept
    for spec in SPECS:
        want = torch.stack([_value(spec, i) for i in kept])
        assert torch.equal(store[spec.name][:], want) and torch.equal(store[spec.name][3:6], want[3:6])
        assert torch.equal(store[spec.name][4], want[4]) and torch.equal(store[spec.name][[9, 3, 4]], want[[9, 3, 4]])


def test_many_shards_stay_within_the_mapped_limit(tmp_path: Path) -> None:
    spec = [ArraySpec("a", (2,), torch.int32)]
    _write(tmp_path, specs=spec, per=1, n_data=150, skip=set())
    store = open_store(tmp_path)
    first = store["a"][0]  # a view of shard 0's map, which later reads push out of the store's cache
    assert store["a"][:].tolist() == [_value(spec[0], i).tolist() for i in range(150)]
    assert first.tolist() == _value(spec[0], 0).tolist() and store["a"][torch.tensor(149)].tolist() == [1491, 1491]
    fds = len(os.listdir("/proc/self/fd"))
    for i in range(150):
        store["a"][i]
    assert len(os.listdir("/proc/self/fd")) - fds <= 70
