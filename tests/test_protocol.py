"""One result protocol and one vocabulary across every analysis (issue 10).

Every public result: ``table()`` (also ``str()``), ``to_dict()``, ``to_json(indent=None)`` on one line
that round-trips through ``json.loads`` to ``to_dict()``'s JSON form, ``rows`` where tabular, and
name lookups that raise a ``KeyError``-compatible hookscope error with ``in`` agreeing. Every public
function refuses an unknown keyword with one line. The tables below must name every public result
type and every public callable, so a new one cannot arrive without its row.
"""

from __future__ import annotations

import ast
import base64
import copy
import dataclasses
import html
import inspect
import io
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope import metrics
from hookscope.core.result import HTML_ROWS, jsonable
from hookscope.zoo import TinyResNet

from helpers import no_hooks

PUBLIC = {n: getattr(m, n) for m in (hookscope, metrics) for n in m.__all__}
RESULT_TYPES = {n: o for n, o in PUBLIC.items() if inspect.isclass(o) and hasattr(o, "to_json")}
LOOKUP_TYPES = {n for n, o in RESULT_TYPES.items() if hasattr(o, "__getitem__")}
# classes hookscope hands out and users only read (rows, records, the object edit() returns)
HANDED_OUT = {"CamRow", "DiffRow", "StatRow", "CurveRow", "CallRecord", "GradRecord", "LayerRecord", "Unmatched",
              "Edit", "FeatureRow", "ComparisonRow", "LayerArray", "OperationRow", "TokenRow", "HeadRow",
              "WidthRow", "MlpRow", "MemoryRow", "MemoryTotals", "Component", "Monitor", "TelemetryRow", "Writer",
              "RoadRow", "RandomisationRow", "StepRecord", "StepRow", "StepStatRow", "Steering", "TokenPositions", "LensRow", "DlaRow", "PatchRow", "TunedRow"}
CALLED = {n for n, o in PUBLIC.items() if callable(o) and n not in RESULT_TYPES and n not in HANDED_OUT
          and not (inspect.isclass(o) and issubclass(o, BaseException))}

# a case is a public result type, and after a colon the kind of run it comes from
RESULT_CASES = ["Capture", "Recording: a module called twice", "Recording: keep='input'", "Trace", "Watch",
                "TensorGrads", "GradientFlow", "Summary", "Diff", "CamMaps", "Curve", "FeatureMaps",
                "ReferenceComparison", "Sparsity", "ChannelPruning", "ChannelGroups", "ChannelImportance", "ModelComparison", "Store",
                "Operations", "AttentionPatterns", "Attributions", "TokenAttributions", "HeadPruning",
                "WidthPruning", "StepMemory", "Components", "Telemetry", "Run", "LayerImportance", "LayerRemoval",
                "Recovery", "RoadCurves", "Randomisation", "StepRecords", "Direction", "LogitLens", "LogitAttribution", "Patching", "SegmentAttributions",
                "TunedLens", "Trace: at= token positions", "TokenAttributions: a continuation"]
LOOKUPS = [  # case, a name it holds, a name it does not
    ("Capture", "fc", "fcc"),
    ("Recording: a module called twice", "fc", "fcc"),
    ("Recording: keep='input'", "fc", "fcc"),
    ("Trace", "fc", "fcc"),
    ("Watch", "fc", "fcc"),  # the last calls watched: fc runs last
    ("Summary", "fc", "fcc"),
    ("StepMemory", "fc", "fcc"),
    ("GradientFlow", "fc", "fcc"),
    ("Diff", "fc", "fcc"),
    ("TensorGrads", "y", "z"),
    ("Sparsity", "fc", "fcc"),
    ("ChannelImportance", "stem.2", "fcc"),
    ("ModelComparison", "parameters", "params"),
    ("Store", "fc", "fcc"),
    ("Operations", "fc::linear", "fc::linaer"),
    ("AttentionPatterns", "::scaled_dot_product_attention", "::softmax"),
    ("Components", "blocks.0.attn.z", "blocks.0.attn.zz"),
    ("StepRecords", "transformer.h.0", "transformer.h.00"),
    ("Telemetry", "fc", "fcc"),
    ("Run", 0, 1),
    ("LayerImportance", "model.layers.0", "model.layers.9"),
    ("Recovery", "2", "3"),
    ("Randomisation", "fc", "fcc"),
    ("LogitLens", "blocks.0.resid_post", "blocks.0.resid_mid"),
    ("TunedLens", "blocks.0.resid_post", "blocks.0.resid_mid"),
    ("LogitAttribution", "blocks.0.head.0", "blocks.0.head.9"),
    ("Patching", "blocks.0", "blocks.1"),
]
# to_json's options that write all of to_dict(): CamMaps writes its maps as shape and dtype unless asked
FULL_JSON: dict[str, dict[str, Any]] = {"CamMaps": {"maps": True}, "FeatureMaps": {"maps": True},
                                        "ReferenceComparison": {"maps": True}, "Attributions": {"maps": True},
                                        "Randomisation": {"maps": True}}


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
        "Summary": hookscope.summary(net, x), "StepMemory": hookscope.step_memory(net, x), "Diff": hookscope.diff(net, net, x), "CamMaps": res, "Curve": curve,
        "FeatureMaps": hookscope.feature_maps(net, x, layers="layer1"),
        "ReferenceComparison": hookscope.compare_references(net, x, layers="layer1.0.bn1"),
        **_pruning(net, x), "Telemetry": _telemetry(net, x), "Run": _run(net, x, tmp_path_factory.mktemp("run")),
        "Store": hookscope.extract(net, x, layers=["layer1", "fc"], reduce="mean", out=tmp_path_factory.mktemp("store") / "s"),
        "Operations": hookscope.operations(net, x), "AttentionPatterns": hookscope.attention(_Attend(), torch.ones(1, 2, 3, 4)),
        "Attributions": hookscope.attribute(net, x, method="integrated_gradients", steps=2),
        "TokenAttributions": hookscope.attribute_tokens(nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5)),
                                                        torch.tensor([[1, 2, 3]]), steps=2),
        "SegmentAttributions": hookscope.attribute_segments(nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5)),
                                                            torch.tensor([[1, 2, 3]]), segments="tokens", target=[4]),
        "Components": hookscope.components(_gpt2()),
        "RoadCurves": metrics.road(net, x, res.maps, percentiles=[50]),
        "Randomisation": metrics.parameter_randomisation(net, x, lambda m, v: hookscope.cam(m, v, layers="layer2").maps,
                                                         layers=["fc", "layer2"]),
        **_generation(),
        **_circuits(),
    }


def _generation() -> dict[str, object]:
    lm = _gpt2()
    with hookscope.capture(lm, "transformer.h.0", at=hookscope.tokens.generated) as rec:
        lm.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    with hookscope.trace(lm, "transformer.h.0", keep="output", at=hookscope.tokens.generated) as t:
        out = lm.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    return {"StepRecords": hookscope.tokens.records(rec), "Trace: at= token positions": t,
            "TokenAttributions: a continuation": hookscope.attribute_tokens(lm, torch.tensor([[1, 2, 3]]),
                                                                            continuation=out, method="gradient"),
            "Direction": hookscope.direction(lm, torch.tensor([[1, 2]]), torch.tensor([[3, 4]]), layers="transformer.h.0")}


def _circuits() -> dict[str, object]:
    lm, ids = _gpt2(), torch.tensor([1, 2, 3])
    return {"LogitLens": hookscope.logit_lens(lm, ids), "LogitAttribution": hookscope.logit_attribution(lm, ids, answer=1),
            "Patching": hookscope.activation_patching(lm, ids, torch.tensor([1, 4, 3]), answer=1, wrong=2),
            "TunedLens": hookscope.tune_lens(lm, torch.tensor([[1, 2, 3], [3, 2, 1]]), steps=2)}


def _telemetry(net: nn.Module, x: torch.Tensor) -> object:
    opt = torch.optim.SGD(net.parameters(), lr=0.0)  # the shared model stays as it is
    with hookscope.monitor(net, "layer1.0.conv1", "fc", every=1, optimizer=opt) as mon:
        net(x).sum().backward()
        opt.step()
    net.zero_grad(set_to_none=True)
    return mon.last


def _run(net: nn.Module, x: torch.Tensor, folder: Path) -> object:
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    with hookscope.monitor(net, "fc", every=1, optimizer=opt, log=folder):
        net(x).sum().backward()
        opt.step()
    net.zero_grad(set_to_none=True)
    return hookscope.read_run(folder)


class _Attend(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, q, q)


def _pruning(net: nn.Module, x: torch.Tensor) -> dict[str, object]:
    masked, channels = copy.deepcopy(net), copy.deepcopy(net)
    chosen = hookscope.prune_channels(channels, x[:1], amount=0.5)
    return {"Sparsity": hookscope.prune(masked, amount=0.3), "ChannelPruning": chosen,
            "ChannelGroups": hookscope.channel_groups(net, x[:1]),
            "ChannelImportance": hookscope.channel_importance(net, x, layers={"stem.2": 1}),
            "ModelComparison": hookscope.compare_models(net, hookscope.compact(channels, x[:1]), x, repeats=1, warmup=0),
            "HeadPruning": hookscope.prune_heads(_heads(), (torch.rand(2, 3, 8),) * 3, amount=0.5),
            "WidthPruning": hookscope.prune_width(_width(), torch.tensor([[1, 2, 3]]), amount=0.25),
            "LayerImportance": hookscope.layer_importance(_deeper(), torch.tensor([[1, 2, 3]])),
            "LayerRemoval": hookscope.remove_layers(_deeper(), [0]),
            "Recovery": hookscope.recover(*_narrowed(), torch.randn(16, 4))}


def _narrowed() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), nn.Sequential(nn.Linear(4, 6), nn.ReLU(),
                                                                                  nn.Linear(6, 2))


def _deeper() -> nn.Module:
    import transformers
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2)).eval()


def _width() -> nn.Module:
    import transformers
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)).eval()


def _gpt2() -> nn.Module:
    import transformers
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=8)).eval()


def _heads() -> nn.Module:
    torch.manual_seed(0)
    return nn.MultiheadAttention(8, 4, batch_first=True)


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
        "step_memory": lambda **kw: hookscope.step_memory(net, x, **kw),
        "diff": lambda **kw: hookscope.diff(net, net, x, **kw),
        "settings": lambda **kw: hookscope.settings(**kw),
        "Settings": lambda **kw: hookscope.Settings(**kw),
        "cam": lambda **kw: hookscope.cam(net, x, **kw),
        "feature_maps": lambda **kw: hookscope.feature_maps(net, x, layers="layer1", **kw),
        "compare_references": lambda **kw: hookscope.compare_references(net, x, layers="layer1", **kw),
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
        "road": lambda **kw: metrics.road(net, x, maps, **kw),
        "infidelity": lambda **kw: metrics.infidelity(net, x, torch.zeros_like(x), **kw),
        "max_sensitivity": lambda **kw: metrics.max_sensitivity(net, x, lambda m, v: v, **kw),
        "parameter_randomisation": lambda **kw: metrics.parameter_randomisation(net, x, lambda m, v: v, **kw),
        "prune": lambda **kw: hookscope.prune(copy.deepcopy(net), amount=0.1, **kw),
        "prune_calibrated": lambda **kw: hookscope.prune_calibrated(copy.deepcopy(net), x, sparsity=0.5, **kw),
        "remove_masks": lambda **kw: hookscope.remove_masks(copy.deepcopy(net), **kw),
        "sparsity": lambda **kw: hookscope.sparsity(net, **kw),
        "prune_channels": lambda **kw: hookscope.prune_channels(copy.deepcopy(net), x[:1], amount=0.1, **kw),
        "compact": lambda **kw: hookscope.compact(net, x[:1], **kw),
        "channel_groups": lambda **kw: hookscope.channel_groups(net, x[:1], **kw),
        "channel_importance": lambda **kw: hookscope.channel_importance(net, x, layers=nn.ReLU, **kw),
        "compare_models": lambda **kw: hookscope.compare_models(net, net, x, repeats=1, warmup=0, **kw),
        "extract": lambda **kw: hookscope.extract(net, x, layers="fc", out="/nonexistent/never-written", **kw),
        "open_store": lambda **kw: hookscope.open_store("/nonexistent", **kw),
        "load": lambda **kw: hookscope.load("/nonexistent", **kw),
        "load_model": lambda **kw: hookscope.load_model("tiny", **kw),
        "load_weights": lambda **kw: hookscope.load_weights(net, "/nonexistent/w.pt", **kw),
        "class_names": lambda **kw: hookscope.class_names("demo", **kw),
        "load_images": lambda **kw: hookscope.load_images("demo", "/nonexistent/a.png", **kw),
        "Images": lambda **kw: hookscope.Images(x, x, ["a.png"] * 2, **kw),
        "image_transform": lambda **kw: hookscope.image_transform("demo", **kw),
        "ImageTransform": lambda **kw: hookscope.ImageTransform("none", **kw),
        "example_input": lambda **kw: hookscope.example_input("demo", **kw),
        "tokenize": lambda **kw: hookscope.tokenize("a text", "/nonexistent", **kw),
        "Tokens": lambda **kw: hookscope.Tokens(torch.zeros(1, 2, dtype=torch.long), **kw),
        "load_tokenizer": lambda **kw: hookscope.load_tokenizer("/nonexistent", **kw),
        "operations": lambda **kw: hookscope.operations(net, x, **kw),
        "attribute": lambda **kw: hookscope.attribute(net, x, **kw),
        "attribute_tokens": lambda **kw: hookscope.attribute_tokens(net, x, **kw),
        "attribute_segments": lambda **kw: hookscope.attribute_segments(
            nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5)), torch.tensor([[1, 2, 3]]), **kw),
        "prune_heads": lambda **kw: hookscope.prune_heads(_heads(), (torch.rand(2, 3, 8),) * 3, amount=0.5, **kw),
        "prune_width": lambda **kw: hookscope.prune_width(_width(), torch.tensor([[1, 2]]), amount=0.25, **kw),
        "layer_importance": lambda **kw: hookscope.layer_importance(_deeper(), torch.tensor([[1, 2]]), **kw),
        "remove_layers": lambda **kw: hookscope.remove_layers(_deeper(), [0], **kw),
        "to_semi_structured": lambda **kw: hookscope.to_semi_structured(nn.Sequential(nn.Linear(4, 2)), **kw),
        "recover": lambda **kw: hookscope.recover(*_narrowed(), torch.randn(16, 4), **kw),
        "LRPRule": lambda **kw: hookscope.LRPRule("epsilon", **kw),
        **{n: (lambda cls: lambda **kw: cls(**kw))(getattr(hookscope, n))  # each attribution method's settings
           for n in ("AttributionMethod", "Saliency", "Gradient", "InputXGradient", "IntegratedGradients", "SmoothGrad",
                     "SmoothGradSq", "VarGrad", "GuidedBackprop", "Deconvnet", "GuidedGradCam", "LRP",
                     "Occlusion", "FeatureAblation", "FeaturePermutation", "ShapleyValueSampling", "KernelShap", "Lime")},
        "attention": lambda **kw: hookscope.attention(_Attend(), torch.ones(1, 2, 3, 4), **kw),
        "components": lambda **kw: hookscope.components(_gpt2(), **kw),
        "component": lambda **kw: hookscope.component(_gpt2(), "embed", **kw),
        "direction": lambda **kw: hookscope.direction(_gpt2(), torch.tensor([[1]]), torch.tensor([[2]]),
                                                      layers="transformer.h.0", **kw),
        "steer": lambda **kw: hookscope.steer(net, "fc", direction=torch.ones(10), **kw),
        "bake": lambda **kw: hookscope.bake(hookscope.steer(net, "fc", direction=torch.ones(10)), x, **kw),
        "logit_lens": lambda **kw: hookscope.logit_lens(_gpt2(), torch.tensor([1, 2]), **kw),
        "tune_lens": lambda **kw: hookscope.tune_lens(_gpt2(), torch.tensor([[1, 2]]), steps=1, **kw),
        "load_lens": lambda **kw: hookscope.load_lens("/nonexistent/lens", **kw),
        "logit_attribution": lambda **kw: hookscope.logit_attribution(_gpt2(), torch.tensor([1, 2]), answer=1, **kw),
        "activation_patching": lambda **kw: hookscope.activation_patching(_gpt2(), torch.tensor([1, 2]),
                                                                          torch.tensor([1, 3]), answer=1, **kw),
        "attribution_patching": lambda **kw: hookscope.attribution_patching(_gpt2(), torch.tensor([1, 2]),
                                                                            torch.tensor([1, 3]), answer=1, **kw),
        "attention_probabilities": lambda **kw: hookscope.attention_probabilities(torch.ones(1, 3, 4),
                                                                                   torch.ones(1, 3, 4), **kw),
        "monitor": lambda **kw: hookscope.monitor(net, **kw),
        "read_run": lambda **kw: hookscope.read_run(**kw),
        "JSONLinesWriter": lambda **kw: hookscope.JSONLinesWriter("/nonexistent/m.jsonl", **kw),
        "CSVWriter": lambda **kw: hookscope.CSVWriter("/nonexistent/m.csv", **kw),
        "TensorBoardWriter": lambda **kw: hookscope.TensorBoardWriter("/nonexistent/tb", **kw),
        "WandbWriter": lambda **kw: hookscope.WandbWriter(**kw),
        "LightningMonitor": lambda **kw: hookscope.LightningMonitor(**kw),
        "TrainerMonitor": lambda **kw: hookscope.TrainerMonitor(**kw),
    }


def test_the_table_of_calls_names_every_public_callable():
    assert set(_calls(nn.Linear(1, 1))) == CALLED, "a public function or class without a row"


@pytest.mark.parametrize("fn", list(_calls(nn.Linear(1, 1))))
def test_every_public_callable_refuses_an_unknown_keyword(net, fn):
    with pytest.raises((TypeError, hookscope.HookscopeError)) as e:
        _calls(net)[fn](dpeth=2)
    assert "dpeth" in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(net)


# --- one vocabulary: every public callable's parameters, from __all__ -------------------------------
# a parameter name, and the kinds it may have (what a name means is written in the docs' vocabulary page)
VOCABULARY = {
    "model": {"POSITIONAL_OR_KEYWORD"},
    "inputs": {"POSITIONAL_OR_KEYWORD"},  # the model's positional input for one pass (a tuple for several)
    "data": {"POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"},  # batches: a tensor, dataset, loader or iterable
    "selectors": {"VAR_POSITIONAL"},  # context managers and pure selection: nothing else is positional
    "layers": {"KEYWORD_ONLY"},  # functions that run the model on positional inputs or data
    "kwargs": {"KEYWORD_ONLY"},  # the model's keyword inputs
    "copy": {"KEYWORD_ONLY"}, "keep": {"KEYWORD_ONLY"}, "target": {"KEYWORD_ONLY"},
    "device": {"KEYWORD_ONLY"}, "to": {"KEYWORD_ONLY"}, "dtype": {"KEYWORD_ONLY"},
}
# old or competing spellings of a vocabulary word, never a parameter name
NOT_WORDS = {"x": "inputs", "input_tensor": "inputs", "layer": "layers", "sites": "layers", "selector": "selectors",
             "module_names": "layers", "kind": "importance (channel_importance) or method (cam)",
             "targets": "target", "model_kwargs": "kwargs", "inplace": "copy"}
# the few that differ, and why
EXCEPTIONS = {
    ("edit", "input"), ("edit", "inputs"),  # what edit does to the layer's input(s), not the model's inputs
    ("grads", "tensors"), ("grads", "named"),  # grads watches tensors, not a model
    ("attribute", "unknown"), ("attribute_tokens", "unknown"),  # refused with the setting it was near
    ("diff", "model_a"), ("diff", "model_b"), ("compare_models", "before"), ("compare_models", "after"),
    ("channels_first", "t"), ("channels_last", "t"),  # reshape functions handed to cam(reshape=)
}
COPY_POLICIES = {"auto", "always", "never"}


def _parameters() -> list[tuple[str, inspect.Parameter]]:
    found = []
    for name, obj in PUBLIC.items():
        if inspect.isclass(obj) or not callable(obj) or inspect.ismodule(obj):
            continue
        found += [(name, p) for p in inspect.signature(obj).parameters.values()]
    return found


@pytest.mark.parametrize(("fn", "param"), _parameters(), ids=lambda v: getattr(v, "name", v))
def test_every_public_parameter_speaks_the_vocabulary(fn: str, param: inspect.Parameter) -> None:
    assert param.name not in NOT_WORDS, f"{fn}({param.name}=): say {NOT_WORDS[param.name]}"
    if (fn, param.name) in EXCEPTIONS:
        return
    if param.kind is param.VAR_KEYWORD:
        pytest.fail(f"{fn}(**{param.name}) would swallow a misspelt keyword")
    if param.name in VOCABULARY:
        assert param.kind.name in VOCABULARY[param.name], (fn, param.name, param.kind.name)
    if param.name == "copy":
        assert param.default in COPY_POLICIES, (fn, param.default)
    if param.name == "keep":
        keep = param.default
        assert isinstance(keep, str) or all(isinstance(k, str) for k in keep), (fn, keep)


@pytest.mark.parametrize("fn", sorted(n for n in PUBLIC if callable(PUBLIC[n]) and not inspect.isclass(PUBLIC[n])))
def test_layers_are_chosen_one_way_per_function(fn: str) -> None:
    """``*selectors`` where selection is all that is positional; ``layers=`` where inputs or data are."""
    params = inspect.signature(PUBLIC[fn]).parameters
    assert not ({"selectors", "layers"} <= set(params)), fn
    positional = {n for n, p in params.items() if p.kind is not p.KEYWORD_ONLY}
    if "selectors" in params:
        assert not positional & {"inputs", "data"}, f"{fn} takes inputs: it chooses layers with layers="


def test_all_is_grouped_by_job_with_no_repeat_and_every_result_reachable() -> None:
    names = hookscope.__all__
    assert len(names) == len(set(names))
    source = inspect.getsource(hookscope)
    groups = source[source.index("__all__ = ["):source.index("]\n", source.index("__all__ = ["))].split("    # ")[1:]
    assert len(groups) >= 6 and all(g.split("\n")[0] for g in groups), "each group of __all__ opens with its job"
    for fn in (n for n in names if callable(PUBLIC[n]) and not inspect.isclass(PUBLIC[n])):
        returned = inspect.signature(PUBLIC[fn]).return_annotation
        returned = returned if isinstance(returned, str) else getattr(returned, "__name__", "")
        for word in returned.replace("[", " ").replace("]", " ").replace("|", " ").replace(",", " ").split():
            kind = getattr(hookscope, word.split(".")[-1], None) if word[:1].isupper() else None
            if inspect.isclass(kind) and kind.__module__.startswith("hookscope"):
                assert word.split(".")[-1] in names, f"{fn} returns {word}, which hookscope does not export"


RESULT_NAMES = {"Capture", "Recording", "TensorGrads", "Summary", "Trace", "Watch", "GradientFlow", "Diff",
                "FeatureMaps", "ReferenceComparison", "CamMaps", "Sparsity", "ChannelImportance", "ChannelGroups",
                "ChannelPruning", "ModelComparison", "Store", "Curve", "Operations", "AttentionPatterns",
                "Attributions", "TokenAttributions", "HeadPruning", "WidthPruning", "StepMemory", "Components", "Telemetry", "Run",
                "LayerImportance", "LayerRemoval", "Recovery", "RoadCurves", "Randomisation", "StepRecords", "Direction", "LogitLens", "LogitAttribution", "Patching", "SegmentAttributions", "TunedLens"}


def test_result_classes_are_named_for_what_they_hold() -> None:
    """One pattern: a noun for what the result holds; no ``...Result`` beside plain nouns."""
    assert set(RESULT_TYPES) == RESULT_NAMES
    assert not [n for n in PUBLIC if n.endswith("Result")]
    for name in RESULT_NAMES:
        cls = PUBLIC[name]
        extra = {m for m in ("to_text", "to_dicts", "report", "row", "all_rows") if hasattr(cls, m)}
        assert not extra, f"{name} has a second dialect beside table()/to_dict()/to_json(): {extra}"


# --- at home in notebooks and data tools: an HTML table (and picture), a DataFrame, from the rows -----------
def _expected_records(r: object) -> list[dict[str, Any]]:
    """What a result's rows hold, read here without the protocol's own conversion."""
    if hasattr(r, "rows"):
        return [dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row) for row in r.rows]
    if isinstance(r, hookscope.AttentionPatterns):
        return [{"name": n, "shape": tuple(p.shape), "dtype": str(p.dtype).removeprefix("torch.")} for n, p in r.items()]
    assert isinstance(r, hookscope.Attributions)
    return [{"sample": i, "target": None if r.target is None else int(r.target[i]), "score": float(r.scores[i]),
             "sum": float(r.maps[i].sum()), "delta": None if r.delta is None else float(r.delta[i])}
            for i in range(r.maps.shape[0])]


def _same(a: Any, b: Any) -> bool:
    missing_a, missing_b = (v is None or (isinstance(v, float) and math.isnan(v)) for v in (a, b))
    if missing_a or missing_b:
        return missing_a and missing_b  # pandas writes a gap in a column of numbers as NaN
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return bool(a == b)


@pytest.mark.parametrize("case", RESULT_CASES)
def test_every_result_becomes_a_dataframe_of_its_rows(results, case):
    r = results[case]
    expected = _expected_records(r)
    df = r.to_pandas()
    assert list(df.columns) == list(dict.fromkeys(k for row in expected for k in row)), case
    assert len(df) == len(expected) > 0
    for got, want in zip(df.to_dict("records"), expected):
        bad = {k: (got[k], v) for k, v in want.items() if not _same(got[k], v)}
        assert not bad, (case, bad)


def test_to_pandas_without_pandas_names_the_extra(results, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an absent package looks like
    with pytest.raises(hookscope.HookscopeError) as e:
        results["Trace"].to_pandas()
    assert "pip install 'hookscope[pandas]'" in str(e.value) and "\n" not in str(e.value)


def _body_rows(page: str) -> list[list[str]]:
    body = page[page.index("<tbody>"):page.index("</tbody>")]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)]


@pytest.mark.parametrize("case", RESULT_CASES)
def test_every_result_shows_its_rows_as_an_html_table(results, case):
    r = results[case]
    expected = _expected_records(r)
    page = r._repr_html_()
    n = len(expected)
    assert f"{type(r).__name__}: {n} row{'s' if n != 1 else ''}" in page
    shown = _body_rows(page)
    assert len(shown) == min(n, HTML_ROWS + 1)
    head = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", page)
    every = list(dict.fromkeys(k for row in expected for k in row))
    columns = [c for c in r._html_columns or () if c in every] or every  # a result may show fewer than it holds
    assert head == [html.escape(c) for c in columns]
    picked = expected if n <= HTML_ROWS else expected[:HTML_ROWS // 2] + expected[-(HTML_ROWS // 2):]
    kept = [row for row in shown if row[0] != "..."]
    for cells, want in zip(kept, picked):
        for column, value in want.items():
            if column not in columns:
                continue
            if isinstance(value, str):
                assert cells[head.index(column)] == html.escape(value[:117] + "..." if len(value) > 120 else value)
            elif isinstance(value, int) and not isinstance(value, bool):
                assert cells[head.index(column)] == f"{value:,}"


def test_html_cells_are_escaped_and_long_tables_cut_in_the_middle():
    net = nn.ModuleDict({"<b>&x": nn.ReLU()})
    with hookscope.trace(net, keep="output") as t:
        for _ in range(HTML_ROWS + 10):
            net["<b>&x"](torch.ones(2))
    page = t._repr_html_()
    assert "<b>&x" not in page and "<td style=\"text-align:left\">&lt;b&gt;&amp;x</td>" in page
    n, half = HTML_ROWS + 10, HTML_ROWS // 2
    assert f"Trace: {n} rows, the first {half} and the last {half} shown" in page
    shown = _body_rows(page)
    assert shown[half] == ["..."] * len(shown[0])
    assert [int(cells[2]) for cells in shown if cells[0] != "..."] == [*range(half), *range(n - half, n)]
    assert no_hooks(net)


def _picture(page: str) -> bytes | None:
    found = re.search(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return base64.b64decode(found.group(1)) if found else None


@pytest.mark.parametrize("case", ["CamMaps", "Trace", "Diff", "GradientFlow", "Attributions", "TokenAttributions",
                                  "FeatureMaps", "ReferenceComparison", "RoadCurves", "Randomisation",
                                  "SegmentAttributions"])
def test_results_with_a_picture_show_it_under_the_table(results, case):
    page = results[case]._repr_html_()
    png = _picture(page)
    assert png is not None and png.startswith(b"\x89PNG\r\n\x1a\n"), case
    assert page.index("</table>") < page.index("<img")


def test_the_picture_of_cam_maps_is_its_maps(results):
    from PIL import Image
    res = results["CamMaps"]
    image = Image.open(io.BytesIO(_picture(res._repr_html_())))
    res2 = dataclasses.replace(res, maps=res.maps[:1], targets=res.targets[:1], scores=res.scores[:1])
    one = Image.open(io.BytesIO(_picture(res2._repr_html_())))
    assert one.width * one.height < image.width * image.height  # a panel per map of the batch


@pytest.mark.parametrize("case", ["CamMaps", "Trace", "Summary"])
def test_without_matplotlib_the_table_still_shows(results, case, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    page = results[case]._repr_html_()
    assert "<img" not in page and "<table" in page and len(_body_rows(page)) == min(len(results[case].rows), HTML_ROWS + 1)


def test_a_result_without_a_picture_shows_its_table_alone(results):
    page = results["Summary"]._repr_html_()
    assert "<img" not in page and page.count("<table") == 1


def test_a_summary_in_a_notebook_shows_what_its_text_table_does_not_its_raw_fields(results):
    page = results["Summary"]._repr_html_()
    head = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", page)
    assert head[:3] == ["name", "type", "output_shapes"] and "parameters" not in head and "uncounted" not in head
    rows = _body_rows(page)
    first = results["Summary"].rows[0]
    assert rows[0][head.index("params_total")] == f"{first.params_total:,}"
    assert rows[0][head.index("output_shapes")] == ", ".join("x".join(map(str, s)) for s in first.output_shapes)


# --- one meaning per word: the vocabulary page's table, read as the contract ------------------------
VOCABULARY_PAGE = Path(__file__).resolve().parents[1] / "docs" / "vocabulary.md"
# a former name still taken with a FutureWarning, not a vocabulary word of that function
DEPRECATED = {("capture", "device"), ("Retention", "device")}


def _cell_choices(cell: str) -> tuple[list[tuple[str, set[str] | None]], bool]:
    """A type or default cell: ``[(value, only these functions or None)]``, and whether it may be required."""
    cell = cell.replace("\\|", "|")
    found = [(v, None if not fns else {f.strip() for f in fns.split(",")})
             for v, fns in re.findall(r"`([^`]+)`(?: \(([^)]+)\))?", cell)]
    required = re.search(r"(?:^|, )required(?: \(([^)]+)\))?", cell)
    return found, required is not None


def _vocabulary_table() -> dict[str, tuple[list[tuple[str, set[str] | None]], list[tuple[str, set[str] | None]], bool]]:
    text = VOCABULARY_PAGE.read_text()
    section = text[text.index("## Arguments"):text.index("## Results")]
    table: dict[str, Any] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        word = cells[0].strip("`").lstrip("*")
        types, _ = _cell_choices(cells[1])
        defaults, required = _cell_choices(cells[2])
        table[word] = (types, defaults, required)
    return table


def _allowed(choices: list[tuple[str, set[str] | None]], fn: str) -> list[str]:
    return [v for v, fns in choices if fns is None or fn in fns]


def _annotation(p: inspect.Parameter) -> str:
    a = p.annotation
    return " ".join((a if isinstance(a, str) else inspect.formatannotation(a)).split())


def test_the_vocabulary_page_has_a_row_for_every_word_the_tests_know():
    assert set(VOCABULARY) - {"selectors"} <= set(_vocabulary_table()), "a vocabulary word without its row"


@pytest.mark.parametrize(("fn", "param"), [(f, p) for f, p in _parameters() if p.name in _vocabulary_table()],
                         ids=lambda v: getattr(v, "name", v))
def test_every_parameter_named_like_a_word_has_its_type_and_default(fn: str, param: inspect.Parameter) -> None:
    if (fn, param.name) in EXCEPTIONS | DEPRECATED:
        return
    types, defaults, required = _vocabulary_table()[param.name]
    assert _annotation(param) in _allowed(types, fn), \
        f"{fn}({param.name}: {_annotation(param)}): docs/vocabulary.md says {_allowed(types, fn)}"
    if param.default is param.empty:
        assert required or param.kind is param.VAR_POSITIONAL, f"{fn}({param.name}=) has no default; the page gives one"
    else:
        wanted = [ast.literal_eval(v) for v in _allowed(defaults, fn)]
        assert param.default in wanted and type(param.default) in {type(w) for w in wanted}, \
            f"{fn}({param.name}={param.default!r}): docs/vocabulary.md says {wanted}"


# --- a misspelt keyword: one line naming it, the closest real one and the function -------------------
# functions whose misspelt keywords still get Python's own message: reworked elsewhere at the moment
NOT_YET_CHECKED: set[str] = set()


def _a_keyword(obj: Callable[..., object]) -> str | None:
    params = [p for p in inspect.signature(obj).parameters.values()
              if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
    keyword_only = [p for p in params if p.kind is p.KEYWORD_ONLY]
    found = keyword_only or params[1:] or params  # model itself where nothing else is named
    return found[0].name if found else None  # a method with no settings (Saliency)


@pytest.mark.parametrize("fn", sorted(CALLED - NOT_YET_CHECKED))
def test_a_misspelt_keyword_names_the_closest_one_and_the_function(net, fn):
    word = _a_keyword(PUBLIC[fn])
    typo = word + word[-1] if word else "steps"
    with pytest.raises(hookscope.errors.ArgumentError) as e:
        _calls(net)[fn](**{typo: 1})
    msg = str(e.value)
    assert isinstance(e.value, TypeError) and isinstance(e.value, hookscope.HookscopeError)
    assert f"{fn}()" in msg and repr(typo) in msg, msg
    assert word is None or (repr(word) in msg and "Did you mean" in msg), msg
    assert "\n" not in msg
    assert no_hooks(net)


def test_a_keyword_input_of_the_model_passed_the_old_way_is_told_where_it_goes(net):
    with pytest.raises(hookscope.errors.ArgumentError, match=r"pass kwargs=\{'attention_mask': \.\.\.\}"):
        hookscope.summary(net, _x(), attention_mask=torch.ones(2))
    assert no_hooks(net)


def test_checked_costs_nothing_it_can_see_on_a_call_that_fits():
    from hookscope.errors import checked

    def plain(a: int, *, b: int = 1) -> int:
        return a + b

    wrapped = checked(plain)
    assert wrapped(1, b=2) == 3 and wrapped.__wrapped__ is plain  # type: ignore[attr-defined]
    assert inspect.signature(wrapped) == inspect.signature(plain)

    def inner_type_error(a: int) -> int:
        return a + "x"  # type: ignore[operator]

    with pytest.raises(TypeError) as e:  # a TypeError raised inside the function is its own, untouched
        checked(inner_type_error)(1)
    assert not isinstance(e.value, hookscope.HookscopeError)


# --- inputs: one argument everywhere ------------------------------------------------------------------
INPUT_TAKERS = sorted(n for n, o in PUBLIC.items() if callable(o) and not inspect.isclass(o)
                      and "inputs" in inspect.signature(o).parameters and n != "edit")


@pytest.mark.parametrize("fn", INPUT_TAKERS)
def test_inputs_is_one_argument_in_every_function(fn):
    p = inspect.signature(PUBLIC[fn]).parameters["inputs"]
    assert p.kind is p.POSITIONAL_OR_KEYWORD, f"{fn}(*inputs): pass the model's inputs as one argument (a tuple)"


def test_several_inputs_one_by_one_are_refused_with_the_tuple_to_pass():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    q = torch.rand(1, 3, 8)
    with pytest.raises(hookscope.errors.ArgumentError) as e:
        hookscope.summary(mha, q, q, q)
    assert "summary(model, (x, y), ...)" in str(e.value) and "\n" not in str(e.value)
    assert hookscope.summary(mha, (q, q, q)).totals.params == sum(p.numel() for p in mha.parameters())
    assert no_hooks(mha)


def test_a_named_tuple_is_one_input_and_a_plain_tuple_several():
    from collections import namedtuple
    from hookscope.core.inputs import model_args
    Pair = namedtuple("Pair", "a b")
    x = torch.ones(1, 2)
    pair = Pair(x, x)
    assert model_args(pair) == (pair,) and model_args((x, x)) == (x, x) and model_args(None) == ()
    assert model_args([x]) == ([x],)  # a list is one input, as model([x]) takes it
