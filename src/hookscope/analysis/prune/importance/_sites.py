"""Where channel importance is measured: ``sites=`` resolved to modules and the channel dim of each output.

``sites`` maps selectors to the channel dim of the selected modules' outputs (``{"layer1.0.relu": 1,
"blocks.0.mlp.act": -1}``), or is a selector (or a list of them) and the dim follows from the module:

- channels first (dim 1): convolutions, batch / instance / group norms;
- channels last (dim -1): ``Linear``, ``LayerNorm``, ``RMSNorm``, ``Embedding``;
- any module whose output is ``B x C``: dim 1;
- any other module (a ReLU, a dropout, a pooling): the dim of the nearest typed module before it in
  its parent (``conv, bn, relu``: the ``bn``'s), checked on each call number of the first forward:
  the output must have there the number of channels of that module or of another typed module of
  the same parent with the same channel dim (a ResNet Bottleneck's one ReLU, called after ``bn1``,
  ``bn2`` and the residual add, carries 64, 64 and 256 channels). Without such a module, or when the
  check fails, the site is refused with one line naming ``sites=``: the dim is never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ....core.text import shape_text
from ....errors import HookscopeError
from ....selection import Layers, check_hookable, layers, named_modules

__all__ = ["Site", "resolve_sites", "output_dim", "weight_rows"]

_FIRST = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
          nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.InstanceNorm1d,
          nn.InstanceNorm2d, nn.InstanceNorm3d, nn.GroupNorm)
_LAST = (nn.Linear, nn.LayerNorm, nn.RMSNorm, nn.Embedding)


def _channels(m: nn.Module) -> int | None:
    """How many channels a typed module makes."""
    for attr in ("out_channels", "num_features", "num_channels", "out_features", "embedding_dim"):
        v = getattr(m, attr, None)
        if isinstance(v, int):
            return v
    shape = getattr(m, "normalized_shape", None)
    return int(shape[-1]) if isinstance(shape, (tuple, list)) and shape else None


def _typed_dim(m: nn.Module) -> int | None:
    return 1 if isinstance(m, _FIRST) else -1 if isinstance(m, _LAST) else None


@dataclass
class Site:
    """One module whose output channels are scored.

    Attributes:
        name: its qualified name.
        module: the module.
        dim: the channel dim of its output; ``None`` until the first call when it follows ``after``.
        after: ``(name, module)`` of the typed module the dim is read from, for an untyped site.
        peers: the channel counts of the typed modules of its parent with ``after``'s channel dim
            (those an untyped site's output may carry, on its different calls).

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 1), nn.ReLU())
        >>> [(s.name, s.dim, s.after[0] if s.after else None) for s in resolve_sites(net, ["0", "1"])]
        [('0', 1, None), ('1', None, '0')]
    """

    name: str
    module: nn.Module
    dim: int | None
    after: tuple[str, nn.Module] | None = None
    peers: frozenset[int] = frozenset()


def _before(by_name: dict[str, nn.Module], name: str) -> tuple[str, nn.Module] | None:
    """The nearest typed module registered before ``name`` in the same parent."""
    parent, _, leaf = name.rpartition(".")
    owner = by_name.get(parent)
    if owner is None:
        return None
    siblings = [(k, c) for k, c in owner._modules.items() if c is not None]
    keys = [k for k, _ in siblings]
    if leaf not in keys:
        return None
    for k, c in reversed(siblings[: keys.index(leaf)]):
        if _typed_dim(c) is not None:
            return (f"{parent}.{k}" if parent else k), c
    return None


def _peers(by_name: dict[str, nn.Module], name: str, dim: int | None) -> frozenset[int]:
    """The channel counts of the typed modules of ``name``'s parent with channel dim ``dim``."""
    owner = by_name.get(name.rpartition(".")[0])
    if owner is None or dim is None:
        return frozenset()
    found = (_channels(c) for c in owner.children() if _typed_dim(c) == dim)
    return frozenset(n for n in found if n is not None)


def _check_dim(dim: object, key: object) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim == 0:
        raise HookscopeError(f"sites={{{key!r}: {dim!r}}}: the channel dim must be a non-zero int (dim 0 is "
                             "the batch), e.g. 1 for B x C x h x w or -1 for B x tokens x C")
    return dim


def resolve_sites(model: nn.Module, sites: Mapping[str, int] | Layers) -> list[Site]:
    """Every site of ``sites=``, in the model's order, resolved before any hook is registered.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.GELU())
        >>> [(s.name, s.dim) for s in resolve_sites(net, {"1": -1})]
        [('1', -1)]
    """
    if isinstance(sites, Mapping):
        given = {k: _check_dim(d, k) for k, d in sites.items()}
        found: dict[int, Site] = {}
        for key, dim in given.items():
            for name, m in layers(model, key):
                if id(m) in found and found[id(m)].dim != dim:
                    raise HookscopeError(f"sites= gives {name!r} two channel dims ({found[id(m)].dim} and {dim}); "
                                         "give each module one")
                found.setdefault(id(m), Site(name, m, dim))
        chosen = list(found.values())
    else:
        chosen = [Site(n, m, _typed_dim(m)) for n, m in layers(model, sites)]
        by_name = dict(named_modules(model, remove_duplicate=False))
        for s in chosen:
            s.after = None if s.dim is not None else _before(by_name, s.name)
            s.peers = frozenset() if s.after is None else _peers(by_name, s.name, _typed_dim(s.after[1]))
    if not chosen:
        raise HookscopeError("sites= is empty; name the modules to score, e.g. sites={'layer1.0.relu': 1}")
    check_hookable([(s.name, s.module) for s in chosen])
    order = {n: i for i, (n, _) in enumerate(named_modules(model, remove_duplicate=False))}
    return sorted(chosen, key=lambda s: order.get(s.name, 0))


def _refuse(site: Site, t: torch.Tensor, why: str) -> HookscopeError:
    return HookscopeError(f"cannot tell the channel dim of {site.name!r} ({type(site.module).__name__}), whose "
                          f"output is {shape_text(tuple(t.shape))}: {why}; pass it as sites={{{site.name!r}: 1}} "
                          "(B x C x ...) or -1 (B x ... x C)")


def output_dim(site: Site, t: torch.Tensor) -> int:
    """The channel dim of ``site``'s output ``t`` (non-negative), or one line naming ``sites=``.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 1), nn.ReLU())
        >>> relu = resolve_sites(net, "1")[0]
        >>> output_dim(relu, torch.zeros(2, 4, 3, 3))
        1
    """
    if t.ndim < 2:
        raise _refuse(site, t, "it has no channel dim besides the batch")
    dim = site.dim
    if dim is None:
        if t.ndim == 2:
            return 1
        if site.after is None:
            raise _refuse(site, t, "no convolution, norm or linear layer runs before it in its parent")
        dim = _typed_dim(site.after[1])
        assert dim is not None
        want = _channels(site.after[1])
        if want is None or (t.shape[dim] != want and t.shape[dim] not in site.peers):
            raise _refuse(site, t, f"its dim {dim} does not hold the {want} channels of {site.after[0]!r} (nor "
                                   "those of another layer of its parent)")
    if not -t.ndim <= dim < t.ndim or dim % t.ndim == 0:
        raise _refuse(site, t, f"dim {dim} is {'the batch' if dim % t.ndim == 0 else 'out of range'}")
    return dim % t.ndim


def weight_rows(site: Site) -> torch.Tensor:
    """``C x values``: the weight of the module at ``site``, one row per output channel (float64, detached).

    A transposed convolution's output channels are its weight's dim 1 (groups=1 only).

    Example:
        >>> weight_rows(resolve_sites(nn.Sequential(nn.Conv2d(2, 3, 1)), "0")[0]).shape
        torch.Size([3, 2])
    """
    m = site.module
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or w.ndim < 1:
        raise HookscopeError(f"weight kinds (l1, l2) read the weight of the module at the site, and {site.name!r} "
                             f"({type(m).__name__}) has none; score the convolution or linear layer that makes "
                             "the channels, or use importance='activation'")
    w = w.detach()
    if isinstance(m, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
        if m.groups != 1:
            raise HookscopeError(f"{site.name!r} is a grouped transposed convolution (groups={m.groups}): its "
                                 "output channels are not weight rows; use importance='activation'")
        w = w.transpose(0, 1)
    return w.reshape(w.shape[0], -1).to(torch.float64)
