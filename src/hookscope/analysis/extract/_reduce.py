"""What extract stores of a layer's tensor: the whole tensor, a mean or max over some dimensions,
positions (``hookscope.at[:, -1]``), or the result of a user's function, computed on the tensor's device
before anything is copied to the host."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Union

import torch

from ...core.text import first_line
from ...errors import HookscopeError
from ...selection import At, as_at
from ._hash import callable_name, code_hash

__all__ = ["Reduction", "Reducer", "reducer", "reducers_for"]

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
    unchecked: str = ""  # what of the function a hash cannot see (a resume cannot check it is unchanged)

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
        code, opaque = code_hash(spec)
        return Reducer(f"fn:{callable_name(spec)}", spec, code, opaque[0] if opaque else "")
    raise HookscopeError(f"reduce={spec!r} ({type(spec).__name__}) is not a reduction; use one of {', '.join(_FORMS)}")


def reducers_for(names: list[str], chosen: Mapping[str, Reduction], default: Reduction) -> dict[str, Reducer]:
    """The reducer of each selected layer: its own (``chosen``) or ``default``.

    Example:
        >>> {k: r.text for k, r in reducers_for(["a", "b"], {"a": "mean"}, None).items()}
        {'a': 'mean', 'b': 'none'}
    """
    return {n: reducer(chosen[n]) if n in chosen else reducer(default) for n in names}

