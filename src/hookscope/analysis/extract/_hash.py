"""What a resumed extract must find unchanged, as a sha256 that a fresh process computes alike.

Values count by their contents (containers recursively, dict keys in a stable order, tensors and arrays by
their bytes, other objects by what they hold, never by a repr holding an address), functions by their code,
the globals they read, their defaults and closure, partials by their function and arguments, C functions by
the name they are found under and what they are bound to. What cannot be seen reliably (a C callable found
under no name, a structure nested too deeply) is listed in :attr:`Digest.opaque`, so that a resume refuses it
instead of trusting it.
"""

from __future__ import annotations

import collections
import copyreg
import enum
import functools
import hashlib
import logging
import os
import sys
import sysconfig
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["Digest", "callable_name", "code_hash", "model_digest"]

_DEPTH = 24  # nesting beyond this is not followed: what lies deeper is reported as opaque
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class written in Python (its instances hold their state in __dict__)
_C_CALLABLES = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodDescriptorType,
                types.WrapperDescriptorType, types.MethodWrapperType, types.ClassMethodDescriptorType)
_CLASS_SKIPPED = frozenset({"__dict__", "__weakref__", "__doc__", "__firstlineno__", "__static_attributes__"})
_MODULE_INTERNALS = frozenset(k for k in vars(nn.Module()) if k.startswith("_")) | {"_modules", "_parameters",
                                                                                     "_buffers"}
# attributes that hold a value of the process, not of the model: transformers' GenerationConfig keeps Python's
# hash() of itself, salted anew in every process
_VOLATILE = frozenset({"_original_object_hash"})
_HOOKS = (("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs"), ("_forward_hooks", "_forward_hooks_with_kwargs"))
_SCALARS = (bool, int, float, complex, str, bytes)
_EXACT = {t: f"builtins.{t.__name__}:".encode() for t in _SCALARS}
_LIBRARY_ROOTS = tuple(sorted({os.path.realpath(p) + os.sep for k, p in sysconfig.get_paths().items()
                               if k in ("stdlib", "platstdlib", "purelib", "platlib")}))


def _qualname(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{name}" if isinstance(module, str) else str(name)


@functools.lru_cache(maxsize=None)
def _library(module: str) -> bool:
    """Whether ``module`` is installed code (the standard library, site-packages) rather than the user's own."""
    top = module.partition(".")[0]
    if not top or top in sys.builtin_module_names or top in sys.stdlib_module_names:
        return bool(top)
    file = getattr(sys.modules.get(top), "__file__", None)
    return isinstance(file, str) and os.path.realpath(file).startswith(_LIBRARY_ROOTS)


def _plain(v: Any) -> bytes | None:
    """The bytes of a value that is its own description (numbers, text, dtypes, modules), else None."""
    prefix = _EXACT.get(type(v))
    if prefix is not None:  # the common case first: a list of floats is hashed float by float
        return prefix + repr(v).encode()
    if v is None or v is Ellipsis or v is NotImplemented:
        return repr(v).encode()
    if isinstance(v, enum.Enum):
        return f"enum {_qualname(type(v))}.{v.name}".encode()
    for base in _SCALARS:
        if isinstance(v, base):
            return f"{_qualname(type(v))}:{base.__repr__(v)}".encode()
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return f"{type(v).__name__}:{v}".encode()
    if isinstance(v, types.ModuleType):
        return f"module {v.__name__}".encode()
    if isinstance(v, logging.Logger):  # its caches and handlers say nothing of the values computed
        return f"logger {v.name}".encode()
    return None


def _found(module: str, qualname: str, obj: Any) -> bool:
    """Whether ``module.qualname`` is ``obj`` (so that the name alone says which callable it is)."""
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found is obj


def _reduced(v: Any) -> Any:
    """``v.__reduce_ex__(4)`` (what pickle rebuilds it from), or None where it has none."""
    try:
        return v.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 - whatever a foreign object raises means the same: no reduction
        return None


def callable_name(fn: Any) -> str:
    """How a reduction's function is named in the manifest: module and qualified name, a partial with its
    arguments, a C function under the name it is found by.

    Example:
        >>> callable_name(functools.partial(torch.amax, dim=1))
        'functools.partial(torch.amax, dim=1)'
        >>> callable_name(torch.ones(1).mean), callable_name(np.add)
        ('Tensor.mean', 'numpy.add')
    """
    if isinstance(fn, functools.partial):
        args = [_short(a) for a in fn.args] + [f"{k}={_short(v)}" for k, v in fn.keywords.items()]
        return f"functools.partial({', '.join([callable_name(fn.func), *args])})"
    if isinstance(fn, types.MethodType):
        return callable_name(fn.__func__)
    if not isinstance(fn, types.FunctionType) and callable(getattr(fn, "__wrapped__", None)):
        return callable_name(fn.__wrapped__)  # a C wrapper such as functools.lru_cache: named by what it wraps
    module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
    if isinstance(module, str) and isinstance(name, str) and _found(module, name, fn):
        return f"{module}.{name}"  # torch.amax, numpy.add: the name it is found under
    if isinstance(fn, (types.FunctionType, type)):
        return _qualname(fn)
    if isinstance(fn, _C_CALLABLES) or isinstance(fn, np.ufunc):
        return str(getattr(fn, "__qualname__", None) or name)
    try:
        text = repr(fn) if getattr(type(fn), "__repr__") is not getattr(object, "__repr__") else ""
    except Exception:  # noqa: BLE001 - a user's __repr__ that fails: the class names it
        text = ""
    return text if text and " at 0x" not in text and len(text) <= 60 else _qualname(type(fn))


def _short(v: Any) -> str:
    if _plain(v) is not None and not isinstance(v, types.ModuleType):
        text = repr(v)
        return text if len(text) <= 40 else f"<{type(v).__name__}>"
    if isinstance(v, torch.Tensor):
        return f"<tensor {tuple(v.shape)}>"
    return callable_name(v) if callable(v) else f"<{type(v).__name__}>"


class Digest:
    """A sha256 fed with values and callables, and the list of what it could not see (``opaque``).

    ``modules`` names the model's own modules: met as a value, one of them counts by its name.

    Example:
        >>> a, b = Digest(), Digest()
        >>> a.add({"scale": 1.0, "dims": [1, 2]}, "opts"); b.add({"dims": [1, 2], "scale": 5.0}, "opts")
        >>> a.hexdigest() == b.hexdigest(), a.opaque
        (False, [])
    """

    def __init__(self, modules: Mapping[int, str] | None = None) -> None:
        self._h = hashlib.sha256()
        self.opaque: list[str] = []
        self._memo: dict[int, int] = {}
        self._alive: list[Any] = []  # what the memo names stays alive, so that no id is reused meanwhile
        self._modules = dict(modules or {})

    def hexdigest(self) -> str:
        """The sha256 of everything added, in hex."""
        return self._h.hexdigest()

    def put(self, *parts: object) -> None:
        """Feed text or bytes, each with its length (no two sequences of parts run together)."""
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            self._h.update(len(b).to_bytes(8, "little") + b)

    def _opaque(self, where: str, why: str) -> None:
        self.put("opaque", where)
        self.opaque.append(f"{where}: {why}")

    def add(self, v: Any, where: str, depth: int = 0) -> None:
        """Feed a value or callable, followed recursively; ``where`` names it in :attr:`opaque`."""
        plain = _plain(v)
        if plain is not None:
            self.put(plain)
            return
        if depth > _DEPTH:
            self._opaque(where, f"nested more than {_DEPTH} levels deep")
            return
        seen = self._memo.get(id(v))
        if seen is not None:  # a cycle or a shared object: named by when it was first met
            self.put("ref", seen)
            return
        self._memo[id(v)] = len(self._memo)
        self._alive.append(v)
        for kinds, how in _TABLE:
            if isinstance(v, kinds):
                how(self, v, where, depth + 1)
                return
        self._other(v, where, depth + 1)

    def _sub(self, v: Any, where: str, depth: int) -> bytes:
        """``v``'s own bytes or digest (a dict key, a set item: sorted by it), its opaque parts reported here."""
        plain = _plain(v)
        if plain is not None:
            return plain
        d = Digest(self._modules)
        d.add(v, where, depth)
        self.opaque += d.opaque
        return d.hexdigest().encode()

    def _tensor(self, t: torch.Tensor, where: str, depth: int) -> None:
        self.put("tensor", t.dtype, tuple(t.shape))
        try:
            c = t.detach()
            c = (c.to_dense() if c.layout != torch.strided else c).cpu().contiguous()
            self.put(c.reshape(-1).view(torch.uint8).numpy().tobytes())
        except (RuntimeError, TypeError, NotImplementedError, ValueError):
            self._opaque(where, f"a {type(t).__name__} whose values cannot be read")

    def _array(self, a: np.ndarray[Any, Any], where: str, depth: int) -> None:
        self.put("ndarray", a.dtype.str, a.shape)
        if a.dtype.hasobject:
            for i, x in enumerate(a.ravel().tolist()):
                self.add(x, f"{where}[{i}]", depth)
        else:
            self.put(np.ascontiguousarray(a).tobytes())

    def _numpy_scalar(self, v: np.generic, where: str, depth: int) -> None:
        self.put("numpy", v.dtype.str, v.tobytes())

    def _mapping(self, m: Mapping[Any, Any], where: str, depth: int) -> None:
        self.put(_qualname(type(m)), len(m))
        if isinstance(m, collections.defaultdict):
            self.add(m.default_factory, f"{where}.default_factory", depth)
        keyed = sorted(((self._sub(k, where, depth), k) for k in m), key=lambda e: e[0])
        for digest, k in keyed:
            self.put(digest)
            self.add(m[k], f"{where}[{k!r}]" if isinstance(k, (str, int)) else f"{where}[...]", depth)

    def _sequence(self, s: Iterable[Any], where: str, depth: int) -> None:
        items = list(s)
        self.put(_qualname(type(s)), len(items))
        plain = [_plain(x) for x in items]
        if all(b is not None for b in plain):  # numbers, text: at once
            self.put(b"".join(len(b).to_bytes(8, "little") + b for b in plain if b is not None))
            return
        for i, x in enumerate(items):
            self.add(x, f"{where}[{i}]", depth)

    def _set(self, s: Iterable[Any], where: str, depth: int) -> None:
        items = sorted(self._sub(x, f"{where} item", depth) for x in s)
        self.put(_qualname(type(s)), len(items), *items)

    def _partial(self, p: functools.partial[Any], where: str, depth: int) -> None:
        self.put("partial", _qualname(type(p)))
        self.add(p.func, f"{where}.func", depth)
        self.add(p.args, f"{where}.args", depth)
        self.add(p.keywords, f"{where}.keywords", depth)
        self._state(p, where, depth)

    def _method(self, m: types.MethodType, where: str, depth: int) -> None:
        self.put("method")
        self.add(m.__func__, where, depth)
        self.add(m.__self__, f"{where}.__self__", depth)

    def _descriptor(self, d: Any, where: str, depth: int) -> None:
        self.put(type(d).__name__)
        for part in ("__func__", "fget", "fset", "fdel"):
            if hasattr(d, part):
                self.add(getattr(d, part), f"{where}.{part}", depth)

    def _function(self, fn: types.FunctionType, where: str, depth: int) -> None:
        """Code (constants and nested code too), defaults, closure and attributes; the globals it reads for
        the user's own code (installed libraries are known by their code and name)."""
        compiled = vars(fn).get("_torchdynamo_orig_callable")
        if compiled is not None:  # torch.compile's wrapper (its state names addresses): it runs what it wraps
            self.put("compiled")
            self.add(compiled, where, depth)
            return
        self.put("function", _qualname(fn))
        own = not _library(fn.__module__ or "")
        self._code(fn.__code__, fn.__globals__ if own else None, where, depth)
        self.add(fn.__defaults__, f"{where} defaults", depth)
        self.add(fn.__kwdefaults__, f"{where} defaults", depth)
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                value = "<empty cell>"
            self.add(value, f"{where} (closure {name})", depth)
        self.add(dict(vars(fn)), f"{where}.__dict__", depth)

    def _code(self, code: types.CodeType, globals_: dict[str, Any] | None, where: str, depth: int) -> None:
        self.put(code.co_code, repr(code.co_names), code.co_flags, code.co_argcount, code.co_kwonlyargcount)
        names: set[str] = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                self._code(c, None, where, depth)
                names |= _names(c)
            else:
                self.add(c, where, depth)
        if globals_ is None:
            return
        for n in sorted(names):
            if n in globals_:
                self.put(n)
                self.add(globals_[n], f"{where} (global {n})", depth)

    def class_body(self, cls: type, where: str, depth: int = 0) -> None:
        """A class's bases, methods (their code) and class attributes."""
        self.put("class", _qualname(cls))
        for base in cls.__bases__:
            self.add(base, f"{_qualname(cls)} base", depth)
        for k, v in sorted(vars(cls).items()):
            if k not in _CLASS_SKIPPED:
                self.put(k)
                self.add(v, f"{_qualname(cls)}.{k}", depth)

    def _class(self, cls: type, where: str, depth: int) -> None:
        if _library(cls.__module__):
            self.put("class", _qualname(cls))
        else:
            self.class_body(cls, where, depth)

    def module_state(self, m: nn.Module, where: str, depth: int = 0, *, tensors: bool = True) -> None:
        """A module's class, attributes and forward hooks; with ``tensors`` also its own parameters and
        buffers and its children (a module outside the model, met as a value)."""
        self.put("module", _qualname(type(m)))
        wrapper = type(m).__name__ == "OptimizedModule"  # torch.compile's: it runs _orig_mod, hashed as a child
        for k, v in sorted(vars(m).items()) if not wrapper else ():
            if k not in _MODULE_INTERNALS:
                self.put(k)
                self.add(v, f"{where}.{k}", depth + 1)
        for hooks, kwargs in _HOOKS:
            table = getattr(m, hooks, {})
            self.put(hooks, len(table))
            for key, hook in table.items():
                self.put(key in getattr(m, kwargs, {}))
                self.add(hook, f"{where} ({hooks[1:]})", depth + 1)
        if tensors:
            self._class(type(m), where, depth + 1)
            for name, t in [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]:
                self.put(name)
                self.add(t, f"{where}.{name}", depth + 1)
            for name, child in m.named_children():
                self.put(name)
                self.add(child, f"{where}.{name}", depth + 1)

    def _module(self, m: nn.Module, where: str, depth: int) -> None:
        name = self._modules.get(id(m))
        if name is not None:
            self.put("model module", name)
        else:
            self.module_state(m, where, depth)

    def _callable(self, fn: Any, where: str, depth: int) -> None:
        """A C function or callable object: by what pickle rebuilds it from, or the name it is found under."""
        self.put("callable", _qualname(type(fn)))
        r = _reduced(fn)
        module = getattr(fn, "__module__", None) or getattr(getattr(fn, "__self__", None), "__name__", None)
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
        if isinstance(r, str) and isinstance(module, str) and _found(module, r, fn):
            self.put(module, r)
        elif isinstance(r, tuple) and len(r) >= 2 and r[0] is not _COPYREG_RECONSTRUCTOR:
            self.add(r[:3], where, depth)
        elif isinstance(module, str) and isinstance(name, str) and _found(module, name, fn):
            self.put(module, name)
        else:
            self._opaque(where, f"{callable_name(fn)} is a compiled callable found under no name, so a change to it "
                                "cannot be seen")
        if hasattr(fn, "__wrapped__"):  # a C wrapper (lru_cache) around the user's function
            self.add(fn.__wrapped__, f"{where}.__wrapped__", depth)

    def _state(self, v: Any, where: str, depth: int) -> None:
        """An instance's ``__dict__`` and ``__slots__`` values."""
        state = {k: x for k, x in (getattr(v, "__dict__", None) or {}).items() if k not in _VOLATILE}
        for cls in type(v).__mro__:
            slots = vars(cls).get("__slots__", ())
            for s in (slots,) if isinstance(slots, str) else slots:
                if s not in ("__dict__", "__weakref__") and hasattr(v, s):
                    state[f"slot {s}"] = getattr(v, s)
        if state:
            self.add(state, where, depth)

    def _other(self, v: Any, where: str, depth: int) -> None:
        """An instance of a Python class (its class and state), a C callable, or another C object (what
        pickle rebuilds it from, else its type alone: nothing else of it can be seen)."""
        cls = type(v)
        if cls.__flags__ & _HEAPTYPE:
            self.add(cls, f"{where} class", depth)
            self._state(v, where, depth)
        elif callable(v):
            self._callable(v, where, depth)
        else:
            r = _reduced(v)
            self.put("object", _qualname(cls))
            if isinstance(r, tuple) and len(r) >= 2 and r[0] is not _COPYREG_RECONSTRUCTOR:
                self.add(r[1:3], where, depth)


def _generator(self: Digest, g: torch.Generator, where: str, depth: int) -> None:
    self.put("generator", g.device, g.initial_seed())


def _names(code: types.CodeType) -> set[str]:
    found = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            found |= _names(c)
    return found


_COPYREG_RECONSTRUCTOR = getattr(copyreg, "_reconstructor", None)  # the reduction of any object: says nothing

_TABLE: list[tuple[Any, Callable[[Digest, Any, str, int], None]]] = [
    (torch.Tensor, Digest._tensor),
    (np.ndarray, Digest._array),
    (np.generic, Digest._numpy_scalar),
    (torch.Generator, _generator),
    (nn.Module, Digest._module),
    (type, Digest._class),
    (functools.partial, Digest._partial),
    (types.MethodType, Digest._method),
    (types.FunctionType, Digest._function),
    ((staticmethod, classmethod, property), Digest._descriptor),
    (Mapping, Digest._mapping),
    ((list, tuple, collections.deque), Digest._sequence),
    ((set, frozenset), Digest._set),
    (_C_CALLABLES + (np.ufunc,), Digest._callable),
]


def code_hash(fn: Any) -> tuple[str, list[str]]:
    """A sha256 of what a callable is (its code, constants, globals read, defaults, closure; a partial's
    function and arguments; a callable object's class and state; a C function's name and bound object),
    and what of it cannot be seen.

    Example:
        >>> code_hash(lambda t: t * 1)[0] == code_hash(lambda t: t * 2)[0]
        False
        >>> code_hash(functools.partial(torch.mean, dim=1))[0] == code_hash(functools.partial(torch.amax, dim=1))[0]
        False
        >>> code_hash(np.frompyfunc(abs, 1, 1))[1]
        ['reduce: abs (vectorized) is a compiled callable found under no name, so a change to it cannot be seen']
    """
    d = Digest()
    d.add(fn, "reduce")
    return d.hexdigest(), d.opaque


def model_digest(model: nn.Module) -> tuple[dict[str, str], list[str]]:
    """What a resumed run must find unchanged in the model beyond its state_dict: its structure (repr, every
    module's attributes and forward hooks, global forward hooks, the code and class attributes of its classes)
    and every buffer, non-persistent too; and what of it cannot be seen.

    Example:
        >>> hashes, opaque = model_digest(torch.nn.Linear(2, 2))
        >>> sorted(hashes), opaque
        (['buffers_sha256', 'structure_sha256'], [])
    """
    names: dict[int, str] = {}
    for n, m in model.named_modules(remove_duplicate=False):
        names.setdefault(id(m), n or "model")
    shape = Digest(names)
    shape.put(repr(model))
    for name, m in model.named_modules():
        shape.put(name)
        shape.module_state(m, f"model.{name}" if name else "model", tensors=False)
    every = sys.modules["torch.nn.modules.module"]  # hooks registered for every module run on this model too
    for hooks in ("_global_forward_pre_hooks", "_global_forward_hooks"):
        table = getattr(every, hooks, {})
        shape.put(hooks, len(table))
        for hook in table.values():
            shape.add(hook, f"torch.nn.modules.module.{hooks}")
    # in the order first met: classes made at run time (torch's parametrizations) share a name
    classes = dict.fromkeys(c for m in model.modules() for c in type(m).__mro__ if c.__module__ != "builtins")
    for cls in classes:
        shape.class_body(cls, _qualname(cls))
    bufs = Digest()
    for name, b in model.named_buffers():
        bufs.put(name)
        bufs.add(b, name)
    return {"structure_sha256": shape.hexdigest(), "buffers_sha256": bufs.hexdigest()}, shape.opaque + bufs.opaque
