"""Tiny deterministic models and a check that no hook is ever left behind, shared by the tests.

Import them as ``from helpers import Net, no_hooks`` (pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hookscope.core import hook_count

__all__ = ["cached_torchvision_weights", "exited_pid", "no_hooks", "Net", "ConvReLU", "Pair", "FakeModelOutput", "Structured",
           "Writer", "AddBack"]


def exited_pid() -> int:
    """The pid of a process that has exited and been waited for (what a killed run leaves in its files)."""
    import os

    pid = os.fork()
    if pid == 0:  # the child does nothing at all: exits at once
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def no_hooks(model: nn.Module) -> bool:
    """True when no forward/backward hook of any kind is left on any submodule."""
    return hook_count(model) == 0


class Net(nn.Module):
    """Story 3: Linear(2, 5) then Linear(5, 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(2, 5)
        self.l2 = nn.Linear(5, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.l1(x))


class ConvReLU(nn.Module):
    """A conv followed by an in-place ReLU, as an nn.Module or functionally."""

    def __init__(self, functional: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU(inplace=True)
        self.functional = functional

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.nn.functional.relu(y, inplace=True) if self.functional else self.act(y)


class Writer(nn.Module):
    """A classifier that writes into its inputs as it runs: ``x.div_(2)`` first, and ``scale.mul_(2)``
    on an optional keyword tensor. Run on the same tensor again it computes something else, so any
    analysis that hands it the caller's tensor shows it (in its values, or in the caller's tensor)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        x.div_(2)
        if scale is not None:
            x = x * scale.mul_(2)
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


class AddBack(nn.Module):
    """stem -> bn0 -> F.relu(inplace) = idn; out = bn(conv(idn)); out += idn (in place, after the bn): one channel
    group (the add), no activation module, both batch norm outputs rewritten in place. ``inplace=False``: the same
    values computed out of place."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inplace = inplace
        self.stem, self.bn0 = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)
        with torch.no_grad():
            for bn in (self.bn0, self.bn):
                bn.running_mean.uniform_(-0.3, 0.3)
                bn.running_var.uniform_(0.5, 2.0)
                bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idn = F.relu(self.bn0(self.stem(x)), inplace=self.inplace)
        out = self.bn(self.conv(idn))
        if self.inplace:
            out += idn
        else:
            out = out + idn
        return self.head(out.mean((2, 3)))


@dataclasses.dataclass
class Pair:
    main: torch.Tensor
    aux: Any = None


class FakeModelOutput(OrderedDict):
    """Mimics transformers' ModelOutput: an OrderedDict that is also a dataclass."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        for k, v in kw.items():
            object.__setattr__(self, k, v)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        object.__setattr__(self, key, value)


class Structured(nn.Module):
    """Returns dicts, dataclasses, named tuples, ModelOutput-likes and None, as real models do."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Any:
        y = self.lin(x)
        if self.kind == "dict":
            return {"y": y, "twice": [y * 2, None]}
        if self.kind == "dataclass":
            return Pair(main=y, aux=(y + 1,))
        if self.kind == "modeloutput":
            return FakeModelOutput(logits=y, hidden=y * 3)
        if self.kind == "namedtuple":
            return torch.max(y, dim=1)
        return y


def cached_torchvision_weights(tmp_path: Any, monkeypatch: Any, name: str) -> tuple[nn.Module, Any, Any]:
    """TORCH_HOME under ``tmp_path`` with ``name``'s DEFAULT weights in torch.hub's cache: a randomly
    initialised model's (seed 3), made here, so that loading by weight name needs no network.

    Returns (that model, the weights enum member, the cached file's path).
    """
    import os

    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    weights = torchvision.models.get_model_weights(name).DEFAULT
    folder = tmp_path / "torch_home" / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    torch.manual_seed(3)
    fake = torchvision.models.get_model(name, weights=None).eval()
    torch.save(fake.state_dict(), folder / os.path.basename(weights.url))
    return fake, weights, folder / os.path.basename(weights.url)


def one_thread_only() -> Any:
    """Generator for a module-scoped autouse fixture: tensors this small go faster on one thread; on a
    busy machine, threads fighting cost 30x (measured)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for the block, then restored: for the float32 sums whose
    rounding (and so a measured tolerance) depends on how many threads split them, whatever share of
    the cores this test process has."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the reference's largest magnitude (0 for empty tensors)."""
    return float((a - b).detach().abs().max() / b.detach().abs().max()) if b.numel() else 0.0


def rel_first(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the FIRST tensor's largest magnitude (the pruning tests' habit)."""
    return float(((a - b).abs().max() / a.abs().max()).detach())


def param_count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def only_masks(m: nn.Module) -> bool:
    """No hook left but the masks' pre-hooks (one per masked tensor)."""
    pre = [h for mod in m.modules() for h in mod._forward_pre_hooks.values()]
    return hook_count(m) == len(pre) and all(type(h).__name__ == "MaskHook" for h in pre)


def state_copy(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}
