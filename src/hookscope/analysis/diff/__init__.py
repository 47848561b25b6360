"""Compare two runs layer by layer: two models with the same layer names, or one model twice.

Run A is recorded with :func:`hookscope.capture` (so in-place ops cannot rewrite what was kept);
run B keeps nothing: each of its outputs is compared with the same call of run A inside the hook,
as it is produced. Every module both models have is compared call by call and tensor by tensor on
the tensors' device, and the statistics reach the host in one transfer per device at the end.

Laid out by concern: ``_arguments`` checks every argument and ``_match`` picks the modules before
anything runs; ``_settings`` says how a run is made; ``_run`` runs one side and puts the model back;
``_compare`` pairs and measures the outputs; ``_result`` holds :class:`Diff` and its text and JSON.
Must not import: any other analysis module, ``cli``, ``viz``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..._tree import tensors
from ...core.state import rng_devices
from ...errors import HookscopeError, checked
from ...core.inputs import model_args
from ...selection import Layers, check_hookable
from ._arguments import check_models, check_run_args, check_run_device, tolerance
from ._compare import ATOL, RTOL, Streamed
from ._match import matched
from ._result import Diff, DiffRow, Unmatched
from ._run import Shared, by_call, record
from ._settings import RunSetting, Settings, as_settings, describe_run, settings
from ._tolerance import Policy, depths

__all__ = ["diff", "Diff", "DiffRow", "Settings", "settings", "Unmatched", "RTOL", "ATOL"]


@checked
def diff(
    model_a: nn.Module,
    model_b: nn.Module,
    inputs: Any = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    layers: Layers | None = None,
    a: RunSetting = None,
    b: RunSetting = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int | None = 0,
    no_grad: bool = True,
    copy: str = "auto",
    to: torch.device | str | None = None,
    device: torch.device | str | None = None,
) -> Diff:
    """Run the same inputs through two models (or one model twice) and compare every layer's output.

    Modules are matched by qualified name (of the unwrapped models: DataParallel, DDP and
    ``torch.compile`` are seen through); each call of a module called several times is compared
    with the same call of the other run, and every tensor (and Python number) of a nested output
    (tuple, dict, dataclass...) with the one at the same place in the other run (dict keys by name;
    ``None`` in different places is a ``"structure"`` row). Names that only one model has are
    listed in ``Diff.unmatched``. NaN and infinities agree where both runs have the same one at the
    same place (counted in ``DiffRow.nan`` / ``.inf``, left out of the error numbers); a NaN in one
    run only is a divergence. A compiled model (``torch.compile(model)``, ``model.compile()`` or a
    compiled submodule) is re-traced with the comparison's hooks, even if it already ran, and runs
    its own compiled code again afterwards. Every argument is checked before anything runs.

    Both runs get their own copy of the inputs (moved to ``device=``, or to a model's device when the
    model is on one device and the inputs all on another), run under ``torch.no_grad()`` (unless
    ``no_grad=False``) and start from the same RNG state (``torch.manual_seed(seed)``, so dropout
    draws the same masks if both runs draw random numbers in the same order); the caller's RNG
    state, every module's train/eval flag and every buffer (BatchNorm's running statistics) are
    restored afterwards. A forward pass that fails raises :class:`~hookscope.ForwardError`
    ("run B: the forward pass failed in 'fc' (Linear), which received ...").

    Args:
        model_a, model_b: the two models; pass the same model twice to compare two settings, or
            ``torch.compile(model)`` as ``model_b`` to compare eager with compiled.
        inputs: the positional input of the forward pass, shared by both runs (a tuple for several).
        kwargs: keyword inputs of the forward pass.
        layers: selectors (see :func:`hookscope.layers`) of the modules to compare; default: every
            module and the model itself (its output is the row named ``""``).
        a, b: how each run is made: :func:`settings` (``train=``, ``autocast=``, ``context=``) or a
            function that returns a context manager.
        rtol, atol: an output diverges where ``|a - b| > atol + rtol * |b|`` anywhere (B is the
            reference); finite numbers >= 0, used for every output when either is given (the other
            is then torch.testing's float32 one, and the table says which was filled in). Left
            out: ``torch.testing``'s float32 tolerances (1.3e-6, 1e-5), except for the outputs of
            a run that had computed in bfloat16 or float16 up to them (a tensor of that dtype in a
            compared output of that run, or a compared call under autocast to it, at that call or
            before it: sticky, in call order): there ``|a - b| <= atol + eps * |b| + spread *
            scale``, with the dtype's ``eps`` (bfloat16 2**-7, float16 2**-10), ``scale`` the
            robust root mean square of B's output (masked values such as ``-1e9`` left out) and
            ``spread = 6 * eps * sqrt(depth)`` (``depth``: how many leaf modules come up to this
            one), the measured reach of rounding (at most ~4 times the largest error of a model
            against itself on TinyResNet, resnet18 and deep MLPs). ``spread`` is the detection
            limit: a change below that fraction of an output's scale cannot be told from rounding,
            and each row and the table say it ("changes below 34% of scale unseen").
            ``DiffRow.tolerance`` names the dtype.
        seed: the seed both runs start from (an int); ``None`` leaves the RNG alone.
        no_grad: run without autograd (default); ``False`` to compare a grad-mode forward pass.
        copy, to: how run A's outputs are kept (see :func:`hookscope.capture`; run B's are
            compared as they are produced and not kept). ``copy="auto"`` (the default) copies at
            once for a ``torch.compile``'d model; ``to="cpu"`` moves every recorded output off the
            accelerator as it is produced.
        device: move the inputs there before both runs (the models are not moved); by default
            they go to a model's device when the model is on one device and the inputs all on
            another.

    Returns:
        A :class:`Diff`: ``.rows``, ``.first`` (first divergent output or ``None``),
        ``.unmatched``, ``d["name"]``, ``.table()``, ``.to_dict()``, ``.to_json()``.

    Example:
        >>> import torch, hookscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).eval()
        >>> d = diff(net, net, torch.randn(2, 4), b=settings(train=True))
        >>> d.first.name, d["0"][0].max_abs
        ('1', 0.0)
    """
    check_models(model_a, model_b)
    inputs = model_args(inputs)
    if not inputs and not kwargs:
        raise HookscopeError("diff needs the inputs both runs share: diff(model_a, model_b, x)")
    rtol = None if rtol is None else tolerance("rtol", rtol)
    atol = None if atol is None else tolerance("atol", atol)
    check_run_args(kwargs, seed, no_grad, copy, to)
    run_on = check_run_device(device, model_a, model_b)
    set_a, set_b = as_settings(a, "a"), as_settings(b, "b")
    targets_a, targets_b, unmatched = matched(model_a, model_b, layers)
    check_hookable(targets_a)
    check_hookable(targets_b)
    kw = dict(kwargs or {})
    rng = rng_devices([*model_a.parameters(), *model_b.parameters(), *tensors((inputs, kw))])
    shared = Shared(inputs, kw, seed, rng, no_grad, copy, to, run_on)
    run_a = record(model_a, targets_a, set_a, shared, label="A")
    assert run_a.rec is not None  # run A is recorded
    policy = Policy(rtol, atol, depths(model_a))
    streamed = Streamed(run_a.rec, policy, by_call(run_a.done, run_a.cast))
    run_b = record(model_b, targets_b, set_b, shared, label="B", on_output=streamed)
    return Diff(streamed.rows(run_a.done, run_b.done), unmatched, rtol=policy.base.rtol, atol=policy.base.atol,
                run_a=describe_run(model_a, set_a), run_b=describe_run(model_b, set_b), filled=_filled(rtol, atol))


def _filled(rtol: float | None, atol: float | None) -> str:
    """Which tolerance was filled in when only the other was given, in words; ``""`` otherwise.

    Example:
        >>> _filled(0.01, None)
        "rtol given; atol not given: torch.testing's float32 default 1e-05 used"
    """
    if (rtol is None) == (atol is None):
        return ""
    given, other, value = ("rtol", "atol", ATOL) if atol is None else ("atol", "rtol", RTOL)
    return f"{given} given; {other} not given: torch.testing's float32 default {value:g} used"
