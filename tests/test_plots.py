"""Pictures of the analyses (hookscope.viz.plots): what each figure draws is the result's numbers.

Every check reads the figure back: the data of each line against the rows, the x of the marked
first non-finite value or first divergence against the answer worked out by hand, the pixels of a
saved PNG against the colours that were drawn.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import hookscope
from helpers import no_hooks
from hookscope import HookscopeError
from hookscope.analysis.diff import Diff, Unmatched
from hookscope.viz.overlay import overlay
from hookscope.viz.plots import plot_cams, plot_diff, plot_gradient_flow, plot_trace, save_figure
from hookscope.zoo import TinyResNet


def lines(ax) -> dict[str, tuple[list[float], list[float]]]:
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines}


def same(a, b) -> bool:
    """Equal lists of floats, NaN equal to NaN."""
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == pytest.approx(y) for x, y in zip(a, b))


def stripes(ax) -> dict[str, list[float]]:
    """The x of each vertical-stripe collection (``vlines``), by label."""
    return {c.get_label(): [seg[0][0] for seg in c.get_segments()] for c in ax.collections}


def tick_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


RED = (214, 39, 40)  # tab:red


def marker_pixel(ax, png: np.ndarray, x: float, y: float) -> np.ndarray:
    """The saved PNG's pixel at ``x`` in data and ``y`` in axes fraction (where NaN/Inf crosses sit)."""
    px, py = ax.get_xaxis_transform().transform((x, y))
    return png[int(png.shape[0] - py), int(px)].astype(int)


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sqrt()


def chain(n: int, *, bad: int | None = None) -> nn.Sequential:
    """``n`` Linear(2, 2) layers, identity weights; layer ``bad``'s weight holds an Inf."""
    net = nn.Sequential(*[nn.Linear(2, 2) for _ in range(n)])
    with torch.no_grad():
        for i, layer in enumerate(net):
            layer.weight.copy_(torch.eye(2))
            layer.bias.zero_()
            if i == bad:
                layer.weight[0, 0] = math.inf
    return net


# --- trace -----------------------------------------------------------------------------------------
def test_trace_lines_are_the_rows_std_and_max_forward_and_backward():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with hookscope.trace(net, keep="all") as t:
        net(torch.randn(5, 3)).sum().backward()
    fig = plot_trace(t)
    outputs = [r for r in t.rows if r.which == "output"]
    grads = {(r.module, r.call): r for r in t.rows if r.which == "grad_output"}
    forward, backward = fig.axes
    drawn = lines(forward)
    assert drawn["output std"] == ([0, 1, 2], [r.std for r in outputs])
    assert drawn["output max |x|"][1] == [r.absmax for r in outputs]
    drawn = lines(backward)
    # the model's output gets a gradient of ones: std 0, drawn on the bottom edge of the log axis
    low = backward.get_ylim()[0]
    assert [grads[(r.module, r.call)].std for r in outputs][2] == 0.0
    assert drawn["gradient std"][1] == [grads[(r.module, r.call)].std or low for r in outputs]
    assert drawn["0 (on the bottom edge)"] == ([2], [low])
    assert drawn["gradient max |x|"][1] == [grads[(r.module, r.call)].absmax for r in outputs]
    assert tick_labels(backward) == ["0", "1", "2"] and forward.get_yscale() == "log"
    assert "all finite" in forward.get_title() and "first non-finite" not in lines(forward)
    assert no_hooks(net)


def test_forward_only_trace_has_one_panel_and_a_layer_called_twice_is_labelled_by_call():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.Tanh()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.act(x) * 3)

    net = Twice()
    with hookscope.trace(net, keep="output") as t:
        net(torch.ones(2))
    fig = plot_trace(t)
    assert len(fig.axes) == 1
    assert tick_labels(fig.axes[0]) == ["act#0", "act#1"]
    assert lines(fig.axes[0])["output max |x|"][1] == pytest.approx([math.tanh(1), math.tanh(3 * math.tanh(1))])


@pytest.mark.parametrize("bad", [0, 2, 3])
def test_the_first_non_finite_output_is_marked_at_its_layer(bad):
    net = chain(4, bad=bad)
    with hookscope.trace(net, keep="output") as t:
        net(torch.ones(1, 2))
    fig = plot_trace(t)
    marked = lines(fig.axes[0])["first non-finite"]
    assert marked[0] == [bad, bad]
    assert any(f"first non-finite: {bad} output (0 NaN, 1 Inf)" in text.get_text() for text in fig.axes[0].texts)
    assert str(bad) in tick_labels(fig.axes[0])
    assert no_hooks(net)


def test_a_gradient_that_is_the_first_non_finite_row_is_marked_at_the_module_that_sent_it():
    # relu gives an exact 0, whose sqrt is finite forward but sends back an infinite gradient:
    # the first non-finite row is the grad_input of module '2', drawn at '2''s output
    net = nn.Sequential(nn.Identity(), nn.ReLU(), Sqrt(), nn.Identity())
    with hookscope.trace(net, keep="all") as t:
        net(torch.tensor([-1.0, 4.0], requires_grad=True)).sum().backward()
    first = next(r for r in t.rows if not r.finite)
    assert (first.module, first.which) == ("2", "grad_input")
    fig = plot_trace(t)
    assert [lines(ax)["first non-finite"][0] for ax in fig.axes] == [[2, 2], [2, 2]]


@pytest.mark.parametrize("bad", [0, 2])
def test_non_finite_outputs_are_marked_on_top_and_an_infinite_max_sits_on_the_top_edge(bad):
    # weight[0, 0] = Inf turns [1, 1] into [Inf, 1], and the next identity layer's 0 * Inf makes NaN
    net = chain(4, bad=bad)
    with hookscope.trace(net, keep="output") as t:
        net(torch.ones(1, 2))
    ax = plot_trace(t).axes[0]
    drawn, (low, high) = lines(ax), ax.get_ylim()
    assert drawn[f"NaN/Inf ({4 - bad})"] == (list(range(bad, 4)), [0.95] * (4 - bad))
    assert drawn["output max |x|"][1][bad] == high and math.isnan(drawn["output std"][1][bad])
    assert same(drawn["output max |x|"][1][bad + 1:], [math.nan] * (3 - bad))
    assert drawn["output std"][1][:bad] == [low] * bad  # [1, 1] has std 0: on the bottom edge
    assert drawn.get("0 (on the bottom edge)", ([], []))[0] == list(range(bad))


def test_a_gradient_holding_inf_is_marked_on_the_backward_panel_and_zero_stds_on_its_bottom_edge():
    net = nn.Sequential(nn.Identity(), nn.ReLU(), Sqrt(), nn.Identity())
    with hookscope.trace(net, keep="all") as t:
        net(torch.tensor([-1.0, 4.0], requires_grad=True)).sum().backward()
    forward, backward = plot_trace(t).axes
    drawn, (low, high) = lines(backward), backward.get_ylim()
    # gradients at the outputs: 0: [0, 0.25]; 1: [Inf, 0.25] (sqrt at 0); 2 and 3: [1, 1]
    assert drawn["NaN/Inf (1)"][0] == [1] and not any(k.startswith("NaN/Inf") for k in lines(forward))
    assert same(drawn["gradient std"][1], [0.125, math.nan, low, low])
    assert drawn["gradient max |x|"][1] == [0.25, high, 1.0, 1.0]
    assert drawn["0 (on the bottom edge)"] == ([2, 3], [low, low])


def test_three_hundred_layers_get_thinned_readable_labels():
    net = nn.Sequential(*[nn.Linear(4, 4) for _ in range(300)])
    with hookscope.trace(net, keep="output") as t:
        net(torch.randn(1, 4))
    rows = t.rows
    fig = plot_trace(t)
    shown = tick_labels(fig.axes[0])
    assert 20 <= len(shown) <= 41 and shown[0] == "0" and len(lines(fig.axes[0])["output std"][1]) == len(rows)
    assert len(fig.axes[0].get_xticks()) <= 41  # ticks thinned: no 300 labels for savefig to lay out


def test_a_trace_without_outputs_says_what_to_record():
    net = nn.Sequential(nn.ReLU())
    with hookscope.trace(net, keep="input") as t:
        net(torch.ones(2))
    with pytest.raises(HookscopeError, match="no outputs to plot; trace with keep='output'"):
        plot_trace(t)


# --- gradient flow -------------------------------------------------------------------------------
def three_scalars(w: tuple[float, float, float]) -> nn.Sequential:
    net = nn.Sequential(*[nn.Linear(1, 1, bias=False) for _ in w])
    with torch.no_grad():
        for layer, v in zip(net, w):
            layer.weight.fill_(v)
    return net


def test_gradient_flow_draws_the_norms_bands_and_flagged_layers_worked_out_by_hand():
    # y = w2 w1 w0 x with x = 1: dy/dw0 = w1 w2 = 1e-4, dy/dw1 = w0 w2 = 1e5, dy/dw2 = w0 w1 = 1e-9
    net = three_scalars((1.0, 1e-9, 1e5))
    net(torch.ones(1, 1)).sum().backward()
    flow = hookscope.gradient_flow(net)
    assert [r.flag for r in flow.rows] == ["ok", "exploding", "vanishing"]
    top, bottom = plot_gradient_flow(flow).axes
    x, y = lines(top)["|grad params| (L2 norm)"]
    assert x == [0, 1, 2] and y == pytest.approx([1e-4, 1e5, 1e-9])
    assert lines(bottom)["rms |grad| of parameters"][1] == pytest.approx([1e-4, 1e5, 1e-9])  # 1 weight each
    assert stripes(top) == {"exploding or non-finite (1)": [1], "vanishing (1)": [2]}
    bands = {p.get_label(): p.get_path().transformed(p.get_patch_transform()) for p in top.patches}
    low, high = top.get_ylim()
    vanish = bands["vanishing (< 1e-07)"].get_extents()
    explode = bands["exploding (> 1000)"].get_extents()
    assert (vanish.y0, vanish.y1) == pytest.approx((low, 1e-7)) and (explode.y0, explode.y1) == pytest.approx((1e3, high))
    assert low < 1e-9 and high > 1e5 and "1 flagged" not in top.get_title() and "2 flagged" in top.get_title()
    assert tick_labels(bottom) == ["0", "1", "2"]


def test_with_a_trace_layers_come_in_execution_order_with_their_largest_gradients():
    class Backwards(nn.Module):  # defined b then a, called a then b
        def __init__(self) -> None:
            super().__init__()
            self.b = nn.Linear(3, 2)
            self.a = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    net = Backwards()
    with hookscope.trace(net, keep="all", param_grads=True) as t:
        net(torch.randn(4, 3)).pow(2).sum().backward()
    flow = hookscope.gradient_flow(net, trace=t)
    assert [r.module for r in flow.rows] == ["b", "a"]
    top, bottom = plot_gradient_flow(flow, trace=t).axes
    assert tick_labels(bottom) == ["a", "b"]
    assert lines(top)["|grad params| (L2 norm)"][1] == pytest.approx([flow["a"].param_norm, flow["b"].param_norm])
    assert lines(top)["|grad output| (L2 norm)"][1] == pytest.approx([flow["a"].act_norm, flow["b"].act_norm])
    largest = [max(p.grad.abs().max().item() for p in m.parameters()) for m in (net.a, net.b)]
    assert lines(bottom)["max |grad| of parameters"][1] == pytest.approx(largest)
    at_outputs = [t[name][0] for name in ("a", "b")]
    grad_out = {r.module: r.absmax for r in t.rows if r.which == "grad_output"}
    assert lines(bottom)["max |grad| at outputs"][1] == pytest.approx([grad_out["a"], grad_out["b"]])
    assert at_outputs and no_hooks(net)


def test_a_layer_without_parameters_is_a_gap_not_a_zero():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    with hookscope.trace(net, keep="all") as t:
        net(torch.ones(1, 2)).sum().backward()
    flow = hookscope.gradient_flow(net, trace=t)
    y = lines(plot_gradient_flow(flow, trace=t).axes[0])["|grad params| (L2 norm)"][1]
    assert same(y, [flow["0"].param_norm, math.nan, flow["2"].param_norm])


def test_all_zero_gradients_are_drawn_on_the_bottom_edge_not_left_out():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    net(torch.ones(1, 4)).mul(0).sum().backward()
    flow = hookscope.gradient_flow(net)
    assert [r.param_norm for r in flow.rows] == [0.0, 0.0]
    for ax, label in zip(plot_gradient_flow(flow).axes, ["|grad params| (L2 norm)", "rms |grad| of parameters"]):
        low = ax.get_ylim()[0]
        assert lines(ax)[label] == ([0, 1], [low, low])
        assert lines(ax)["0 (on the bottom edge)"] == ([0, 1], [low, low])
        assert not any(k.startswith("NaN/Inf") for k in lines(ax))


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_nan_and_inf_gradients_are_marked_on_top_not_dropped(poison):
    # y = w2 w1 w0 x: dy/dw0 = w1 w2 = 2 stays finite, dy/dw1 and dy/dw2 carry w0
    net = three_scalars((poison, 1.0, 2.0))
    net(torch.ones(1, 1)).sum().backward()
    flow = hookscope.gradient_flow(net)
    assert [r.flag for r in flow.rows] == ["ok", "non-finite", "non-finite"]
    top, bottom = plot_gradient_flow(flow).axes
    high = top.get_ylim()[1]
    drawn = lines(top)["|grad params| (L2 norm)"][1]
    assert same(drawn, [2.0, poison, poison] if math.isnan(poison) else [2.0, high, high])
    assert lines(top)["NaN/Inf (2)"][0] == [1, 2] and lines(bottom)["NaN/Inf (2)"][0] == [1, 2]


# --- diff ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 2, 4])
def test_diff_plot_marks_the_perturbed_layer_as_the_first_divergence(k):
    torch.manual_seed(0)
    a = nn.Sequential(*[nn.Linear(3, 3) for _ in range(5)])
    b = nn.Sequential(*[nn.Linear(3, 3) for _ in range(5)])
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b[k].weight[0, 0] += 0.5
    d = hookscope.diff(a, b, torch.randn(2, 3))
    assert d.first is not None and d.first.name == str(k)
    ax = plot_diff(d).axes[0]
    drawn = lines(ax)
    first = [i for i, r in enumerate(d.rows) if r is d.first][0]
    assert first == k  # rows: '0' ... '4', then the model ''
    assert drawn["first divergence"][0] == [k, k]
    low = ax.get_ylim()[0]  # the layers before k are equal: error 0, drawn on the bottom edge
    assert drawn["max |a - b|"] == (list(range(6)), [r.max_abs or low for r in d.rows])
    assert same(drawn["max |a - b| / max |b|"][1], [r.max_rel or low for r in d.rows])
    assert [r.max_abs for r in d.rows[:k]] == [0.0] * k and drawn.get("0 (on the bottom edge)", [[]])[0] == [*range(k)]
    assert drawn[f"atol {d.atol:g}"][1] == [d.atol, d.atol] and drawn[f"rtol {d.rtol:g}"][1] == [d.rtol, d.rtol]
    assert stripes(ax) == {f"beyond tolerance ({6 - k})": list(range(k, 6))}
    assert tick_labels(ax)[-1] == "(model)" and f"first divergence: {k}" in ax.get_title()
    assert no_hooks(a) and no_hooks(b)


def test_equal_runs_draw_no_divergence_and_zero_errors_sit_on_the_bottom_edge():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    d = hookscope.diff(net, net, torch.ones(1, 2))
    ax = plot_diff(d).axes[0]
    assert "first divergence" not in lines(ax) and not ax.collections
    low = ax.get_ylim()[0]
    assert low < d.rtol and [r.max_abs for r in d.rows] == [0.0, 0.0, 0.0]
    assert lines(ax)["max |a - b|"][1] == [low] * 3 and lines(ax)["max |a - b| / max |b|"][1] == [low] * 3
    assert lines(ax)["0 (on the bottom edge)"] == ([0, 1, 2], [low] * 3)
    assert "first divergence: none" in ax.get_title()


@pytest.mark.parametrize(("k", "side"), [(0, "b"), (2, "b"), (1, "a")])
def test_nan_in_one_run_only_is_marked_and_named_though_the_finite_errors_are_zero(tmp_path, k, side):
    torch.manual_seed(0)
    a = nn.Sequential(*[nn.Linear(3, 3) for _ in range(4)])
    b = nn.Sequential(*[nn.Linear(3, 3) for _ in range(4)])
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        (a if side == "a" else b)[k].weight[0, 0] = math.nan
    d = hookscope.diff(a, b, torch.randn(2, 3))
    assert [r.max_abs for r in d.rows] == [0.0] * 5 and d.first is d.rows[k]  # NaN places are left out
    fig = plot_diff(d)
    ax = fig.axes[0]
    drawn, why = lines(ax), f"NaN in {side.upper()} only"
    assert drawn[f"NaN/Inf ({5 - k})"] == (list(range(k, 5)), [0.95] * (5 - k))
    assert drawn.get("0 (on the bottom edge)", ([], []))[0] == list(range(k))  # only the rows truly equal
    assert any(text.get_text() == f" first divergence: {k} ({why})" for text in ax.texts)
    assert f"first divergence: {k} ({why})" in ax.get_title()
    png = read_png(save_figure(fig, tmp_path / "diff.png"))
    assert all(np.abs(marker_pixel(ax, png, i, 0.95) - RED).max() <= 8 for i in range(k, 5))
    assert no_hooks(a) and no_hooks(b)


def test_an_infinite_error_sits_on_the_top_edge_and_is_named():
    a = chain(3)
    b = chain(3, bad=1)
    d = hookscope.diff(a, b, torch.ones(1, 2))
    assert math.isinf(d.rows[1].max_abs) and d.rows[0].max_abs == 0.0
    ax = plot_diff(d).axes[0]
    low, high = ax.get_ylim()
    drawn = lines(ax)
    assert drawn["max |a - b|"][1][:2] == [low, high] and drawn["NaN/Inf (3)"][0] == [1, 2, 3]
    assert "first divergence: 1 (|a - b| = Inf)" in ax.get_title()


def test_the_tolerance_drawn_is_the_one_each_row_was_judged_with():
    # rows computed in bfloat16 are judged at bfloat16's eps, not at the float32 rtol of the whole diff
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    d = hookscope.diff(net, net, torch.randn(2, 4), b=hookscope.settings(autocast=torch.bfloat16))
    assert {r.rtol for r in d.rows} == {torch.finfo(torch.bfloat16).eps} != {d.rtol}
    assert d.first is None and all(r.max_rel <= r.rtol for r in d.rows)
    drawn = lines(plot_diff(d).axes[0])
    eps = torch.finfo(torch.bfloat16).eps
    assert drawn[f"rtol {eps:g}"][1] == [eps, eps] and f"rtol {d.rtol:g}" not in drawn


def test_a_tolerance_that_differs_between_rows_is_drawn_per_row():
    from hookscope.viz.plots import _row_tolerance

    rows = [type("R", (), {"rtol": v})() for v in (1e-6, 0.0078, math.nan)]
    assert _row_tolerance(rows, "rtol", 1e-3) == [1e-6, 0.0078, 1e-3]


def test_a_diff_that_compared_nothing_cannot_be_drawn():
    empty = Diff([], Unmatched((), ()), rtol=0.0, atol=0.0, run_a="A", run_b="B")
    with pytest.raises(HookscopeError, match="compared nothing"):
        plot_diff(empty)


# --- CAMs side by side ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cams():
    torch.manual_seed(0)
    net, x = TinyResNet().eval(), torch.rand(2, 3, 32, 32)
    results = [hookscope.cam(net, x, layers="layer2", method=m) for m in ("gradcam", "layercam", "cam")]
    assert no_hooks(net)
    return x, results


def test_cams_are_the_input_then_one_titled_overlay_per_method(cams):
    x, results = cams
    names = [f"shape{i}" for i in range(10)]
    fig = plot_cams(x[1], results, index=1, class_names=names, alpha=0.4)
    assert len(fig.axes) == len(results) + 1 and fig.axes[0].get_title() == "input"
    assert np.allclose(fig.axes[0].images[0].get_array(), x[1].permute(1, 2, 0).numpy())
    for ax, r in zip(fig.axes[1:], results):
        target, score = int(r.targets[1]), float(r.scores[1])
        assert ax.get_title().splitlines() == [r.method, f"class {target} (shape{target})", f"logit {score:.4g}"]
        expected = overlay(x[1], r.maps[1], alpha=0.4).clamp(0, 1).permute(1, 2, 0).numpy()
        assert np.allclose(ax.images[0].get_array(), expected, atol=1e-6)
    assert fig._suptitle.get_text() == "layer: layer2"


def test_cam_mistakes_are_one_line(cams):
    x, results = cams
    with pytest.raises(HookscopeError, match="at least one CamMaps"):
        plot_cams(x[0], [])
    with pytest.raises(HookscopeError, match="index=2 is out of range: the gradcam result holds 2 map"):
        plot_cams(x[0], results, index=2)
    with pytest.raises(HookscopeError, match="class_names holds 1 names but gradcam explains class"):
        plot_cams(x[0], results, class_names=["only"])
    with pytest.raises(HookscopeError, match="not \\[0, 1\\]"):
        plot_cams(x[0] * 5, results)


# --- saving ----------------------------------------------------------------------------------------
def read_png(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB")).copy()


def panel(ax, png: np.ndarray, h: int, w: int) -> np.ndarray:
    """The PNG's pixels at the centres of an h x w image drawn in ``ax`` (after the figure was saved)."""
    box = ax.get_window_extent()
    cols = (box.x0 + (np.arange(w) + 0.5) * box.width / w).astype(int)
    rows = (png.shape[0] - (box.y1 - (np.arange(h) + 0.5) * box.height / h)).astype(int)
    return png[rows][:, cols].astype(int)


def test_saved_png_has_the_figure_size_and_the_drawn_colours(tmp_path, cams):
    x, results = cams
    fig = plot_cams(x[0], results, alpha=0.5)
    path = save_figure(fig, tmp_path / "cams.png")
    png = read_png(path)
    width, height = fig.get_size_inches() * fig.dpi
    assert png.shape == (round(height), round(width), 3)
    as_bytes = (x[0].permute(1, 2, 0) * 255).numpy()
    assert np.abs(panel(fig.axes[0], png, 32, 32) - as_bytes).max() <= 1
    for ax, r in zip(fig.axes[1:], results):
        expected = (overlay(x[0], r.maps[0], alpha=0.5).permute(1, 2, 0) * 255).numpy()
        assert np.abs(panel(ax, png, 32, 32) - expected).max() <= 1


def test_saving_is_atomic_and_leaves_no_temporary_file(tmp_path, cams):
    x, results = cams
    fig = plot_cams(x[0], results)
    target = tmp_path / "plot.png"
    target.write_bytes(b"the old picture")
    assert save_figure(fig, target) == target and sorted(os.listdir(tmp_path)) == ["plot.png"]
    before = target.read_bytes()

    def broken(f, **kw):
        f.write(b"half a png")
        raise RuntimeError("disk full")

    fig.savefig = broken
    with pytest.raises(RuntimeError, match="disk full"):
        save_figure(fig, target)
    assert target.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["plot.png"]


def test_saving_mistakes_are_one_line(tmp_path, cams):
    fig = plot_cams(cams[0][0], cams[1][:1])
    with pytest.raises(HookscopeError, match="the folder .*nowhere does not exist; create it first"):
        save_figure(fig, tmp_path / "nowhere" / "plot.png")
    with pytest.raises(HookscopeError, match="it is a folder; give a file path"):
        save_figure(fig, tmp_path)
    with pytest.raises(HookscopeError, match="takes a matplotlib Figure .* not str"):
        save_figure("plot", tmp_path / "p.png")  # type: ignore[arg-type]


def test_figures_leave_pyplot_alone_and_a_missing_matplotlib_names_the_extra(monkeypatch):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    net = nn.Sequential(nn.Linear(2, 2))
    with hookscope.trace(net) as t:
        net(torch.ones(1, 2))
    plot_trace(t)
    assert plt.get_fignums() == before
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(HookscopeError, match=r"needs matplotlib, from the viz extra: pip install 'hookscope\[viz\]'"):
        plot_trace(t)
