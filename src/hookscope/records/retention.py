"""How a recorded tensor is kept: the retention policy (copy, detach, to, dtype) and the checks
it makes before anything runs.

Must not import: anything of hookscope but ``errors`` and ``core``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import InitVar, dataclass
from typing import Any, Literal

import torch

from ..core.guard import Slot, guardable, protect, storage_key
from ..errors import RecordError, checked_init

__all__ = ["COPY_BELOW", "CopyPolicy", "Retention", "check_device", "renamed_device"]

CopyPolicy = Literal["auto", "always", "never"]
COPY_BELOW = 1 << 20
"""Under ``copy="auto"``, tensors smaller than this many bytes are copied at once: on this machine a
copy of under 1 MiB costs less than watching the tensor for writes (~20-40 us of dispatch for each
op that reads it), and on a GPU a copy is one asynchronous kernel. Larger tensors are watched."""


@checked_init
@dataclass(frozen=True)
class Retention:
    """How a recorded tensor is kept.

    Args:
        copy: ``"auto"`` (default) keeps a reference and copies only if something is about to
            write into that memory (``ReLU(inplace=True)``, ``out += identity``); tensors under
            :data:`COPY_BELOW` bytes (1 MiB) are copied at once, which is cheaper; ``"always"``
            copies at once; ``"never"`` never copies, and reading a record whose memory was
            overwritten raises :class:`~hookscope.MutationError`.
        detach: drop the autograd graph (default). ``False`` keeps it, so the record can be
            differentiated, at the price of keeping the graph alive.
        to: where kept tensors are moved (``"cpu"`` frees accelerator memory). ``None`` keeps them
            where they are, with no host synchronisation.
        dtype: cast kept floating-point tensors (``torch.float16`` halves the memory).
        device: the former name of ``to=``: still taken, with a ``FutureWarning``.

    Example:
        >>> Retention(copy="always", to="cpu").to
        device(type='cpu')
    """

    copy: CopyPolicy = "auto"
    detach: bool = True
    to: torch.device | str | None = None
    dtype: torch.dtype | None = None

    guard: bool = True  # hand the model guarded aliases; False where they cannot go (compiled graphs)
    device: InitVar[torch.device | str | None] = None

    def __post_init__(self, device: torch.device | str | None) -> None:
        if device is not None:
            object.__setattr__(self, "to", renamed_device("Retention", device, self.to, stacklevel=5))
        if self.copy not in ("auto", "always", "never"):
            raise RecordError(f"copy={self.copy!r} is not a copy policy; use 'auto', 'always' or 'never'")
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            raise RecordError(
                f"dtype={self.dtype!r} is not a torch.dtype; pass one such as torch.float16"
            )
        if self.to is not None:
            object.__setattr__(self, "to", check_device(self.to, "to"))
        if not isinstance(self.detach, bool):
            raise RecordError(f"detach={self.detach!r} is not True or False")

    def keep(self, t: torch.Tensor, where: Any, held: Callable[[], set[int]] | None = None, *,
             inner: bool = False) -> tuple[Slot, torch.Tensor]:
        """Keep ``t``; return its slot and the tensor the model should go on with.

        ``held``: the memory (:func:`~hookscope.core.guard.storage_key`) that code outside the
        guard holds plain references to (the module's inputs, parameters and buffers); a tensor
        on it is copied at once under ``"auto"``, since a write through those references is unseen.
        Inference tensors (``torch.inference_mode()``) have no version counter, so a write through
        a reference the guard never sees (the caller's, or the module's own ``self.state``) would
        leave no trace: they are copied at once under ``"auto"`` and refused on reading under
        ``"never"``.
        ``inner``: ``t`` sits in a list, dict or object the model goes on with as it is, so no
        guarded alias can stand in for it: copied at once under ``"auto"``, watched by its version
        counter under ``"never"``; ``t`` itself is handed back.
        """
        _check_plain_tensor(t, where)
        v = t.detach() if self.detach else t
        if v.is_inference() and self.copy != "always":
            return self._unwatchable(v, t, where)
        if inner:
            slot, _ = self._inner(v, where)
            return slot, t
        if self.copy == "auto" and self.guard and self.to is None and self.dtype is None \
                and guardable(v):
            if v.numel() * v.element_size() < COPY_BELOW or (held is not None and storage_key(v) in held()):
                return Slot(v.clone(), "copied", where), t
            slot = Slot(v, "auto", where)  # no copy: a guarded alias copies it only before a write
            return slot, protect(t, slot)
        if self.to is not None or self.dtype is not None:
            dtype = self.dtype if self.dtype is not None and v.is_floating_point() else None
            moved = v.to(device=self.to, dtype=dtype)
            if moved is not v:  # a copy was made: nothing can overwrite it
                return Slot(moved, "copied", where), t
        if self.copy == "always" or not guardable(v):
            return Slot(v.clone() if v.numel() else v, "copied", where), t
        # "never" is guarded too: writes through .data or numpy bypass the version counter
        slot = Slot(v, self.copy, where)
        return slot, (protect(t, slot) if self.guard else t)


    def _inner(self, v: torch.Tensor, where: Any) -> tuple[Slot, None]:
        """A record of a tensor no alias can stand in for (see :meth:`keep`'s ``inner``)."""
        if self.to is not None or self.dtype is not None:
            dtype = self.dtype if self.dtype is not None and v.is_floating_point() else None
            moved = v.to(device=self.to, dtype=dtype)
            if moved is not v:
                return Slot(moved, "copied", where), None
        if self.copy == "never":
            return Slot(v, "never", where), None
        return Slot(v.clone() if v.numel() else v, "copied", where), None

    def _unwatchable(self, v: torch.Tensor, t: torch.Tensor, where: Any) -> tuple[Slot, torch.Tensor]:
        """An inference tensor the caller can write unseen: a copy under ``"auto"``, a record that
        refuses to be read under ``"never"``."""
        if self.copy == "auto":
            dtype = self.dtype if self.dtype is not None and v.is_floating_point() else None
            moved = v.to(device=self.to, dtype=dtype)
            return Slot(moved.clone() if moved is v else moved, "copied", where), t
        slot = Slot(v, "never", where)  # the guard still names a write made through its alias
        slot.blind = ("it is an inference tensor (torch.inference_mode()), which has no version counter, so "
                      "a write into it through a reference hookscope never handed out would leave no trace")
        return slot, (protect(t, slot) if self.guard and guardable(v) else t)

    def guards_any(self) -> bool:
        """Whether :meth:`keep` may hand the model guarded aliases at all."""
        return self.guard and self.copy != "always"

    def guards(self, t: torch.Tensor, held: Callable[[], set[int]] | None = None) -> bool:
        """Whether :meth:`keep` hands the model a guarded alias of ``t`` (rather than ``t`` itself).

        A run compared with a recorded one must see the same kind of tensors: a guarded alias (and
        every view of it) makes PyTorch skip its fast paths (native attention, nested tensors).
        """
        if t.is_inference() and self.copy == "auto":
            return False  # copied at once: no version counter to witness writes
        if self.copy == "auto" and self.guard and self.to is None and self.dtype is None \
                and guardable(t):
            return t.numel() * t.element_size() >= COPY_BELOW and (held is None or storage_key(t) not in held())
        if self.to is not None or self.dtype is not None:
            dtype = self.dtype if self.dtype is not None and t.is_floating_point() else None
            target = torch.device(self.to) if self.to is not None else t.device
            index = target.index
            if index is None and target.type == "cuda" and t.device.type == "cuda":
                index = torch.cuda.current_device()  # where .to("cuda") goes
            if target.type != t.device.type or index not in (None, t.device.index) or (
                    dtype is not None and dtype != t.dtype):
                return False  # keep() copies it and hands on the tensor itself
        return self.guard and self.copy != "always" and guardable(t)

    def keep_grad(self, g: torch.Tensor, where: Any, adopted: bool = False) -> Slot:
        """Keep a gradient as it arrived (never aliased back into autograd; overwritten memory raises).

        ``g`` itself is kept, not a ``detach()`` alias: autograd steals a leaf's incoming gradient
        as its ``.grad`` only when nothing else holds it, and would otherwise let a second
        backward, ``clip_grad_norm_`` or ``zero_grad(set_to_none=False)`` rewrite the record.
        ``adopted``: a view of ``g`` may become a leaf's ``.grad`` (the gradient of an alias of a
        leaf), so under ``copy="auto"`` it is copied.
        """
        _check_plain_tensor(g, where)
        v = g if not g.requires_grad else g.detach()
        if self.to is not None or self.dtype is not None:
            dtype = self.dtype if self.dtype is not None and v.is_floating_point() else None
            moved = v.to(device=self.to, dtype=dtype)
            if moved is not v:
                return Slot(moved, "copied", where)
        if self.copy == "always" or (adopted and self.copy == "auto"):
            return Slot(v.clone(), "copied", where)
        return Slot(v, "never", where, fix="copy='always'")  # "auto" keeps gradients unguarded too


def _check_plain_tensor(t: torch.Tensor, where: Any) -> None:
    """Refuse a tensor of a ``torch.func`` transform: it is a per-sample wrapper (``vmap``) or a
    level of ``grad``, whose values are not there to keep once the transform returns."""
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        what = "the {} of {!r}".format(*where[:2]) if isinstance(where, tuple) else str(where)
        raise RecordError(f"{what} is a tensor inside a torch.func transform (vmap, grad, jacrev, ...), which "
                          "hookscope cannot keep; run the model outside the transform while recording")


def renamed_device(where: str, device: Any, to: Any, stacklevel: int = 4) -> Any:
    """``device=``, the former name of where records are kept, taken as ``to=`` with a one-line
    ``FutureWarning``; both at once is refused."""
    if to is not None:
        raise RecordError(f"{where}() got device={device!r} and to={to!r}: records are kept where to= says; "
                          "drop device=")
    warnings.warn(f"{where}(device=) is now {where}(to=) (where records are kept; device= names where the "
                  f"model runs): pass to={str(device)!r}", FutureWarning, stacklevel=stacklevel)
    return device


def check_device(device: Any, word: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` that exists here, or a one-line error before anything runs.

    Example:
        >>> check_device("cpu")
        device(type='cpu')
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise RecordError(
            f"{word}={device!r} is not a device; use 'cpu', 'cuda', 'cuda:0', 'mps' or a torch.device"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RecordError(f"{word}={device!r}, but CUDA is not available here; use {word}='cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise RecordError(f"{word}={device!r}, but there are only {torch.cuda.device_count()} CUDA devices")
    return dev
