"""The model-randomisation sanity checks (Adebayo et al. 2018): re-initialise a model's layers from
the top, cascading or one at a time, and compare the explanation's maps with the trained model's.

An explanation that barely changes when the weights become random does not explain the model.
Everything happens on a deep copy of the model: the caller's model, its parameters, buffers and
random generators are never touched, also when ``explain`` fails half-way. Must not import any
analysis: the explanation is the caller's ``explain(model, inputs)``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ...core.state import kept_rng, rng_devices
from ...errors import HookscopeError, checked
from ...selection import Layers, layers as select, named_modules
from ._randomised import Randomisation
from ._robust import Explain, explained
from ._similarity import pictures, spearman, ssim, SSIM_WINDOW

__all__ = ["MODES", "parameter_randomisation"]

MODES = ("cascading", "independent")
Unit = tuple[str, list[nn.Module]]


def _resettable(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) and callable(getattr(module, "reset_parameters", None))


def _units(model: nn.Module, chosen: Layers | None) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """``[(layer, names of the modules it resets)]`` top first, and the modules left as trained."""
    named = named_modules(model)
    owners = [(n, m) for n, m in named if any(True for _ in m.parameters(recurse=False))]
    if chosen is None:
        units = [(n, [n]) for n, m in owners if _resettable(m)]
        skipped = [n for n, m in owners if not _resettable(m)]
    else:
        units, skipped = [], []
        for name, module in select(model, chosen):
            inside = [(n, m) for n, m in owners if n == name or n.startswith(f"{name}.") or not name]
            if not inside:
                raise HookscopeError(f"layer {name!r} ({type(module).__name__}) has no parameters to randomise; "
                                     "choose layers that hold weights, e.g. layers=nn.Conv2d")
            bare = [n for n, m in inside if not _resettable(m)]
            if bare:
                raise HookscopeError(f"{bare[0]!r} has parameters but no reset_parameters(), so there is no "
                                     "initialisation to randomise it with; leave it out of layers=")
            units.append((name, [n for n, _ in inside]))
    if not units:
        raise HookscopeError(f"{type(model).__name__} has no layer with parameters and reset_parameters() to "
                             "randomise; pass layers= naming the ones to re-initialise")
    order = {n: i for i, (n, _) in enumerate(named)}
    return sorted(units, key=lambda u: -order[u[0]]), skipped


def _reset(modules: list[nn.Module], seed: int, devices: Any) -> None:
    with kept_rng(devices, seed=seed), torch.no_grad():
        for m in modules:
            m.reset_parameters()  # type: ignore[operator]


def _state(modules: list[nn.Module]) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]


def _compare(original: torch.Tensor, maps: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    rho = torch.stack([spearman(original, m) for m in maps])
    rho_abs = torch.stack([spearman(original.abs(), m.abs()) for m in maps])
    base = pictures(original)
    if base is None or min(base.shape[1:]) < SSIM_WINDOW:
        return rho, rho_abs
    return rho, rho_abs, torch.stack([ssim(base, pictures(m)) for m in maps])  # type: ignore[arg-type]


def tied_notes(model: nn.Module, units: list[tuple[str, list[str]]]) -> list[str]:
    """One line per step whose reset also rewrites a parameter another module holds (tied weights)."""
    holders: dict[int, list[str]] = {}
    for n, m in named_modules(model):
        for pn, prm in m.named_parameters(recurse=False):
            holders.setdefault(id(prm), []).append(f"{n}.{pn}" if n else pn)
    notes = []
    for layer, names in units:
        mine = [f"{n}.{pn}" if n else pn for n in names for pn, _ in
                model.get_submodule(n).named_parameters(recurse=False)]
        for q in mine:
            prm = model.get_parameter(q)
            others = [o for o in holders[id(prm)] if (o.rsplit(".", 1)[0] if "." in o else "") not in names]
            if others:
                notes.append(f"randomising {layer!r} also rewrites {others[0]!r}, the same parameter as {q!r} "
                             "(tied weights), so that step does not randomise its layer alone")
                break
    return notes


def _notes(original: torch.Tensor, maps: list[torch.Tensor], layers: list[str], rho: torch.Tensor) -> tuple[str, ...]:
    notes = []
    if all(torch.equal(original, m) for m in maps):
        notes.append("the maps did not change at all: the explanation does not depend on these weights, or explain "
                     "ignores the model it is handed (use its first argument)")
    flat = [(name, int(row.isnan().sum())) for name, row in zip(layers, rho) if bool(row.isnan().any())]
    if flat:
        shown = ", ".join(f"{n} ({k})" for n, k in flat[:3]) + (", ..." if len(flat) > 3 else "")
        notes.append(f"constant maps (all one value, often all zero once the weights are random) have no rank "
                     f"order: NaN, left out of the means, after randomising {shown}")
    return tuple(notes)


@checked
def parameter_randomisation(
    model: nn.Module,
    inputs: torch.Tensor,
    explain: Explain,
    *,
    layers: Layers | None = None,
    mode: str = "cascading",
    seed: int = 0,
) -> Randomisation:
    """The model-randomisation sanity check (Adebayo et al. 2018): how alike an explanation's maps stay
    as the model's layers are re-initialised, from the top (the output) down.

    ``mode="cascading"`` randomises the top layer, then the next one too, and so on down to the
    input; ``mode="independent"`` randomises one layer at a time, the others trained. After each step
    ``explain`` runs again and its maps are compared with the trained model's, per sample: Spearman's
    rank correlation of the maps and of their absolute values, and the SSIM of the maps as
    pictures. A map that explains the model changes as its weights go (the correlation falls); one
    that stays near 1 shows the input, not the model.

    A layer is randomised by its own ``reset_parameters()`` (the initialisation the layer was built
    with; a batch norm's running statistics are reset too), drawn from ``seed``, the same layer
    getting the same random weights in both modes. A parameter shared by two layers (tied weights) is
    randomised with either: ``res.notes`` names each step that changes a layer it does not name. Everything runs on a deep copy of the model, in
    eval mode: the model handed in is never changed (it costs one copy of its memory).

    Args:
        model: the trained model.
        inputs: the samples to explain, handed to ``explain`` as they are (a copy each call).
        explain: ``explain(model, inputs) -> maps`` with one map per sample, e.g.
            ``lambda m, x: hookscope.attribute(m, x, target=labels).maps`` or
            ``lambda m, x: hookscope.cam(m, x, layers="layer3", target=labels).maps``. It must use the
            model it is handed (the randomised copy), not the one in its closure.
        layers: which layers to randomise, each with every module with parameters inside it (a
            block is one step); ``None``: every module that has parameters of its own and a
            ``reset_parameters()`` (the others are listed in ``res.skipped``).
        mode: ``"cascading"`` or ``"independent"``.
        seed: seeds the random weights (the caller's random stream is not used).

    Returns:
        :class:`Randomisation`.

    Example:
        >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> grad = lambda m, x: torch.func.vmap(torch.func.grad(lambda v: m(v).sum()))(x)
        >>> res = parameter_randomisation(net, torch.rand(16, 3), grad)
        >>> res.layers, res.spearman.shape
        (('2', '0'), torch.Size([2, 16]))
    """
    if mode not in MODES:
        raise HookscopeError(f"mode={mode!r} is not a randomisation; use 'cascading' or 'independent'")
    if not isinstance(inputs, torch.Tensor):
        raise HookscopeError(f"parameter_randomisation takes the inputs as one tensor, got {type(inputs).__name__}")
    if not callable(explain):
        raise HookscopeError("explain must be a function explain(model, inputs) -> maps, e.g. "
                             "lambda m, x: hookscope.attribute(m, x).maps")
    units, skipped = _units(model, layers)
    twin = copy.deepcopy(model).eval()
    inside = dict(named_modules(twin))
    devices = rng_devices(list(twin.parameters()) + list(twin.buffers()))
    original = explained(explain, twin, inputs.clone(), "parameter_randomisation")
    maps = []
    for step, (_, names) in enumerate(units):
        modules = [inside[n] for n in names]
        saved = _state(modules) if mode == "independent" else None
        _reset(modules, seed + step, devices)
        maps.append(explained(explain, twin, inputs.clone(), "parameter_randomisation").to(original.device))
        if saved is not None:
            for m, state in zip(modules, saved):
                m.load_state_dict(state)
        if maps[-1].shape != original.shape:
            raise HookscopeError(f"parameter_randomisation: explain returned maps of {tuple(maps[-1].shape)} after "
                                 f"randomising {units[step][0]!r}, {tuple(original.shape)} before; it must give one shape")
    found = _compare(original, maps)
    return Randomisation(mode=mode, layers=tuple(n for n, _ in units), spearman=found[0], spearman_abs=found[1],
                         ssim=found[2] if len(found) > 2 else None, original=original, maps=torch.stack(maps),
                         skipped=tuple(skipped),
                         notes=tuple(tied_notes(model, units)) + _notes(original, maps, [n for n, _ in units], found[0]))
