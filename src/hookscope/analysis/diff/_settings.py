"""How one run of a comparison is made: training flag, autocast, any other context."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ContextManager, Union

import torch
from torch import nn

from ...core.compiled import is_compiled
from ...core.text import dtype_text
from ...errors import HookscopeError, checked, checked_init
from ...selection import unwrap

__all__ = ["Settings", "settings", "RunSetting", "as_settings", "describe_run"]


@checked_init
@dataclass(frozen=True)
class Settings:
    """How one run is made: training flag, autocast, any other context. Build it with :func:`settings`."""

    train: bool | None = None
    autocast: torch.dtype | None = None
    device_type: str | None = None
    context: Callable[[], ContextManager[Any]] | None = None

    def describe(self) -> str:
        """A short human description, e.g. ``"train, autocast bfloat16"``.

        Example:
            >>> Settings(train=False).describe()
            'eval'
        """
        parts = []
        if self.train is not None:
            parts.append("train" if self.train else "eval")
        if self.autocast is not None:
            parts.append(f"autocast {dtype_text(self.autocast)}")
        if self.context is not None:
            parts.append(getattr(self.context, "__name__", type(self.context).__name__))
        return ", ".join(parts)

    @contextlib.contextmanager
    def apply(self, model: nn.Module, device_type: str) -> Iterator[None]:
        """Enter these settings on ``model`` (its flags are restored by :func:`diff`, not here)."""
        with contextlib.ExitStack() as stack:
            if self.train is not None:
                model.train(self.train)
            if self.autocast is not None:
                stack.enter_context(torch.autocast(self.device_type or device_type, dtype=self.autocast))
            if self.context is not None:
                stack.enter_context(self.context())
            yield


@checked
def settings(
    *,
    train: bool | None = None,
    autocast: torch.dtype | None = None,
    device_type: str | None = None,
    context: Callable[[], ContextManager[Any]] | None = None,
) -> Settings:
    """Describe one run of :func:`~hookscope.diff`: the mode, an autocast dtype, and any other context.

    Args:
        train: ``True`` runs every module in training mode, ``False`` in eval mode, ``None`` (default)
            leaves the flags as they are. The flags are restored afterwards either way.
        autocast: run under ``torch.autocast`` with this dtype (``torch.bfloat16``, ``torch.float16``).
        device_type: autocast's device type; default: the device the run's inputs are on (after
            they were moved to the model's device, see :func:`~hookscope.diff`).
        context: a zero-argument callable returning a context manager to run inside, for anything
            else (``lambda: torch.backends.cudnn.flags(enabled=False)``, ``sdpa_kernel(...)``).

    Example:
        >>> settings(train=True, autocast=torch.bfloat16).describe()
        'train, autocast bfloat16'
    """
    if train is not None and not isinstance(train, bool):
        raise HookscopeError(f"train={train!r} is not True, False or None; pass train=True for training mode")
    if device_type is not None:
        try:
            device_type = torch.device(device_type).type
        except (RuntimeError, TypeError, ValueError):
            raise HookscopeError(
                f"device_type={device_type!r} is not a device type; pass 'cpu' or 'cuda', or leave it out"
            ) from None
    if autocast is not None and not (isinstance(autocast, torch.dtype) and autocast.is_floating_point):
        raise HookscopeError(
            f"autocast={autocast!r} is not a floating-point torch.dtype; use torch.bfloat16 or torch.float16"
        )
    if context is not None and not callable(context):
        raise HookscopeError(
            f"context={context!r} is not callable; pass a function that returns a context manager, "
            "e.g. context=lambda: torch.autocast('cpu')"
        )
    return Settings(train=train, autocast=autocast, device_type=device_type, context=context)


RunSetting = Union[Settings, Callable[[], ContextManager[Any]], None]


def as_settings(value: RunSetting, side: str) -> Settings:
    """``a=`` or ``b=`` of :func:`~hookscope.diff` as :class:`Settings` (a bare context factory too).

    Example:
        >>> as_settings(None, "b") == Settings()
        True
    """
    if value is None:
        return Settings()
    if isinstance(value, Settings):
        return value
    if callable(value):
        return Settings(context=value)
    raise HookscopeError(
        f"{side}={value!r} is not a run setting; pass {side}=hookscope.settings(train=..., autocast=...) "
        "or a function that returns a context manager"
    )


def describe_run(model: nn.Module, setting: Settings) -> str:
    """How a run is labelled in a :class:`~hookscope.Diff`: the model and its settings.

    Example:
        >>> describe_run(torch.nn.Linear(1, 1), Settings(train=True))
        'Linear, train'
    """
    inner = unwrap(model)[0]
    wrapped = " (compiled)" if is_compiled(model) else ""
    extra = setting.describe()
    return f"{type(inner).__name__}{wrapped}" + (f", {extra}" if extra else ", as given")
