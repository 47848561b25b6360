"""compare_models (before/after table) and diff of a pruned model against the original.

Every number is worked out by hand from the layer sizes: Conv2d(3, 8, 3, padding=1) on 2x3x6x6 is
2*8*6*6 outputs x 27 products; Conv2d(8, 4, 3) gives 2*4*4*4 outputs x 72; Linear(64, 5) 2*5 x 64.
"""

import io
import json

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import hookscope
from hookscope.analysis.prune.compare import compare_models
from hookscope.core import hook_count
from hookscope.errors import ForwardError, HookscopeError, RecordError

X = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
DENSE_MACS = 2 * 8 * 36 * 27 + 2 * 4 * 16 * 72 + 2 * 5 * 64  # 15,552 + 9,216 + 640


def _net(width: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, 4, 3), nn.Flatten(), nn.Linear(64, 5),
    ).eval()


def _pruned() -> nn.Module:
    net = _net()
    prune.l1_unstructured(net[0], "weight", amount=0.3)  # 65 of 216
    prune.l1_unstructured(net[4], "weight", amount=0.3)  # 96 of 320
    prune.ln_structured(net[2], "weight", amount=0.5, n=2, dim=0)  # 2 channels of 72
    return net


def _channel_pruned() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """Half the output channels of net[0] masked (weights and biases), and the model built without them."""
    masked = _net()
    prune.ln_structured(masked[0], "weight", amount=0.5, n=2, dim=0)
    keep = masked[0].weight_mask.flatten(1).any(1)
    prune.custom_from_mask(masked[0], "bias", keep.float())  # torch keeps a pruned channel's bias otherwise
    small = _net(width=4)
    with torch.no_grad():
        small[0].weight.copy_(masked[0].weight_orig[keep])
        small[0].bias.copy_(masked[0].bias_orig[keep])
        small[2].weight.copy_(masked[2].weight[:, keep])
        small[2].bias.copy_(masked[2].bias)
        small[4].load_state_dict(masked[4].state_dict())
    return masked, small, keep


def _saved_bytes(model: nn.Module) -> int:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return len(buf.getvalue())


def test_values_worked_out_by_hand():
    net, pruned = _net(), _pruned()
    c = compare_models(net, pruned, X, repeats=2, warmup=0)
    assert (c["parameters"].before, c["parameters"].after) == (841, 841)  # 224 + 292 + 325, weight_orig once
    assert (c["nonzero parameters"].before, c["nonzero parameters"].after) == (841, 841 - 65 - 144 - 96)
    assert (c["multiply-adds"].before, c["multiply-adds"].after) == (DENSE_MACS, DENSE_MACS)
    # each weight element takes part in equally many products: 2*6*6 in conv 0, 2*4*4 in conv 2, 2 in fc
    sparse = 72 * (216 - 65) + 32 * (288 - 144) + 2 * (320 - 96)
    assert c["nonzero-weight multiply-adds"].after == sparse == 10_872 + 4_608 + 448
    assert c["file size"].before == _saved_bytes(net) and c["file size"].after == _saved_bytes(pruned)
    assert c["file size"].ratio > 1.5  # weight_orig and weight_mask both saved: the truth, shown
    with torch.no_grad():
        expected = float((net(X) - pruned(X)).abs().max())
    assert c["max abs output diff"].after == pytest.approx(expected, rel=1e-6) and expected > 0
    assert c["CPU latency"].before > 0 and c["CPU latency"].after > 0


def test_compacted_model_against_its_masked_model():
    masked, small, keep = _channel_pruned()
    assert int(keep.sum()) == 4
    c = compare_models(masked, small, X, repeats=1, warmup=0)
    assert c["parameters"].after == 4 * 27 + 4 + 4 * 36 + 4 + 325 == 585
    assert c["parameters"].before == 224 + 8 + 292 + 325 - 8  # weight_orig, bias_orig: each once
    # 4 channels x (27 weights + bias) masked; compaction also drops conv 2's 4 x 4 x 9 weights reading them
    assert c["nonzero parameters"].before == 841 - 4 * 28 == 585 + 4 * 4 * 9
    assert c["multiply-adds"].after == 2 * 4 * 36 * 27 + 2 * 4 * 16 * 36 + 640
    assert c["max abs output diff"].after < 1e-5
    assert c["file size"].after < c["file size"].before


def test_models_are_put_back_and_no_hook_is_left():
    net, pruned = _net(), _pruned()
    net.train()
    net[2].eval()  # mixed flags must come back exactly
    counts = hook_count(net), hook_count(pruned)
    rng = torch.random.get_rng_state()
    compare_models(net, pruned, X, repeats=1, warmup=1)
    assert [m.training for m in net.modules()] == [True, True, True, False, True, True]
    assert not any(m.training for m in pruned.modules())
    assert (hook_count(net), hook_count(pruned)) == counts == (0, 3)  # torch's three mask hooks stay
    assert torch.equal(rng, torch.random.get_rng_state())


def test_runs_in_eval_mode_without_grad():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4)).train()
    grads: list[bool] = []
    net[0].register_forward_hook(lambda m, a, o: grads.append(o.requires_grad))
    stats = net[2].running_mean.clone()
    c = compare_models(net, net, torch.randn(8, 4), repeats=1, warmup=0)
    assert c["max abs output diff"].after == 0.0  # dropout off: the same model twice agrees
    assert torch.equal(net[2].running_mean, stats) and not any(grads) and net.training


def test_latency_is_interleaved_and_counts_runs():
    order: list[str] = []
    a, b = _net(), _pruned()
    a.register_forward_pre_hook(lambda m, i: order.append("a"))
    b.register_forward_pre_hook(lambda m, i: order.append("b"))
    c = compare_models(a, b, X, repeats=3, warmup=1)
    # one counted pass each, then 4 rounds alternating which model goes first
    assert "".join(order) == "ab" + "ab" + "ba" + "ab" + "ba"
    assert c.repeats == 3 and "median of 3" in c.table()


def test_result_protocol():
    c = compare_models(_net(), _pruned(), X, repeats=1, warmup=0)
    assert [r.name for r in c.rows] == ["parameters", "nonzero parameters", "multiply-adds",
                                        "nonzero-weight multiply-adds", "CPU latency", "file size",
                                        "max abs output diff"]
    data = json.loads(c.to_json())
    assert data["rows"][1]["after"] == 536 and data["rows"][1]["ratio"] == pytest.approx(536 / 841)
    text = str(c)
    assert text == c.table() and "nonzero parameters" in text and "0.637x" in text
    with pytest.raises(RecordError, match="Did you mean 'parameters'"):
        c["paramters"]
    assert "file size" in c and len(c) == 7


def test_bad_input_is_refused_in_one_line_and_leaves_nothing():
    net, pruned = _net(), _pruned()
    with pytest.raises(HookscopeError, match=r"repeats=0 is not a count; pass an int >= 1"):
        compare_models(net, pruned, X, repeats=0)
    with pytest.raises(HookscopeError, match="warmup=True"):
        compare_models(net, pruned, X, warmup=True)
    with pytest.raises(HookscopeError, match="after is a Tensor, not an nn.Module"):
        compare_models(net, X)
    with pytest.raises(HookscopeError, match="needs an example input"):
        compare_models(net, pruned)
    with torch.device("meta"):
        ghost = _net()
    with pytest.raises(HookscopeError, match="after model is on meta; pass model.cpu()"):
        compare_models(net, ghost, X)
    with pytest.raises(ForwardError, match="after: the forward pass failed") as err:
        compare_models(net, nn.Sequential(nn.Linear(7, 2)), X)
    assert "\n" not in str(err.value)
    assert hook_count(net) == 0 and hook_count(pruned) == 3 and not net.training


# --- diff of the pruned model against the original, layer by layer ------------------------------------
def test_diff_masked_against_original_compares_every_layer():
    net, pruned = _net(), _pruned()
    d = hookscope.diff(net, pruned, X)
    assert [r.name for r in d.rows] == ["0", "1", "2", "3", "4", ""]
    assert all(r.status == "differs" for r in d.rows) and d.first.name == "0"
    with torch.no_grad():
        w = net[0].weight - pruned[0].weight_orig * pruned[0].weight_mask
        expected = torch.nn.functional.conv2d(X, w, padding=1).abs().max()
    assert d["0"][0].max_abs == pytest.approx(float(expected), rel=1e-5)
    assert hook_count(net) == 0 and hook_count(pruned) == 3


def test_diff_masked_against_compacted_names_the_narrowed_layers_and_matches_after_them():
    masked, small, _ = _channel_pruned()
    d = hookscope.diff(masked, small, X)
    status = {r.name: r.status for r in d.rows}
    # today: differently shaped outputs are reported as "shape", not compared element by element
    assert status == {"0": "shape", "1": "shape", "2": "ok", "3": "ok", "4": "ok", "": "ok"}
    assert (d["0"][0].shape_a, d["0"][0].shape_b) == ((2, 8, 6, 6), (2, 4, 6, 6))
    assert d.first.name == "0" and d["4"][0].max_abs < 1e-5


def test_diff_compacted_against_original_kept_channels_by_hand():
    masked, small, keep = _channel_pruned()
    original = _net()
    with torch.no_grad():  # what diff cannot do today: compare the kept channels of layer 0
        kept = original[0](X)[:, keep]
        assert torch.allclose(kept, small[0](X), atol=1e-6)
    d = hookscope.diff(original, small, X)
    assert d["0"][0].status == "shape" and d["2"][0].status == "differs"


# --- the caller's inputs: every run gets its own copy --------------------------------------------------------
class Halves(nn.Module):
    """Writes into its input (x.div_(2)) and into a keyword input, and records what each call received."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        scale = torch.ones(1) if scale is None else scale
        self.seen.append((x.detach().clone(), scale.detach().clone()))
        x.div_(2)
        scale.mul_(3)
        return self.fc(x) * scale


def test_a_model_writing_into_its_input_changes_neither_the_caller_nor_any_run():
    import copy

    net = Halves()
    twin = copy.deepcopy(net)
    x, scale = torch.randn(2, 4), torch.full((1,), 0.5)
    x0, scale0 = x.clone(), scale.clone()
    c = compare_models(net, twin, x, kwargs={"scale": scale}, repeats=3, warmup=2)
    assert c["max abs output diff"].after == 0.0  # the model against its own copy
    assert torch.equal(x, x0) and torch.equal(scale, scale0)
    # one counted pass and 2 warm-up + 3 timed calls each, every one on the inputs as given
    assert len(net.seen) == len(twin.seen) == 1 + 2 + 3
    assert all(torch.equal(a, x0) and torch.equal(s, scale0) for a, s in net.seen + twin.seen)


def test_inputs_in_lists_and_dicts_and_needing_a_gradient_are_copied_for_each_run():
    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[float] = []

        def forward(self, pair: list[torch.Tensor], extra: dict[str, torch.Tensor]) -> torch.Tensor:
            self.seen.append(float(pair[0].sum() + extra["b"].sum()))
            pair[0].data.mul_(0)  # behind autograd's back too
            extra["b"].add_(1)
            return pair[0] + pair[1]

    net = Nested()
    a = torch.ones(3, requires_grad=True)
    pair, extra = [a, torch.ones(3)], {"b": torch.zeros(2)}
    c = compare_models(net, net, (pair, extra), repeats=2, warmup=1)
    assert c["max abs output diff"].after == 0.0
    assert net.seen == [3.0] * (2 * (1 + 1 + 2))
    assert torch.equal(a, torch.ones(3)) and a.requires_grad and a.grad is None and pair[0] is a
    assert torch.equal(extra["b"], torch.zeros(2))


def test_the_copy_of_the_inputs_is_made_before_the_clock_starts(monkeypatch):
    import hookscope.analysis.prune.compare._compare as cmp

    events: list[str] = []
    real_private, real_clock = cmp.private, cmp.time.perf_counter

    def private(tree):
        events.append("copy")
        return real_private(tree)

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            events.append("clock")
            return real_clock()

    monkeypatch.setattr(cmp, "private", private)
    monkeypatch.setattr(cmp, "time", Clock)
    compare_models(_net(), _net(), X, repeats=2, warmup=1)
    timed = events[2:]  # after the two counted passes
    assert events[:2] == ["copy", "copy"] and timed == ["copy", "clock", "clock"] * (2 * (1 + 2))


def test_each_runs_copy_keeps_the_inputs_layout_dtype_and_device():
    """The copies are of the caller's tensors as given: a channels_last batch stays channels_last (the
    latency of a channels_last model is timed on what it will get)."""
    layouts: list[tuple[bool, torch.dtype, str]] = []
    net = _net().to(memory_format=torch.channels_last)
    net.register_forward_pre_hook(lambda m, a: layouts.append(
        (a[0].is_contiguous(memory_format=torch.channels_last), a[0].dtype, a[0].device.type)))
    x = X.to(memory_format=torch.channels_last)
    c = compare_models(net, net, x, repeats=2, warmup=1)
    assert c["max abs output diff"].after == 0.0
    assert layouts == [(True, torch.float32, "cpu")] * (2 * (1 + 1 + 2))
