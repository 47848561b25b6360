"""Operations as hook sites: the torch functions, ``Tensor`` methods and operators a module's own
``forward`` runs, named ``module::op`` and hooked like modules.

An :class:`OpSite` stands for the operations of one module that match a name (``add``, ``softmax``,
``add.1`` for the second ``add`` of one call, a glob such as ``*``). Hooks are registered on it
with the ordinary ``register_forward_pre_hook`` / ``register_forward_hook``, so everything that
hooks a module hooks an operation the same way. While a site holds a hook, its module's
``forward`` is wrapped (an instance attribute, removed with the last hook) and a
``TorchFunctionMode`` runs in the thread while that ``forward`` runs; the mode calls the site's
hooks around each matching operation. Nothing is installed while no operation is hooked.

Which module an operation belongs to: the innermost wrapped ``forward`` on the Python stack, unless
a module call (``Module._call_impl``) or another module's ``forward`` sits between them: operations
made by a child module (also one whose ``forward`` is called directly, ``self.child.forward(x)``), or
by a hook, are not the parent's. Calls that neither take nor return a tensor (``torch.no_grad()``
switching grad mode) are no operations.

A selector that matches no operation in a pass its modules ran is a mistake (a misspelt name): the
hooks are registered before the forward runs, so it can only be told after the pass, and
:func:`missed` says so at the end of the ``capture`` / ``edit`` block.

One file past 500 lines: the site, the ``forward`` wrapper, the function mode and the rule of
which module an operation belongs to share one per-thread state and the counts :func:`missed`
reads, and a fifth of the file is their documented examples.

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Block(nn.Module):
    ...     def forward(self, x):
    ...         return torch.relu(x + 1) * 2
    >>> block = Block()
    >>> seen = []
    >>> handle = OpSite(block, "", "add").register_forward_hook(lambda m, a, out: seen.append(out))
    >>> _ = block(torch.zeros(2))
    >>> handle.remove()
    >>> seen
    [tensor([1., 1.])]
    >>> "forward" in vars(block)  # the wrapper went with the last hook
    False
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from .._tree import tensors
from ..errors import HookscopeError, closest

__all__ = ["SEP", "OpSite", "op_name", "in_place", "call_name", "covered", "current_function", "missed", "counts", "nearest",
           "seen_ops", "split_op", "written"]

SEP = "::"
_GLOB = set("*?[")

# Operator dunders -> the torch name of the operation (``a / b`` is ``div``, ``a @ b`` is ``matmul``).
_OPERATORS = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide", "mod": "remainder",
    "pow": "pow", "matmul": "matmul", "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
    "lshift": "bitwise_left_shift", "rshift": "bitwise_right_shift", "neg": "neg", "abs": "abs",
    "invert": "bitwise_not", "getitem": "getitem", "setitem": "setitem", "eq": "eq", "ne": "ne", "lt": "lt",
    "le": "le", "gt": "gt", "ge": "ge",
}

# What never returns a tensor (sizes, flags, properties): not an operation, never counted or hooked.
_NOT_OPS = frozenset({
    "dim", "size", "numel", "item", "tolist", "stride", "is_contiguous", "data_ptr", "element_size", "nelement",
    "ndimension", "is_floating_point", "is_complex",
    "get_device", "storage_offset", "untyped_storage", "reduce_ex", "numpy", "dim_order", "shape", "dtype", "device",
    "requires_grad", "is_leaf", "grad_fn", "ndim", "is_cuda", "is_meta", "layout", "names", "is_quantized",
    "is_sparse", "is_mkldnn", "output_nr", "_version", "_base", "grad", "data", "is_nested", "has_names", "len",
    "bool", "int", "float", "complex", "index", "format", "repr", "hash",
    "is_inference", "is_shared", "is_pinned", "is_set_to", "is_same_size", "is_nonzero", "is_signed", "itemsize",
    "nbytes", "is_cpu", "is_xpu", "is_mps", "retain_grad", "register_hook", "backward", "contains", "iter",
    "reversed", "dir", "setstate", "reduce", "deepcopy", "array", "dlpack", "dlpack_device", "storage",
})
_CONVERSIONS = frozenset({"bool", "int", "float", "complex", "index", "len", "format", "repr", "hash"})  # dunders only


def split_op(name: str) -> tuple[str, str] | None:
    """``"layer1.0::add"`` -> ``("layer1.0", "add")``; ``None`` for a module name."""
    if SEP not in name:
        return None
    module, op = name.split(SEP, 1)
    return module, op


def op_name(func: Any) -> str:
    """The name an operation goes by: ``torch.add``, ``Tensor.add``, ``a + b``, ``a += b`` and
    ``Tensor.add_`` are all ``add``; ``F.scaled_dot_product_attention`` is
    ``scaled_dot_product_attention``; a property such as ``x.T`` is ``T``.

    Example:
        >>> op_name(torch.Tensor.__iadd__), op_name(torch.Tensor.__rmatmul__), op_name(torch.relu_)
        ('add', 'matmul', 'relu')
    """
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # a property of Tensor (x.T, x.mT, x.data)
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        core = name[2:-2]
        if core not in _OPERATORS and core[:1] in ("i", "r") and core[1:] in _OPERATORS:
            core = core[1:]
        return _OPERATORS.get(core, core)
    return name[:-1] if name.endswith("_") and not name.endswith("__") and len(name) > 1 else name


def in_place(func: Any) -> bool:
    """Whether ``func`` writes into its first argument (``add_``, ``+=``, ``x[i] = v``)."""
    name = getattr(func, "__name__", "") or ""
    if name.startswith("__") and name.endswith("__"):
        core = name[2:-2]
        return core == "setitem" or (core[:1] == "i" and core[1:] in _OPERATORS)
    return name.endswith("_") and not name.endswith("__")


# In-place by name, but what they change is not the values (autograd, storage, shape)
_NOT_WRITES = frozenset({"detach_", "set_", "resize_", "resize_as_", "share_memory_", "requires_grad_",
                         "retain_grad", "pin_memory", "record_stream", "rename_", "refine_names", "as_strided_",
                         "squeeze_", "unsqueeze_", "transpose_", "t_", "swapdims_", "swapaxes_"})


def written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str | int, torch.Tensor] | None:
    """Where an operation writes its result, and the tensor there: ``(0, self)`` for ``add_``, ``+=``
    and ``x[i] = v``, ``("out", t)`` for an ``out=`` argument. The model reads that tensor on
    whether or not it uses the returned value. ``None`` for an operation that makes a new tensor.

    Example:
        >>> x = torch.zeros(2)
        >>> written(torch.Tensor.add_, (x, 1), {})[0], written(torch.add, (x, 1), {"out": x})[0]
        (0, 'out')
        >>> written(torch.add, (x, 1), {}) is None, written(torch.nn.functional.relu, (x,), {"inplace": True})[0]
        (True, 0)
    """
    target = kwargs.get("out")
    if isinstance(target, torch.Tensor):
        return "out", target
    if not (args and isinstance(args[0], torch.Tensor)):
        return None
    if in_place(func) and getattr(func, "__name__", "") not in _NOT_WRITES:
        return 0, args[0]
    at = _inplace_flag(func)  # F.relu(x, inplace=True), F.dropout(x, p, training, True)
    if at is not None and (kwargs.get("inplace") is True or (len(args) > at and args[at] is True)):
        return 0, args[0]
    return None


_FLAGS: dict[Any, int | None] = {}  # function -> the position of its ``inplace`` parameter


def _inplace_flag(func: Any) -> int | None:
    """Where ``func`` takes ``inplace`` (``F.relu``: 1), worked out once per function; ``None`` if it takes none."""
    try:
        return _FLAGS[func]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable
        return None
    at = None
    try:
        names = list(inspect.signature(func).parameters)
        at = names.index("inplace") if "inplace" in names else None
    except (TypeError, ValueError):  # a builtin without a signature
        pass
    _FLAGS[func] = at
    return at


class OpSite(nn.Module):
    """The operations named ``pattern`` that ``owner``'s own ``forward`` runs, as a module to hook.

    ``pattern`` is an operation's name (``add``), its n-th use in one call (``add.1`` is the second),
    or a glob (``*``, ``soft*``). Hooks take the same arguments as module hooks: the pre-hook gets
    the operation's positional (and with ``with_kwargs=True`` keyword) arguments, the forward hook
    its output, and either may return replacements.
    """

    owner: nn.Module  # the module whose forward runs the operations (a plain reference, not a child)

    def __init__(self, owner: nn.Module, owner_name: str, pattern: str) -> None:
        super().__init__()
        self.__dict__["owner"] = owner  # a plain reference: not a child module of the site
        self.owner_name = owner_name
        self.pattern = pattern
        self.is_pattern = bool(_GLOB & set(pattern))
        self.selector = f"{owner_name}{SEP}{pattern}"  # the selector it came from (``layer*::add``)
        self.__dict__["fired"] = 0  # calls of matching operations while hooked
        self.__dict__["runs"] = 0  # calls of the owner's forward while hooked

    @property
    def site_name(self) -> str:
        """``owner_name::pattern``."""
        return f"{self.owner_name}{SEP}{self.pattern}"

    def matches(self, label: str) -> bool:
        """Whether the operation ``label`` (``add``, ``add.1``) is one of this site's."""
        if self.is_pattern:
            return fnmatch.fnmatchcase(label, self.pattern)
        return label == self.pattern

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise HookscopeError(f"{self.site_name!r} is an operation of {self.owner_name or 'the model'!r}, not a "
                             "module to call; run the model")

    def register_forward_pre_hook(self, hook: Any, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        return _attached(self, super().register_forward_pre_hook(hook, prepend=prepend, with_kwargs=with_kwargs))

    def register_forward_hook(self, hook: Any, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        handle = super().register_forward_hook(hook, prepend=prepend, with_kwargs=with_kwargs,
                                               always_call=always_call)
        return _attached(self, handle)

    def register_full_backward_hook(self, hook: Any, prepend: bool = False) -> RemovableHandle:
        raise HookscopeError(f"{self.site_name!r} is an operation; its gradients are read with "
                             "hookscope.grads or capture(keep='grads'), not backward hooks")

    def extra_repr(self) -> str:
        return repr(self.site_name)


def covered(site: nn.Module, selected: list[tuple[str, nn.Module]]) -> bool:
    """Whether ``site`` names an operation that a glob site of the same module in ``selected`` also
    selects (``::add`` beside ``::*``): hooking both would record each call twice."""
    if not isinstance(site, OpSite) or site.is_pattern:
        return False
    return any(isinstance(g, OpSite) and g.is_pattern and g.owner is site.owner and g.matches(site.pattern)
               for _, g in selected)


class _SiteHandle(RemovableHandle):
    """A hook handle of an :class:`OpSite`: removing it may unwrap the site's module."""

    site: OpSite | None

    def remove(self) -> None:
        super().remove()
        site, self.site = getattr(self, "site", None), None
        if site is not None:
            _detach(site)


class _Owner:
    """A module whose ``forward`` is wrapped: its sites, and the names of operations it ran."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.sites: list[OpSite] = []
        self.hooks = 0  # hooks registered on its sites and not removed yet
        self.saved = module.__dict__.get("forward")  # an instance forward the user set, put back after
        self.seen: dict[str, Any] = {}  # operation label -> the function, from every call so far


_lock = threading.Lock()
_owners: dict[int, _Owner] = {}


def _attached(site: OpSite, handle: RemovableHandle) -> RemovableHandle:
    owner_module = site.__dict__["owner"]
    with _lock:
        owner = _owners.get(id(owner_module))
        if owner is None:
            owner = _owners[id(owner_module)] = _Owner(owner_module)
            owner_module.__dict__["forward"] = _wrap(owner)
        if site not in owner.sites:
            owner.sites.append(site)
        site.__dict__["seen"] = owner.seen  # still readable once the hooks are gone
        owner.hooks += 1
    handle.__class__ = _SiteHandle
    handle.site = site  # type: ignore[attr-defined]
    return handle


def _detach(site: OpSite) -> None:
    owner_module = site.__dict__["owner"]
    with _lock:
        owner = _owners.get(id(owner_module))
        if owner is None:
            return
        owner.hooks -= 1
        if not (site._forward_hooks or site._forward_pre_hooks) and site in owner.sites:
            owner.sites.remove(site)
        if owner.hooks > 0:
            return
        del _owners[id(owner_module)]
        if owner.saved is None:
            owner_module.__dict__.pop("forward", None)
        else:
            owner_module.__dict__["forward"] = owner.saved


def seen_ops(site: nn.Module) -> dict[str, Any]:
    """The operations (label -> function) the module of ``site`` ran while it was hooked (for "did
    you mean"); empty for a module or a site never hooked."""
    return dict(site.__dict__.get("seen", {})) if isinstance(site, OpSite) else {}


class _Frame:
    __slots__ = ("owner", "counts")

    def __init__(self, owner: _Owner) -> None:
        self.owner = owner
        self.counts: dict[str, int] = {}


class _State(threading.local):
    def __init__(self) -> None:
        self.frames: list[_Frame] = []
        self.mode: _OpMode | None = None
        self.current: list[str] = []  # the concrete name of the operation whose hooks run now
        self.funcs: list[Any] = []  # and its function


_state = _State()


def call_name(module: nn.Module, name: str) -> str:
    """The name to file a call under: ``name``, or for a site given as a glob, the operation that
    runs now (``h.0::softmax`` for ``h.0::soft*``)."""
    if isinstance(module, OpSite) and module.is_pattern and _state.current:
        return _state.current[-1]
    return name


def current_function() -> Any:
    """The function of the operation whose hooks run now (``torch.add``, ``Tensor.__iadd__``), or ``None``."""
    return _state.funcs[-1] if _state.funcs else None


def _wrap(owner: _Owner) -> Callable[..., Any]:
    module = owner.module

    def forward(*args: Any, **kwargs: Any) -> Any:  # the signature and name of the forward it wraps (below)
        original = owner.saved if owner.saved is not None else type(module).forward.__get__(module)
        state = _state
        for site in owner.sites:
            site.__dict__["runs"] += 1
        state.frames.append(_Frame(owner))
        mode = _OpMode() if state.mode is None else None  # one mode per thread, entered by the outermost forward
        if mode is not None:
            state.mode = mode
            mode.__enter__()  # type: ignore[no-untyped-call]
        try:
            return original(*args, **kwargs)
        finally:
            state.frames.pop()
            if mode is not None:
                state.mode = None
                mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]

    # inspect.signature(model.forward) still answers (transformers' generate() reads it)
    functools.update_wrapper(forward, owner.saved if owner.saved is not None else type(module).forward.__get__(module))
    return forward


def _call_codes() -> frozenset[Any]:
    """Code objects of PyTorch's module call: a frame of one of them means "inside a module call,
    outside the forward being wrapped" (a child's operations, or a hook's)."""
    impl = nn.Module._call_impl.__code__
    inner = [c for c in impl.co_consts if hasattr(c, "co_name") and c.co_name == "inner"]
    return frozenset([impl, nn.Module._wrapped_call_impl.__code__, *inner])


_CALLS = _call_codes()
_WRAPPER = next(c for c in _wrap.__code__.co_consts if getattr(c, "co_name", "") == "forward")


def _owner_frame() -> _Frame | None:
    """The frame of the wrapped ``forward`` the running operation belongs to, or ``None``."""
    f: Any = sys._getframe(2)
    while f is not None:
        code = f.f_code
        if code is _WRAPPER:
            frames = _state.frames
            return frames[-1] if frames else None
        if code in _CALLS or (code.co_name == "forward" and _other_module(f)):
            return None
        f = f.f_back
    return None


def _other_module(f: Any) -> bool:
    """Whether the ``forward`` frame ``f`` is another module's than the innermost wrapped one's
    (``self.child.forward(x)``: the child's operations)."""
    code = f.f_code
    if not (code.co_argcount and code.co_varnames[0] == "self"):
        return False
    frames = _state.frames
    mine = frames[-1].owner.module if frames else None
    if mine is not None and getattr(type(mine).forward, "__code__", None) is code:
        return False  # the owner's own forward, the frame every one of its operations passes: no locals read
    owner = f.f_locals.get("self")
    return isinstance(owner, nn.Module) and owner is not mine


_NAMES: dict[Any, str] = {}  # function -> op_name(function)


def _name(func: Any) -> str:
    """:func:`op_name`, worked out once per function (this runs on every operation of a hooked forward)."""
    try:
        return _NAMES[func]
    except KeyError:
        name = _NAMES[func] = op_name(func)
        return name
    except TypeError:  # an unhashable callable
        return op_name(func)


class _OpMode(TorchFunctionMode):
    """Calls the hooks of the sites an operation matches, around it."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        frame = _owner_frame()
        if frame is None:
            return func(*args, **kwargs)
        op = _name(func)
        if op in _NOT_OPS and (op not in _CONVERSIONS or getattr(func, "__name__", "").startswith("__")):
            return func(*args, **kwargs)
        if getattr(func, "__module__", None) == "torch._C" and next(iter(tensors((args, kwargs))), None) is None:
            return func(*args, **kwargs)  # grad mode and the like: state of torch, not an operation on tensors
        n = frame.counts.get(op, 0)
        label = op if n == 0 else f"{op}.{n}"
        frame.counts[op] = n + 1
        sites = [s for s in frame.owner.sites if s.matches(label)]
        if not sites:
            out = func(*args, **kwargs)
        else:
            out = _run_hooked(sites, label, func, args, kwargs)
        if next(iter(tensors(out)), None) is None:  # size(), dim(), dtype: not an operation on tensors
            frame.counts[op] = n
        else:
            frame.owner.seen.setdefault(label, func)
        return out


def _run_hooked(sites: list[OpSite], label: str, func: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """Run ``func`` with the sites' pre-hooks before it and forward hooks after it, as a module call
    runs its hooks."""
    _state.funcs.append(func)
    try:
        return _run_sites(sites, label, func, args, kwargs)
    finally:
        _state.funcs.pop()


def _run_sites(sites: list[OpSite], label: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for site in sites:
        site.__dict__["fired"] += 1
        _state.current.append(f"{site.owner_name}{SEP}{label}")
        try:
            args, kwargs = _pre(site, args, kwargs)
        finally:
            _state.current.pop()
    try:
        out = func(*args, **kwargs)
    except BaseException:
        for site in sites:  # as a module call does: forward hooks registered with always_call=True see the failure
            _state.current.append(f"{site.owner_name}{SEP}{label}")
            try:
                _post(site, args, kwargs, None, only_always=True)
            finally:
                _state.current.pop()
        raise
    for site in sites:
        _state.current.append(f"{site.owner_name}{SEP}{label}")
        try:
            out = _post(site, args, kwargs, out)
        finally:
            _state.current.pop()
    return out


def _pre(site: OpSite, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    for hook_id, hook in list(site._forward_pre_hooks.items()):
        if hook_id in site._forward_pre_hooks_with_kwargs:
            got = hook(site, args, kwargs)
            if got is not None:
                args, kwargs = got
        else:
            got = hook(site, args)
            if got is not None:
                args = got if isinstance(got, tuple) else (got,)
    return args, kwargs


def _post(site: OpSite, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, only_always: bool = False) -> Any:
    for hook_id, hook in list(site._forward_hooks.items()):
        if only_always and hook_id not in site._forward_hooks_always_called:
            continue
        if hook_id in site._forward_hooks_with_kwargs:
            got = hook(site, args, kwargs, out)
        else:
            got = hook(site, args, out)
        if got is not None:
            out = got
    return out



def missed(sites: list[OpSite], since: dict[int, tuple[int, int]] | None = None) -> str | None:
    """One line naming the first selector whose sites matched no operation although a module of
    theirs ran (counted since ``since``, a :func:`counts` taken when the hooks went on), with the
    closest operations that ran; ``None`` when every selector matched, or none of its modules ran.

    Example:
        >>> block = nn.Sequential(nn.ReLU())
        >>> site = OpSite(block[0], "0", "rleu")
        >>> handle = site.register_forward_hook(lambda m, a, out: None)
        >>> _ = block(torch.zeros(1))
        >>> handle.remove()
        >>> missed([site]).split(" List")[0]
        "selector '0::rleu' matched no operation in the forward pass. Did you mean '0::relu'?"
    """
    start = since or {}
    by_selector: dict[str, list[OpSite]] = {}
    for site in sites:
        by_selector.setdefault(site.selector, []).append(site)

    def fired(group: list[OpSite]) -> int:
        return sum(s.__dict__["fired"] - start.get(id(s), (0, 0))[0] for s in group)

    for selector, group in by_selector.items():
        ran = sum(s.__dict__["runs"] - start.get(id(s), (0, 0))[1] for s in group)
        # names resolved from one glob and handed on one by one ('h.0::sdpa', 'h.1::sdpa'...) come
        # back as selectors of their own: enough that the operation ran in one of their modules
        patterns = {g.pattern for g in group}
        same = [s for s in sites if s.pattern in patterns]
        if fired(group) or not ran or fired(same):
            continue
        names = list(dict.fromkeys(f"{s.owner_name}{SEP}{label}" for s in group for label in seen_ops(s)))
        near = nearest(selector, names)
        hint = f" Did you mean {', '.join(repr(n) for n in near)}?" if near else ""
        if not hint:
            hint = (f" It ran: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}." if names else
                    " Its module ran no operation of its own.")
        return (f"selector {selector!r} matched no operation in the forward pass.{hint} List the operations of "
                "one pass with hookscope.operations(model, inputs) or `hookscope layers --ops MODEL`")
    return None


def nearest(selector: str, names: list[str]) -> list[str]:
    """The operation names (``module::op``) closest to ``selector``, best first; for a glob over
    modules (``*::lineer``) by the operation's part alone.

    Example:
        >>> sorted(nearest("*::ad", ["fc::linear", "layer1::add", "layer2::add"]))
        ['layer1::add', 'layer2::add']
    """
    near = closest(selector, names)
    if not near and SEP in selector:
        labels = closest(selector.split(SEP, 1)[1], [n.split(SEP, 1)[1] for n in names if SEP in n])
        near = [n for n in names if SEP in n and n.split(SEP, 1)[1] in labels][:3]
    return near


def counts(sites: list[OpSite]) -> dict[int, tuple[int, int]]:
    """Where the sites' counts of matching operations and of their module's calls stand now, for :func:`missed`."""
    return {id(s): (s.__dict__["fired"], s.__dict__["runs"]) for s in sites}
