"""What a saliency method explains and how it calls the model: logits read from any model output,
class targets checked, keyword inputs cut to the rows of a batch, and a failing forward pass
reported as one :class:`~hookscope.ForwardError`.

Shared by :mod:`.cam` and :mod:`.cam_metrics` so that ``target=``, ``output=`` and ``kwargs=`` mean
the same in both, so that both see the same models whose samples interact, and so that a model
that fails says where in both.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from .._tree import tree_map
from ..core.failure import forward_error, module_label, received
from ..core.text import first_line
from ..errors import ForwardError, HookscopeError
from ..selection import named_modules, unwrap

__all__ = ["Target", "anchored", "batch_coupled", "call_user", "check_range", "class_index_of", "class_targets",
           "for_rows",
           "is_function", "logits_of", "read_logits", "user_scores", "per_sample", "rows_of", "forward_failure",
           "call_model", "pinned", "scores_of"]

Target = int | Sequence[int] | torch.Tensor | Callable[[Any], torch.Tensor] | None
_USER_MISTAKES = (AttributeError, KeyError, IndexError, TypeError, ValueError)


def is_function(target: Any) -> bool:
    """A target given as a function of the model's output (tensors are callable objects too)."""
    return callable(target) and not isinstance(target, torch.Tensor)


def call_user(fn: Callable[[Any], Any], value: Any, what: str) -> Any:
    """``fn(value)``, with a mistake in the user's function turned into one line that names it.

    Example:
        >>> call_user(lambda o: o.logits, torch.zeros(2, 3), "output=")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: output= failed on the model's Tensor output (AttributeError: ...
    """
    try:
        return fn(value)
    except _USER_MISTAKES as e:
        raise HookscopeError(f"{what} failed on the model's {type(value).__name__} output "
                             f"({type(e).__name__}: {first_line(e)}); fix the {what} function") from e


def logits_of(out: Any) -> torch.Tensor | None:
    """The ``logits`` tensor a model output holds (a Hugging Face ``ModelOutput``'s ``.logits``, a dict's
    ``"logits"``), ``None`` when it holds none.

    Example:
        >>> logits_of({"logits": torch.zeros(2, 5)}).shape, logits_of((torch.zeros(2),))
        (torch.Size([2, 5]), None)
    """
    found = getattr(out, "logits", None)
    if found is None and isinstance(out, Mapping):
        found = out.get("logits")
    return found if isinstance(found, torch.Tensor) else None


def read_logits(output: Callable[[Any], torch.Tensor] | None, out: Any, batch: int) -> torch.Tensor:
    """``batch x classes`` logits: ``out`` itself, or what ``output(out)`` picks from it.

    With ``output=None``, an output that is not a tensor but holds a ``logits`` tensor (a Hugging Face
    ``ModelOutput``'s ``.logits``, a dict's ``"logits"``) is read there, as every Hugging Face user
    writes by hand; it must still be ``batch x classes``.

    Example:
        >>> read_logits(lambda o: o["logits"], {"logits": torch.zeros(2, 5)}, 2).shape
        torch.Size([2, 5])
        >>> read_logits(None, {"logits": torch.zeros(2, 5)}, 2).shape
        torch.Size([2, 5])
    """
    if output is None:
        logits = out if isinstance(out, torch.Tensor) else logits_of(out)
        if logits is None:
            raise HookscopeError(f"the model returns a {type(out).__name__}, not a logits tensor; pass "
                                 "output= a function that picks B x classes logits, e.g. output=lambda o: o.logits")
    else:
        logits = call_user(output, out, "output=")
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != batch:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise HookscopeError(f"class targets need B x classes logits (B={batch}), got {shape}; pass output= "
                             "that returns them, or a target function that returns one score per sample")
    return logits


def anchored(target: Any, output: Callable[[Any], torch.Tensor] | None, out: Any) -> Any:
    """The target to score perturbed copies of the inputs whose own model output is ``out`` (read
    through ``output=`` first): ``target.anchor(...)`` for a target that has it (a region predicted on
    the inputs stays where it was, a box is checked to be found there), else ``target`` itself.

    Example:
        >>> anchored(len, None, torch.zeros(2)) is len
        True
    """
    anchor = getattr(target, "anchor", None)
    if not is_function(target) or not callable(anchor):
        return target
    return anchor(out if output is None else call_user(output, out, "output="))


def for_rows(target: Any, rows: torch.Tensor) -> Any:
    """The target for a batch made of the samples ``rows`` (which may repeat): ``target.take(rows)`` for
    a target that holds data per sample (a mask, a box, a reference per image), else ``target`` itself.

    Example:
        >>> for_rows(len, torch.tensor([0, 0])) is len
        True
    """
    take = getattr(target, "take", None)
    return take(rows) if is_function(target) and callable(take) else target


def class_index_of(target: Any) -> Any:
    """The class index a target object stands for (its ``class_index``, as :class:`hookscope.targets.Class`
    has), else ``target`` itself: ``target=Class(3)`` then means exactly ``target=3``.

    Example:
        >>> class Three:
        ...     class_index = 3
        ...     def __call__(self, out): return out[:, 3]
        >>> class_index_of(Three()), class_index_of([1, 2])
        (3, [1, 2])
    """
    index = getattr(target, "class_index", None) if is_function(target) else None
    return target if index is None else index


def class_targets(target: Target, batch: int, classes: int | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """``batch`` class indices (long) from an int, a list, a tensor or a numpy array of them.

    ``classes`` checks the range (one line naming the first class out of range).

    Example:
        >>> class_targets(3, 2, classes=10).tolist(), class_targets([1, 2], 2).tolist()
        ([3, 3], [1, 2])
    """
    try:  # ints, lists, tensors, numpy integers and arrays
        if isinstance(target, (bool, str, bytes)) or target is None or is_function(target):
            raise TypeError
        t = torch.as_tensor(target, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise HookscopeError(f"target={target!r} is not a class index; pass an int, one int per sample, "
                             "a function returning one score per sample, or None for the predicted class") from None
    if t.numel() == 0 and t.ndim == 1:  # [] for an empty batch: as_tensor makes it float
        t = t.long()
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise HookscopeError(f"target must hold integer class indices, got dtype {t.dtype}")
    if t.ndim > 1:
        raise HookscopeError(f"target of shape {tuple(t.shape)} is not one class index per sample; pass a flat list")
    t = t.long().expand(batch).clone() if t.ndim == 0 else t.long()
    if t.shape[0] != batch:
        raise HookscopeError(f"target has {t.shape[0]} class indices for a batch of {batch}; "
                             "give one per sample or one int for all")
    if classes is not None:
        check_range(t, classes)
    return t


def check_range(targets: torch.Tensor, classes: int) -> None:
    """One line naming the first target outside ``0 .. classes - 1``."""
    bad = ((targets < 0) | (targets >= classes)).nonzero()
    if len(bad):
        i = int(bad[0, 0])
        raise HookscopeError(f"target class {int(targets[i])} (sample {i}) is out of range: the model has "
                             f"{classes} classes (0 to {classes - 1})")


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def batch_coupled(model: nn.Module) -> str | None:
    """The first batch norm that normalises with each batch's own statistics even in eval mode
    (``track_running_stats=False``), named with its type; ``None`` when in eval mode every sample is
    computed on its own.

    Example:
        >>> batch_coupled(nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2, track_running_stats=False)))
        "BatchNorm2d '1'"
    """
    for name, m in model.named_modules():
        if isinstance(m, _BATCH_NORMS) and m.running_mean is None:
            return f"{type(m).__name__} {name!r}"
    return None


def user_scores(fn: Callable[[Any], Any], output: Callable[[Any], torch.Tensor] | None, out: Any,
                batch: int, what: str) -> torch.Tensor:
    """``fn`` (a target function) applied to the model's output, read through ``output=`` first;
    one line unless it gives one score per sample. ``what`` names the batch in that line.

    Example:
        >>> user_scores(lambda o: o[:, 0], None, torch.zeros(2, 3), 2, "a batch of 2").tolist()
        [0.0, 0.0]
    """
    v = call_user(fn, out if output is None else call_user(output, out, "output="), "target=")
    if not isinstance(v, torch.Tensor) or v.shape != (batch,):
        got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
        raise HookscopeError(f"target= returned {got} for {what}; it must return one score per "
                             f"sample, shape ({batch},)")
    return v


# --- keyword inputs and the model call ---------------------------------------------------------------
def per_sample(kwargs: Mapping[str, Any], batch: int) -> bool:
    """Does any keyword input hold a tensor with one row per sample (``batch`` rows)?"""
    found = []
    tree_map(lambda t: found.append(t.dim() > 0 and t.shape[0] == batch), dict(kwargs))
    return any(found)


def rows_of(kwargs: Mapping[str, Any], rows: torch.Tensor, batch: int) -> dict[str, Any]:
    """The keyword inputs of a batch made of the samples ``rows`` (which may repeat): each tensor
    with ``batch`` rows indexed by ``rows``, everything else as it is.

    Example:
        >>> rows_of({"mask": torch.tensor([[1], [2]]), "scale": 3}, torch.tensor([1, 1, 0]), 2)
        {'mask': tensor([[2],
                [2],
                [1]]), 'scale': 3}
    """
    def pick(t: torch.Tensor) -> torch.Tensor:
        return t[rows.to(t.device)] if t.dim() > 0 and t.shape[0] == batch else t

    return {k: tree_map(pick, v) for k, v in kwargs.items()}


_CALL = nn.Module._call_impl.__code__  # every module call runs through it, fast path or not


def _failed_in(exc: BaseException, inner: nn.Module) -> tuple[str, nn.Module, Any, Any] | None:
    """The innermost module of ``inner`` whose call ``exc`` went through, with what it received.

    Read from the traceback after the fact, so that a successful run pays nothing for it.
    """
    names = {id(m): n for n, m in named_modules(inner)}
    found = None
    tb: types.TracebackType | None = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is _CALL and id(frame.f_locals.get("self")) in names:
            module = frame.f_locals["self"]
            found = (names[id(module)], module, frame.f_locals.get("args", ()), frame.f_locals.get("kwargs"))
        tb = tb.tb_next
    return found




def forward_failure(exc: BaseException, model: nn.Module, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> ForwardError:
    """The one-line :class:`~hookscope.ForwardError` for ``model(*args, **kwargs)`` raising ``exc``:
    the module it failed in and what that module received, both read from the traceback (raise it
    ``from exc``).

    What had run before is not said: knowing it takes a hook on every module, about 2% of a
    batch-1 resnet18 forward, paid by every call that does not fail.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(3, 1))
        >>> try:
        ...     net(torch.ones(1, 2))
        ... except RuntimeError as e:
        ...     print(forward_failure(e, net, (torch.ones(1, 2),), {}))  # doctest: +ELLIPSIS
        the forward pass failed in '1' (Linear), which received input[0] 1x2 float32: RuntimeError: ...
    """
    inner = model if isinstance(model, torch.jit.ScriptModule) else unwrap(model)[0]
    name, module, a, k = _failed_in(exc, inner) or ("", inner, args, kwargs)
    return forward_error(exc, module_label(name, module), got=received(tuple(a), dict(k or {})), after=None)


def call_model(model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """``model(*args, **kwargs)``; a failure becomes a :class:`~hookscope.ForwardError` (chained).

    Example:
        >>> call_model(nn.Linear(2, 3), (torch.ones(4, 2),), {}).shape
        torch.Size([4, 3])
    """
    try:
        return model(*args, **kwargs)
    except HookscopeError:
        raise  # hookscope's own (an outer capture's, or a ForwardError from a nested call)
    except Exception as e:
        raise forward_failure(e, model, args, kwargs) from e


# --- a target pinned on the inputs, scored on any batch made of their samples -------------------------
def pinned(target: Target, out: Any, batch: int) -> Any:
    """The target read on the inputs' own output ``out``, to score other batches of the same samples
    (scaled, noisy or baseline copies): class indices (``None``: each sample's predicted class, the
    argmax of ``out``'s logits), or a function anchored there (a region predicted on the inputs stays).

    Example:
        >>> pinned(None, torch.tensor([[0.0, 2.0], [3.0, 1.0]]), 2).tolist()
        [1, 0]
    """
    target = class_index_of(target)
    if is_function(target):
        user_scores(cast(Callable[[Any], Any], target), None, out, batch, f"a batch of {batch}")  # checked once, here
        return anchored(target, None, out)
    logits = out if isinstance(out, torch.Tensor) else logits_of(out)
    if logits is None or logits.ndim != 2 or logits.shape[0] != batch:
        got = type(out).__name__ if logits is None else "x".join(map(str, logits.shape))
        raise HookscopeError(f"class targets need B x classes logits (B={batch}), got {got}; pass target= a function "
                             "of the output giving one score per sample, e.g. lambda out: out.logits[:, -1, token]")
    if target is None:
        return logits.detach().argmax(1)
    return class_targets(cast(Target, target), batch, logits.shape[1], logits.device)


def scores_of(target: Any, out: Any, rows: torch.Tensor) -> torch.Tensor:
    """One score per row of ``out``, the output of a batch made of the samples ``rows``, for a target
    :func:`pinned` on those samples.

    Example:
        >>> scores_of(torch.tensor([1, 0]), torch.tensor([[0.0, 2.0], [3.0, 1.0], [5.0, 4.0]]),
        ...           torch.tensor([0, 1, 1])).tolist()
        [2.0, 3.0, 5.0]
    """
    n = len(rows)
    if is_function(target):
        return user_scores(for_rows(target, rows), None, out, n, f"a batch of {n}")
    logits = read_logits(None, out, n)
    return logits.gather(1, target.to(logits.device)[rows.to(logits.device)].unsqueeze(1)).squeeze(1)

