"""Masks applied by a forward pre-hook, in the layout of ``torch.nn.utils.prune``.

A masked parameter ``weight`` becomes the parameter ``weight_orig`` (the same Parameter object,
moved), the buffer ``weight_mask`` (same dtype, device and memory layout as the parameter, so that a
``channels_last`` weight stays ``channels_last``) and the plain attribute
``weight = weight_orig * weight_mask``, recomputed by a forward pre-hook before every call. The
layout is torch's, so a ``state_dict`` is interchangeable with a model pruned by torch, and a layer
pruned by torch is adopted: its hook is kept (it computes the same product from the same two
tensors, and keeping it lets torch's own ``prune.remove`` and further torch pruning calls work on
that layer), a new mask is multiplied into its buffer, and no second hook is added.

The hooks are instances of module-level classes (not closures), so a masked model pickles; it also
deep-copies, which a model pruned by torch does not (see :class:`MaskHook`). A ``load_state_dict``
post-hook (:class:`RefreshHook`) recomputes ``weight`` from what was loaded. A mask must be binary.
Must not import: ``torch.nn.utils.prune``, any analysis module.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from ....errors import HookscopeError
from ....selection import named_modules

__all__ = ["MaskHook", "RefreshHook", "apply_mask", "mask_of", "make_permanent", "masked", "is_torch_hook",
           "check_mask"]


class MaskHook:
    """The forward pre-hook of one masked parameter: sets ``module.<name> = <name>_orig * <name>_mask``.

    Picklable, and a masked module deep-copies (which fails with ``torch.nn.utils.prune``: its
    ``<name>`` attribute is not a graph leaf, and ``Tensor.__deepcopy__`` refuses those,
    pytorch/pytorch#103001): the hook is copied before that attribute (a module's hooks come first
    in its ``__dict__``) and hands the copy its own product of the copied ``_orig`` and ``_mask``.

    Example:
        >>> import copy
        >>> lin = nn.Linear(2, 2)
        >>> apply_mask(lin, "weight", torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        >>> [type(h).__name__ for h in lin._forward_pre_hooks.values()]
        ['MaskHook']
        >>> twin = copy.deepcopy(lin)
        >>> twin.weight.grad_fn is not None and torch.equal(twin.weight, lin.weight)
        True
    """

    __slots__ = ("name", "_module")

    def __init__(self, name: str, module: nn.Module | None = None) -> None:
        self.name = name
        self._module = None if module is None else weakref.ref(module)

    def __call__(self, module: nn.Module, inputs: object) -> None:
        if self._module is None:  # unpickled: learn the module again, so a later deepcopy can seed it
            self._module = weakref.ref(module)
        setattr(module, self.name, _product(module, self.name))

    def __getstate__(self) -> dict[str, str]:
        return {"name": self.name}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.name = state["name"]
        self._module = None  # unpickled tensors are graph leaves, which deep-copy as they are

    def __deepcopy__(self, memo: dict[int, Any]) -> MaskHook:
        old = self._module() if self._module is not None else None
        new = memo.get(id(old)) if old is not None else None
        if old is not None:
            _seed_copy(old, self.name, memo)
        return MaskHook(self.name, new if isinstance(new, nn.Module) else None)

    def __repr__(self) -> str:
        return f"MaskHook({self.name!r})"


class RefreshHook:
    """A ``load_state_dict`` post-hook: recomputes ``module.<name>`` from the loaded ``_orig`` and
    ``_mask``, so the attribute is right before the next call too (torch's stays stale until then).

    Example:
        >>> lin = nn.Linear(2, 2, bias=False)
        >>> apply_mask(lin, "weight", torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        >>> _ = lin.load_state_dict({"weight_orig": torch.ones(2, 2), "weight_mask": torch.eye(2)})
        >>> lin.weight.tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, module: nn.Module, incompatible: object) -> None:
        if mask_of(module, self.name) is not None:
            setattr(module, self.name, _product(module, self.name))

    def __getstate__(self) -> dict[str, str]:
        return {"name": self.name}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.name = state["name"]

    def __repr__(self) -> str:
        return f"RefreshHook({self.name!r})"


def _refresh_keys(module: nn.Module, name: str) -> list[int]:
    return [k for k, h in module._load_state_dict_post_hooks.items() if isinstance(h, RefreshHook) and h.name == name]


def _seed_copy(old: nn.Module, name: str, memo: dict[int, Any]) -> None:
    """Put the copy of ``old.<name>`` in deepcopy's memo: the copy's own product when its ``_orig`` and
    ``_mask`` are copied already, else a detached clone (recomputed at the copy's first call)."""
    w = old.__dict__.get(name)
    if not isinstance(w, torch.Tensor) or w.is_leaf or id(w) in memo:
        return
    orig, mask = memo.get(id(old._parameters.get(name + "_orig"))), memo.get(id(old._buffers.get(name + "_mask")))
    if isinstance(orig, torch.Tensor) and isinstance(mask, torch.Tensor):
        with torch.enable_grad():
            memo[id(w)] = mask.to(dtype=orig.dtype) * orig
    else:
        memo[id(w)] = w.detach().clone()


def _product(module: nn.Module, name: str) -> torch.Tensor:
    orig = module._parameters[name + "_orig"]
    mask = module._buffers[name + "_mask"]
    assert orig is not None and mask is not None
    return mask.to(dtype=orig.dtype) * orig  # the operand order of torch's apply_mask: same bits


def is_torch_hook(hook: object, name: str) -> bool:
    """Whether ``hook`` is a ``torch.nn.utils.prune`` method hooked for parameter ``name``
    (recognised by class name, so that torch's pruning module is never imported).

    Example:
        >>> from torch.nn.utils import prune
        >>> lin = prune.l1_unstructured(nn.Linear(2, 2), "weight", amount=1)
        >>> [is_torch_hook(h, "weight") for h in lin._forward_pre_hooks.values()]
        [True]
    """
    names = {c.__name__ for c in type(hook).__mro__}
    return "BasePruningMethod" in names and getattr(hook, "_tensor_name", None) == name


def _hook_keys(module: nn.Module, name: str) -> list[int]:
    """Keys of the pre-hooks that apply the mask of ``name``: ours and torch's."""
    return [k for k, h in module._forward_pre_hooks.items()
            if (isinstance(h, MaskHook) and h.name == name) or is_torch_hook(h, name)]


def mask_of(module: nn.Module, name: str) -> torch.Tensor | None:
    """The mask buffer of parameter ``name`` (ours or ``torch.nn.utils.prune``'s), or ``None``.

    A mask counts when ``<name>_orig`` is a parameter, ``<name>_mask`` a buffer of the same shape
    and a pre-hook (ours or torch's) applies it.

    Example:
        >>> lin = nn.Linear(2, 2)
        >>> mask_of(lin, "weight") is None
        True
        >>> apply_mask(lin, "weight", torch.tensor([[1, 0], [1, 1]]))
        >>> mask_of(lin, "weight")
        tensor([[1., 0.],
                [1., 1.]])
    """
    orig = module._parameters.get(name + "_orig")
    mask = module._buffers.get(name + "_mask")
    if orig is None or mask is None or mask.shape != orig.shape or not _hook_keys(module, name):
        return None
    return mask


def check_mask(module: nn.Module, name: str, mask: torch.Tensor, where: str = "") -> None:
    """Refuse, in one line, a mask that does not fit parameter ``name`` of ``module``: not a tensor,
    another shape, values other than 0 and 1, or a parameter that is missing or not a Parameter.

    Example:
        >>> check_mask(nn.Linear(2, 2), "weight", torch.ones(2, 3), "fc")
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: the mask for fc.weight has shape (2, 3), the parameter (2, 2); pass a mask of the parameter's shape
    """
    label = f"{where}.{name}" if where else name
    current = mask_of(module, name)
    target = module._parameters.get(name + "_orig") if current is not None else module._parameters.get(name)
    if target is None:
        have = [n for n, p in module._parameters.items() if p is not None]
        raise HookscopeError(
            f"{type(module).__name__} {where or '(module)'} has no parameter {name!r} (it has "
            f"{', '.join(repr(h) for h in have) or 'none'}); pass name= one of those")
    if not isinstance(mask, torch.Tensor):
        raise HookscopeError(f"the mask for {label} is a {type(mask).__name__}; pass a tensor of 0 and 1")
    if mask.shape != target.shape:
        raise HookscopeError(f"the mask for {label} has shape {tuple(mask.shape)}, the parameter "
                             f"{tuple(target.shape)}; pass a mask of the parameter's shape")
    if mask.device.type != "meta" and not bool(((mask == 0) | (mask == 1)).all()):
        raise HookscopeError(f"the mask for {label} holds values other than 0 and 1; pass a binary mask "
                             "(bool, or 0.0/1.0)")


def apply_mask(module: nn.Module, name: str, mask: torch.Tensor) -> None:
    """Mask parameter ``name`` of ``module``: ``<name>_orig`` (the Parameter, moved), ``<name>_mask``
    (a buffer of the parameter's dtype and device) and ``<name>`` recomputed before each call.

    A second mask is multiplied into the first (composition). A parameter masked by
    ``torch.nn.utils.prune`` keeps torch's hook and gets the product in its buffer. ``mask`` is copied,
    never kept. A mask that does not fit is refused before anything changes.

    Example:
        >>> lin = nn.Linear(2, 2, bias=False)
        >>> with torch.no_grad(): _ = lin.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        >>> apply_mask(lin, "weight", torch.tensor([[1, 0], [1, 1]]))
        >>> apply_mask(lin, "weight", torch.tensor([[1, 1], [0, 1]]))
        >>> lin.weight
        tensor([[1., 0.],
                [0., 4.]], grad_fn=<MulBackward0>)
        >>> sorted(n for n, _ in lin.named_parameters()), sorted(n for n, _ in lin.named_buffers())
        (['weight_orig'], ['weight_mask'])
    """
    check_mask(module, name, mask)
    with torch.inference_mode(False):  # a mask made under inference_mode would break every later backward
        _apply(module, name, mask)


def _laid_out_as(param: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A copy of ``mask`` in ``param``'s dtype, device and memory layout (``channels_last`` stays so),
    so that ``mask * orig`` keeps the weight's layout (a contiguous mask would make it contiguous)."""
    out = torch.empty_like(param.detach(), memory_format=torch.preserve_format)
    return out.copy_(mask.detach())


def _apply(module: nn.Module, name: str, mask: torch.Tensor) -> None:
    current = mask_of(module, name)
    if current is not None:
        orig = module._parameters[name + "_orig"]
        assert orig is not None
        new = current * mask.to(dtype=current.dtype, device=current.device)
        module.register_buffer(name + "_mask", _laid_out_as(orig, new).to(dtype=current.dtype))
    else:
        param = module._parameters[name]
        assert param is not None
        new = _laid_out_as(param, mask)
        module.register_parameter(name + "_orig", param)
        del module._parameters[name]
        module.register_buffer(name + "_mask", new)
        # own hook: the mask stays on the model after this returns, as torch.nn.utils.prune's does
        module.register_forward_pre_hook(MaskHook(name, module))
    if not _refresh_keys(module, name):  # also on a layer pruned by torch, adopted
        # own hook: the masked weight is made again when a state_dict is loaded
        module.register_load_state_dict_post_hook(RefreshHook(name))
    setattr(module, name, _product(module, name))


def make_permanent(module: nn.Module, name: str) -> None:
    """Make the mask of ``name`` permanent, as ``torch.nn.utils.prune.remove`` does: ``<name>`` is the
    Parameter object ``<name>_orig`` was (optimizers keep working), holding ``orig * mask``;
    ``<name>_orig``, ``<name>_mask`` and the hook (ours or torch's) are gone.

    Example:
        >>> lin = nn.Linear(2, 2, bias=False)
        >>> apply_mask(lin, "weight", torch.zeros(2, 2))
        >>> make_permanent(lin, "weight")
        >>> [n for n, _ in lin.named_parameters()], len(lin._forward_pre_hooks), int(lin.weight.abs().sum())
        (['weight'], 0, 0)
    """
    if mask_of(module, name) is None:
        raise HookscopeError(
            f"parameter {name!r} of {type(module).__name__} is not masked, so there is nothing to make "
            "permanent; mask it first, or pick a masked one (hookscope's masked(model) lists them)")
    with torch.no_grad():
        weight = _product(module, name)
    orig = module._parameters[name + "_orig"]
    assert orig is not None
    for key in _hook_keys(module, name):
        del module._forward_pre_hooks[key]
    for key in _refresh_keys(module, name):
        del module._load_state_dict_post_hooks[key]
    if name in module.__dict__:
        delattr(module, name)
    orig.data = weight.data
    del module._parameters[name + "_orig"]
    del module._buffers[name + "_mask"]
    module.register_parameter(name, orig)


def masked(model: nn.Module) -> list[tuple[str, str]]:
    """``(module qualname, parameter name)`` of every mask in ``model`` (ours or torch's), in
    ``named_modules()`` order, names those of the unwrapped model (DataParallel, ``torch.compile``).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
        >>> apply_mask(net[2], "weight", torch.ones(2, 2))
        >>> masked(net)
        [('2', 'weight')]
    """
    out: list[tuple[str, str]] = []
    for qualname, module in named_modules(model):
        for local in list(module._parameters):
            if local.endswith("_orig") and mask_of(module, local[: -len("_orig")]) is not None:
                out.append((qualname, local[: -len("_orig")]))
    return out
