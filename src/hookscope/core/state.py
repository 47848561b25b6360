"""Run a user's model and put back everything the run may change: modes, buffers, random state.

Every analysis that runs the model (summary, diff, cam, metrics, ...) goes through :func:`restored`,
so the model a user hands in is the model they get back: every submodule's train/eval flag, the
buffers a training-mode pass updates (BatchNorm's running statistics, also when the forward rebinds
them), and the random generators dropout draws from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.nn.parameter import is_lazy

__all__ = ["restored", "rng_devices", "kept_rng", "RngDevices", "own_arithmetic"]

RngDevices = tuple[list[int], str | None]


def rng_devices(used: Iterable[torch.Tensor]) -> RngDevices:
    """The accelerator generators a pass over ``used`` tensors may draw from: (indices, device type).

    The devices of one accelerator type the tensors live on; for CUDA, every device once CUDA is
    initialised (reading a generator's state is cheap then, and it must not initialise CUDA itself).

    Example:
        >>> rng_devices([torch.zeros(1)])[0]
        []
    """
    accel = [t.device for t in used if t.device.type not in ("cpu", "meta") and t.device.index is not None]
    kind = accel[0].type if accel else None
    indices = {d.index for d in accel if d.type == kind and d.index is not None}
    if kind in (None, "cuda") and torch.cuda.is_initialized():
        kind = "cuda"
        indices |= set(range(torch.cuda.device_count()))
    return sorted(indices), kind


@contextlib.contextmanager
def kept_rng(devices: RngDevices, *, seed: int | None = None) -> Iterator[None]:
    """The CPU generator and those of ``devices`` restored on exit, started from ``seed`` if given.

    Example:
        >>> before = torch.random.get_rng_state()
        >>> with kept_rng(([], None), seed=0):
        ...     _ = torch.rand(3)
        >>> torch.equal(before, torch.random.get_rng_state())
        True
    """
    indices, kind = devices
    with torch.random.fork_rng(devices=indices, device_type=kind or "cpu"):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def _version(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else t._version  # inference tensors have no version counter


_Saved = tuple[nn.Module, str, torch.Tensor, torch.Tensor, "int | None"]


def _snapshot(model: nn.Module) -> list[_Saved]:
    return [(m, k, b, b.detach().clone(), _version(b)) for m in model.modules()
            for k, b in m._buffers.items() if b is not None and not is_lazy(b)]


def _put_back(saved: list[_Saved]) -> None:
    with torch.no_grad():
        for m, k, original, value, version in saved:
            m._buffers[k] = original  # also undoes a forward that rebinds the buffer
            # only what changed: BatchNorm's kernel updates running statistics without a version bump
            if original.shape == value.shape and (
                    version is None or _version(original) != version or not torch.equal(original, value)):
                original.copy_(value)


@contextlib.contextmanager
def restored(
    model: nn.Module,
    *,
    train: bool | None = None,
    buffers: bool | None = None,
    rng: RngDevices | None = None,
    seed: int | None = None,
    keep_rng: bool = True,
) -> Iterator[None]:
    """Inside: ``model`` in the mode asked; after: every flag, buffer and generator as before.

    Args:
        model: the (unwrapped) model.
        train: ``True`` / ``False`` switches every submodule to training / eval mode for the block;
            ``None`` leaves the modes as they are (and still restores them).
        buffers: snapshot the buffers and put back the ones that changed. ``None`` (default): only
            when some module runs in training mode (where BatchNorm updates its statistics).
        rng: the generators to keep (:func:`rng_devices`); ``None``: the CPU generator only.
        seed: start the block's random stream from this seed (the caller's stream is kept).
        keep_rng: ``False`` lets the block's draws advance the caller's stream (as a plain call
            of the model would); ``seed`` is then not allowed.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.BatchNorm1d(2)).eval()
        >>> with restored(net, train=True):
        ...     _ = net(torch.randn(4, 2))
        >>> net.training, float(net[0].running_mean.abs().sum())
        (False, 0.0)
    """
    flags = [(m, m.training) for m in model.modules()]
    if train is not None:
        model.train(train)
    saving = buffers if buffers is not None else any(m.training for m in model.modules())
    saved = _snapshot(model) if saving else []
    if seed is not None and not keep_rng:
        raise ValueError("restored(seed=...) needs keep_rng=True: a seeded block keeps the caller's stream")
    try:
        with kept_rng(rng or ([], None), seed=seed) if keep_rng else contextlib.nullcontext():
            yield
    finally:
        for m, flag in flags:
            m.training = flag
        _put_back(saved)


@contextlib.contextmanager
def own_arithmetic(device_type: str = "cpu") -> Iterator[None]:
    """hookscope's own arithmetic inside a user's run: no autograd and no autocast.

    Example:
        >>> with torch.autocast("cpu", dtype=torch.bfloat16), own_arithmetic():
        ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
        torch.float32
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        for kind in dict.fromkeys(("cpu", device_type)):
            stack.enter_context(torch.autocast(kind, enabled=False))
        yield
