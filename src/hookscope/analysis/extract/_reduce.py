"""What extract stores of a layer's tensor: the whole tensor, a mean or max over some dimensions,
positions (``hookscope.at[:, -1]``), or the result of a user's function, computed on the tensor's device
before anything is copied to the host."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

import torch

from ...core.text import first_line
from ...errors import HookscopeError
from ...selection import At, as_at

__all__ = ["Reduction", "Reducer", "code_bytes", "code_hash", "reducer", "reducers_for", "value_bytes"]

Reduction = Union[None, str, At, Callable[[torch.Tensor], torch.Tensor]]
"""``None`` (the whole tensor), ``"mean"`` / ``"max"`` (over every dimension after the channel one:
N x C x H x W -> N x C), ``"mean:DIMS"`` / ``"max:DIMS"`` (``"mean:1"``: over the tokens of N x T x D),
``hookscope.at[...]`` (positions), or a function of the batch-first tensor."""

_FORMS = ("None", "'mean'", "'max'", "'mean:1'", "'max:2,3'", "hookscope.at[:, -1]", "a function of the tensor")


@dataclass(frozen=True)
class Reducer:
    """One reduction, ready to apply to a batch-first tensor; ``text`` is how the manifest names it.

    Example:
        >>> r = reducer("mean")
        >>> r(torch.ones(2, 3, 4, 4)).shape, r.text
        (torch.Size([2, 3]), 'mean')
    """

    text: str
    fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    code: str = ""  # a user function's code, hashed: two lambdas share a name, not their code

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` reduced (``t`` itself for no reduction)."""
        if self.fn is None:
            return t
        if self.code:  # the user's function: its errors are theirs
            return self.fn(t)
        try:
            return self.fn(t)
        except (IndexError, RuntimeError) as e:
            raise HookscopeError(f"the reduction {self.text!r} does not fit a tensor of shape {tuple(t.shape)} "
                                 f"({first_line(e)}); pick dimensions or positions it has ('mean:1' for N x T x D)") from None


def _dims(text: str, spec: str) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        dims = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise HookscopeError(f"reduction {spec!r}: {text!r} is not a list of dimensions; write e.g. 'mean:1' or "
                             "'mean:2,3'") from None
    if any(d == 0 for d in dims):
        raise HookscopeError(f"reduction {spec!r} reduces dimension 0, the samples; reduce dimensions 1 and up")
    if len(set(dims)) != len(dims):
        raise HookscopeError(f"reduction {spec!r} names a dimension twice; name each once, e.g. 'mean:2,3'")
    return dims


def _pool(kind: str, dims: tuple[int, ...] | None) -> Callable[[torch.Tensor], torch.Tensor]:
    def pool(t: torch.Tensor) -> torch.Tensor:
        over = dims if dims is not None else tuple(range(2, t.dim()))
        if not over:
            return t
        if kind == "max":
            return t.amax(dim=over)
        return t.mean(dim=over) if t.is_floating_point() or t.is_complex() else t.double().mean(dim=over)

    return pool


def reducer(spec: Reduction) -> Reducer:
    """The :class:`Reducer` a ``reduce=`` value means, or a one-line error naming the accepted forms.

    Example:
        >>> reducer("max:1")(torch.arange(6.).reshape(1, 3, 2)).tolist()
        [[4.0, 5.0]]
        >>> import hookscope
        >>> reducer(hookscope.at[:, -1]).text
        'at[:, -1]'
    """
    if spec is None:
        return Reducer("none")
    if isinstance(spec, str):
        kind, _, rest = spec.partition(":")
        if kind in ("mean", "max"):
            dims = _dims(rest, spec)
            return Reducer(spec, _pool(kind, dims))
        raise HookscopeError(f"reduce={spec!r} is not a reduction; use one of {', '.join(_FORMS)}")
    if isinstance(spec, At):
        positions = as_at(spec)
        assert positions is not None
        parts = positions.index if isinstance(positions.index, tuple) else (positions.index,)
        if any(isinstance(q, slice) and q.step is not None and q.step < 1 for q in parts):
            raise HookscopeError(f"{positions!r} has a slice step below 1, which torch cannot take; use a positive "
                                 "step, e.g. at[:, ::2]")
        index = positions.index
        return Reducer(repr(positions), lambda t: t[index])  # type: ignore[index]
    if callable(spec):
        name = getattr(spec, "__qualname__", type(spec).__name__)
        return Reducer(f"fn:{getattr(spec, '__module__', '?')}.{name}", spec, code_hash(spec))
    raise HookscopeError(f"reduce={spec!r} ({type(spec).__name__}) is not a reduction; use one of {', '.join(_FORMS)}")


def value_bytes(value: Any) -> bytes:
    """A value a function or module reads, as bytes for a hash: a tensor's dtype, shape and bytes, a plain
    value's repr, and only the type of anything else (whose repr may hold an address).

    Example:
        >>> value_bytes(2.0), value_bytes(torch.zeros(1, dtype=torch.uint8))
        (b'2.0', b'torch.uint8(1,)\\x00')
    """
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return f"{t.dtype}{tuple(t.shape)}".encode() + t.view(-1).view(torch.uint8).numpy().tobytes()
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return repr(value).encode()
    if isinstance(value, (tuple, list)):
        return b"(" + b",".join(value_bytes(v) for v in value) + b")"
    if isinstance(value, (frozenset, set)):  # in a stable order: a set's own order changes with the hash seed
        return b"{" + b",".join(sorted(value_bytes(v) for v in value)) + b"}"
    return f"<{type(value).__module__}.{type(value).__qualname__}>".encode()


def code_bytes(code: Any, names: dict[str, Any], depth: int = 0) -> list[bytes]:
    """A code object's bytecode, constants (nested code too), names, and the values of the globals it reads."""
    parts = [code.co_code, repr(code.co_names).encode()]
    for c in code.co_consts:
        parts += code_bytes(c, names, depth + 1) if hasattr(c, "co_code") and depth < 8 else [value_bytes(c)]
    for n in code.co_names:
        if n in names and not callable(names[n]):
            parts.append(n.encode() + value_bytes(names[n]))
    return parts


def _code_parts(fn: Any, depth: int = 0) -> list[bytes]:
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its class's __call__ and its state
        call = getattr(type(fn), "__call__", None)
        state = sorted(vars(fn).items()) if hasattr(fn, "__dict__") else []
        return [b"".join(k.encode() + value_bytes(v) for k, v in state),
                *(_code_parts(call, depth + 1) if call is not None and depth < 3 else [])]
    parts = code_bytes(code, getattr(fn, "__globals__", {}))
    parts.append(value_bytes(getattr(fn, "__defaults__", None)))
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        parts += _code_parts(value, depth + 1) if callable(value) and depth < 3 else [value_bytes(value)]
    return parts


def code_hash(fn: Any) -> str:
    """A sha256 of a function's code, constants, defaults and closure (what a resume must find unchanged).

    Example:
        >>> code_hash(lambda t: t * 1) == code_hash(lambda t: t * 2)
        False
        >>> code_hash(lambda t: t.mean(1)) == code_hash(lambda t: t.amax(1))
        False
    """
    h = hashlib.sha256()
    for part in _code_parts(fn):
        h.update(part)
    return h.hexdigest()


def reducers_for(names: list[str], chosen: Mapping[str, Reduction], default: Reduction) -> dict[str, Reducer]:
    """The reducer of each selected layer: its own (``chosen``) or ``default``.

    Example:
        >>> {k: r.text for k, r in reducers_for(["a", "b"], {"a": "mean"}, None).items()}
        {'a': 'mean', 'b': 'none'}
    """
    return {n: reducer(chosen[n]) if n in chosen else reducer(default) for n in names}

