""":func:`hookscope.cam`: checks the call, runs the hooked pass, hands the activations to the method's entry
of :data:`~._methods.TABLE`, then upsamples, normalises and fuses the maps."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from ..._tree import tensors
from ...core.inputs import model_kwargs
from ...core.state import kept_rng, restored
from ...errors import HookscopeError, SettingError, did_you_mean, checked
from ...selection import exact_ops, Selector, check_hookable, unwrap
from ...selection import layers as select
from .._layout import prefix_tokens
from .._targets import (Target, batch_coupled, class_targets, is_function, read_logits, user_scores)
from ._choose import hooked_pass
from ._hooked import activations, reaches
from ._methods import TABLE, Job
from ._result import CamMaps
from ._fullgrad import biased_layers
from ._settings import check_settings
from ._shape import as_4d, normalise, shapers, upsample, work

__all__ = ["METHODS", "cam"]

METHODS = tuple(TABLE)  # every method's name, as cam(method=) takes it


@checked
def cam(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    layers: Selector | Sequence[Selector] | None = None,
    method: str = "gradcam",
    target: Target = None,
    output: Callable[[Any], torch.Tensor] | None = None,
    reshape: Callable[[torch.Tensor], torch.Tensor] | None = None,
    fuse: str = "mean",
    batch_size: int | None = None,
    progress: bool | None = None,
    ratio: float | None = None,
    kernel: str | None = None,
    gamma: float | None = None,
    degree: int | None = None,
    coef0: float | None = None,
    comparison: Sequence[int] | None = None,
    alpha: float | None = None,
    sigmas: float | None = None,
    seed: int | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> CamMaps:
    """Class activation maps of a batch, one per image, in one forward pass (Score-CAM: plus its masked inputs).

    With ``A_k`` the layer's activation channels and ``g = d score / d A`` (gradient methods):

    ====================  ==============================================================================
    ``"cam"``             Zhou et al. 2016: ``sum_k W[c, k] A_k``, ``W`` the linear head after a global
                          average pool (checked: the head's input must be the layer's spatial mean);
                          no ReLU, as in the paper. ``layers=None`` finds the layer the head pools.
    ``"gradcam"``         Selvaraju et al. 2017: ``relu(sum_k mean_ij(g_k) A_k)``.
    ``"gradcam++"``       Chattopadhay et al. 2018 (eq. 19): ``alpha = g^2 / (2 g^2 + sum_ab A_kab g^3)``,
                          ``w_k = sum_ij alpha relu(g)``, ``relu(sum_k w_k A_k)``. Neither peer
                          follows eq. 19 exactly (bench/RESULTS.md): pytorch-grad-cam adds 1e-6 to
                          the denominator, not small next to ``g^2`` (~2.6e-7 on resnet18
                          ``layer4``), 4.6e-2 apart; torchcam's alpha stays ``g^2``, 6.1e-2 apart.
    ``"xgradcam"``        Fu et al. 2020: ``w_k = sum_ij(A_k g_k) / sum_ij A_k``, ``relu(sum_k w_k A_k)``.
    ``"hirescam"``        Draelos & Carin 2020: ``relu(sum_k g_k * A_k)``.
    ``"layercam"``        Jiang et al. 2021: ``relu(sum_k relu(g_k) * A_k)``.
    ``"scorecam"``        Wang et al. 2020, Algorithm 1 (as pytorch-grad-cam): masks
                          ``H_k = minmax(upsample(A_k))`` (bilinear, align_corners=True),
                          ``w = softmax_k(score(X * H_k))``, ``relu(sum_k w_k A_k)``. Masked inputs run
                          in ``batch_size`` chunks under ``no_grad``; channels with equal masks share
                          one forward, constant channels (zero masks) share one forward of a zero image.
    ``"eigencam"``        Muhammad & Yeasin 2020: ``relu`` of the projection of the channel-centred
                          activations on their first principal component, sign fixed so the loadings
                          sum to >= 0. Needs no gradient and no target.
    ``"gradcamelementwise"`` ``sum_k relu(g_k * A_k)``: HiRes-CAM clipped before the sum (pytorch-grad-cam's).
    ``"eigengradcam"``    Eigen-CAM's projection of ``g * A`` (pytorch-grad-cam's), ``relu``, sign as Eigen-CAM.
    ``"ablationcam"``     Desai & Ramaswamy 2020: ``w_k = (y - y_k) / y``, ``y_k`` the score with channel ``k``
                          of the layer set to zero, ``relu(sum_k w_k A_k)``; the copies run in ``batch_size``
                          chunks (32) under ``no_grad``; ``ratio`` < 1 ablates only the ``ceil(ratio * K)``
                          channels most inside Eigen-CAM's region (the others weigh 0).
    ``"kpcacam"``         Karmani et al. 2024: ``relu`` of the first kernel principal component of the
                          channel-centred activations (``kernel``, ``gamma``, ``degree``, ``coef0`` as
                          scikit-learn's ``KernelPCA``), sign as Eigen-CAM.
    ``"fem"``             Fuad et al. 2020: ``w_k`` the share of positions above ``mean + sigmas * std``.
    ``"randomcam"``       channel weights uniform in [-1, 1] from ``seed``: a baseline.
    ``"shapleycam"``      Cai 2025: ``w_k = mean(g_k - (H A)_k / 2)``, ``H A`` the Hessian-vector product.
    ``"finercam"``        Zhang et al. 2025: Grad-CAM of ``sum_j p_j (y_c - alpha y_j) / sum_j p_j`` over
                          the classes ranked ``comparison`` (1, 2, 3) nearest the target by logit.
    ``"fullgrad"``        Srinivas & Fleuret 2019: ``psi(x * dS/dx)`` plus, for every convolution with a bias
                          and every batch norm, ``psi(b * dS/dA)`` upsampled (``align_corners=True``) and
                          summed over channels; ``psi`` is ``|.|`` min-max per sample over the whole layer.
                          Takes no ``layers=``; a layer called twice is refused.
    ====================  ==============================================================================

    Signals (``B x C x L``) and volumes (``B x C x D x H x W``) work as images do: their layers are
    ``B x C x l`` / ``B x C x d x h x w``, the layer found is the last ``Conv1d`` / ``Conv3d``, and maps
    are upsampled linearly / trilinearly (the token and channels-last readings are for images only).

    The model runs in eval mode (every module's flag, and the random generator, are put back
    afterwards), so batch norm uses its running statistics, dropout is off, and the samples of a
    batch do not interact: the score of sample ``b`` is ``logits[b, target_b]`` and one
    ``torch.autograd.grad(score.sum(), activations)`` gives each sample's own gradient. Maps are upsampled bilinearly (align_corners=False) to the
    input's ``H x W`` and normalised per image as ``(m - min) / (max - min)``; a constant map becomes
    all zeros. A layer whose output does not depend on the input, or (but for Eigen-CAM) does not
    reach the score, is refused. A batch norm that keeps no running statistics
    (``track_running_stats=False``) mixes the samples even in eval mode: gradient methods then take
    one gradient per sample (``d score_b / d A_b``), and Score-CAM is refused for more than one image.
    Formulas run in float32 (float64 for float64 models), so ``maps`` and ``raw`` are float32 for
    float16 / bfloat16 models.

    A 4-D activation is ``B x C x h x w`` or, as Swin's stages and the inside of ConvNeXt blocks,
    ``B x h x w x C`` (channels last, then permuted first; ``CamMaps.layouts`` says which). Told by
    the modules around the layer: the last one of known layout to run inside it (``Conv2d``,
    ``BatchNorm2d``, pooling: first; ``Linear``, ``LayerNorm`` over the last dimension, torchvision's
    ``Permute``: by their dimensions; for a ReLU-like layer, the one that made its input) and the
    ones that read its output; failing both, the one reading whose ``h x w`` grid has the input's
    aspect ratio. Modules that disagree, or two readings that both fit, give one line asking for
    ``reshape=channels_last`` or ``reshape=channels_first``.

    A 3-D activation ``B x N x C`` (a ViT's, DeiT's or Swin's tokens) is read as ``k`` prefix tokens
    (class, distillation, registers; dropped from the activation and its gradient) then an ``h x w``
    grid row by row, when that is certain: ``k`` from the model (timm's ``num_prefix_tokens``, a
    transformers config, the token parameters) and the grid from the patch embedding's ``Conv2d``
    output seen in the pass or, when no ``Conv2d`` of ``C`` channels ran, the input's ``H x W``
    through one integer stride; else a ``Conv2d``'s grid with ``C`` channels and ``k <= 16``; else
    the one strided reading of a ``Linear``/``LayerNorm``'s output with ``k = 0`` or ``k`` the tokens
    of the model's ``1 x n x C`` parameters. Two readings, or none, a patch embedding's grid no
    reading matches (MAE's masking), or a model that re-orders its tokens (Hiera, ViTMAE) give one
    line asking for ``reshape=hookscope.tokens_to_grid(skip=K)`` (CLI: ``--tokens K``, ``--grid HxW``
    when not square). A 4-D reading the modules tell must also give a grid of the input's aspect
    ratio. A ``torch.compile``'d model runs with the hooks eager between graph pieces. A sample whose score's
    gradient at the layer is exactly zero (all logits equal: an untrained head) gets an all-zero
    map and a warning, kept in ``CamMaps.notes``.

    Args:
        model: any ``nn.Module`` (wrappers such as DataParallel are seen through).
        inputs: ``B x C x H x W`` batch, or ``B x C x L`` signals, ``B x C x D x H x W`` volumes (copied:
            your tensor is never written to).
        layers: a layer selector (name, glob, type, module...) or a list of them; several layers give
            maps that are upsampled, normalised and fused. ``None``: found in a first pass and stated
            in ``CamMaps.chosen`` (and ``table()``): for a transformer (an ``nn.MultiheadAttention``
            or a class named ``...Attention``, ``...Attn``, ``MHSA``, ``GPSA`` ran), the norm that ran
            last before the last attention of the repeated blocks (a module list; a pooling head's
            attention after them does not count) in its block, i.e. the input of the last token
            mixing, as the CAM literature (ViT ``blocks[-1].norm1``, Swin
            ``layers[-1].blocks[-1].norm1``); a post-norm one (Swin V2) is refused; else the last
            ``nn.Conv2d`` with a spatial output in execution order, or, when it sits in a block with a
            depthwise ``Conv2d`` before the block's residual add (ConvNeXt: the depthwise conv or
            timm's 1 x 1 ``mlp.fc2``), that block's output; ``"cam"``: the layer the head pools.
        method: one of :data:`METHODS` (``"Grad-CAM++"`` and ``"grad_cam"`` spellings accepted).
        target: ``None`` (each sample's predicted class, from the same forward pass), a class index
            for all, one index per sample (also as an object with a ``class_index``, such as
            ``hookscope.targets.Class``), or a function of the model's output (through ``output``
            if given) returning ``B`` scores, e.g. a segmentation region's summed logit or a cosine
            similarity to an embedding. Score-CAM calls the function on the outputs of batches of
            masked inputs too, so it must score each row on its own.
        output: picks ``B x classes`` logits from the model's output, e.g. ``lambda o: o.logits``.
        reshape: turns the activation into ``B x C x h x w``; applied to the activation and to its
            gradient, and no layout is guessed then. :func:`tokens_to_grid` for ``B x tokens x C``,
            :func:`channels_last` / :func:`channels_first` to say what a 4-D layer holds.
        fuse: ``"mean"`` or ``"max"`` over layers.
        batch_size: Score-CAM's masked inputs per forward (``None``: 16), Ablation-CAM's ablated copies
            (``None``: 32). Theirs alone, like
            ``progress``: the other methods refuse it in one line (:class:`~hookscope.errors.SettingError`).
        ratio, kernel, gamma, degree, coef0, comparison, alpha, sigmas, seed: the settings of Ablation-CAM,
            KPCA-CAM, Finer-CAM, FEM and Random-CAM (see the table); ``None``: the method's default. Each is
            refused by the methods that do not read it.
        progress: Score-CAM progress bar (tqdm if installed, else a counter on stderr); ``None``:
            shown when stderr is a terminal and the first batch says the whole run will take over
            5 seconds.
        kwargs: keyword inputs of the model, e.g. ``{"attention_mask": m}``. A tensor with ``B`` rows
            goes with its samples: Score-CAM's masked inputs get the rows of the images they mask.

    Returns:
        A :class:`CamMaps`.

    Raises:
        ForwardError: the model's forward pass failed (one line: the module, what it received).
        HookscopeError: a layer, target, method or argument that cannot work, in one line.

    Example:
        >>> import torch, hookscope.zoo
        >>> net = hookscope.zoo.TinyResNet().eval()
        >>> res = cam(net, torch.randn(2, 3, 32, 32), layers="layer2", method="gradcam")
        >>> res.maps.shape, res.raw["layer2"].shape, res.layers
        (torch.Size([2, 32, 32]), torch.Size([2, 16, 16]), ['layer2'])
    """
    method = _check_method(method)
    settings = check_settings(method, {"batch_size": batch_size, "progress": progress, "ratio": ratio, "kernel": kernel,
                                       "gamma": gamma, "degree": degree, "coef0": coef0, "comparison": comparison,
                                       "alpha": alpha, "sigmas": sigmas, "seed": seed})
    # Score-CAM: 224x224 chunks of 16 beat 64 on the CPU (bench/RESULTS.md); Ablation-CAM: pytorch-grad-cam's 32
    batch_size = settings.pop("batch_size", 16)
    index = getattr(target, "class_index", None)  # hookscope.targets.Class: its class, an int or a list of ints
    if isinstance(index, (list, tuple)) and len(index) == 1:  # Class([3]): one row for every sample
        index = index[0]
    target = target if index is None else index
    kw = model_kwargs(kwargs)
    inner = _check_call(model, inputs, method, target, fuse, batch_size)
    chosen: list[tuple[str, nn.Module]] | None
    if method == "fullgrad":
        chosen = _fullgrad_layers(inner, inputs, layers)
    else:
        chosen = None if layers is None else exact_ops(select(model, cast(Selector, layers)), "cam")  # lists flattened
    if chosen is not None:
        check_hookable(chosen)
    # In eval already, no flag changes: only the random stream is kept, since restored() would write
    # every module's flag back (0.5 ms on resnet50 at batch 1, measured: 0.7% of the forward).
    kept = restored(model, train=False) if any(m.training for m in model.modules()) else kept_rng(([], None))
    with kept, torch.inference_mode(False), torch.enable_grad():
        res = _explain(model, inner, inputs, kw, chosen, method, target, output, reshape, fuse, batch_size, progress,
                       settings)
    for note in res.notes:  # a blank map must not pass for an answer: said here, and kept in res.notes
        warnings.warn(note, UserWarning, stacklevel=3)  # past checked's frame, at the caller
    return res


def _explain(model: nn.Module, inner: nn.Module, inputs: torch.Tensor, kw: dict[str, Any],
             chosen: list[tuple[str, nn.Module]] | None, method: str, target: Target,
             output: Callable[[Any], torch.Tensor] | None, reshape: Callable[[torch.Tensor], torch.Tensor] | None,
             fuse: str, batch_size: int, progress: bool | None, settings: dict[str, Any]) -> CamMaps:
    B, size = inputs.shape[0], tuple(inputs.shape[2:])
    rank = len(size)
    original = inputs.detach().clone()  # what Score-CAM masks, whatever the model writes into its input
    leaf = original.detach().requires_grad_() if original.is_floating_point() else None
    base = leaf if leaf is not None else original

    def fresh() -> torch.Tensor:  # the model may write into its input: ours, never the caller's
        return base.clone()

    # the layouts of tokens and channels last are those of images; a signal's or a volume's layer is channels first
    p, chosen, forwards, why = hooked_pass(model, inner, fresh, kw, chosen, method, chosen is not None and
                                           reshape is None and rank == 2, size)
    if method == "fullgrad":  # every biased layer that made one map of the input's rank
        twice = next((n for n, _ in chosen if len(p.kept[n]) > 1), None)
        if twice is not None:  # each call adds its bias once more: dropping the layer would lose those terms
            raise HookscopeError(f"fullgrad sums the bias gradient of every layer call, and {twice!r} ran "
                                 f"{len(p.kept[twice])} times in the forward pass; use another method for a "
                                 "model that reuses a convolution or batch norm")
        chosen = [(n, m) for n, m in chosen if len(p.kept[n]) == 1 and p.kept[n][0] is not None
                  and cast(torch.Tensor, p.kept[n][0]).ndim == rank + 2]
    acts = activations(p, chosen, leaf)
    shaped, layouts = shapers(acts, p.probe if p.probed else None, reshape,
                              prefix_tokens(inner) if p.probed else None, size)
    A = {n: work(as_4d(n, a.detach(), shaped[n], B, rank)) for n, a in acts.items()}
    score, targets, logits = _read_scores(target, output, p.output, B, method)
    if not TABLE[method].gradient:  # gradient methods find out from autograd.grad itself
        _check_reach(acts, score, p.output)
    job = Job(model, p, acts, A, shaped, score, targets, logits, batch_coupled(inner), kw, original, target,
              output, batch_size, progress, settings, dict(chosen), leaf)
    made = TABLE[method].maps(job)
    ups = [normalise(upsample(r.unsqueeze(1), size).squeeze(1)) for r in made.raw.values()]
    if made.final is not None:  # a method that sums its own terms at the input's size (FullGrad)
        maps = normalise(made.final)
    elif len(ups) == 1:  # already normalised
        maps = ups[0]
    else:
        stacked = torch.stack(ups)
        maps = normalise(stacked.mean(0) if fuse == "mean" else stacked.amax(0))
    return CamMaps(maps=maps, raw=made.raw, targets=targets, scores=None if score is None else score.detach(),
                   layers=[n for n in made.raw if n in acts], method=method, forwards=forwards + made.forwards, masked=made.masked,
                   layouts=layouts, chosen=why, notes=made.notes)


def _check_reach(acts: dict[str, torch.Tensor], score: torch.Tensor | None, output: Any) -> None:
    """Refuse a layer that the score (or, with none read, the model's output) does not depend on."""
    ends = [score] if score is not None else [t for t in tensors(output) if t.grad_fn is not None]
    for n, a in acts.items():
        if not any(reaches(e, a) for e in ends):
            what = "the target score" if score is not None else "the model's output"
            raise HookscopeError(f"layer {n!r}'s output does not reach {what}; pick a layer the output depends on")


def _check_method(method: str) -> str:
    key = method.lower().replace("-", "").replace("_", "") if isinstance(method, str) else ""
    if key not in TABLE:
        raise HookscopeError(f"method={method!r} is not a CAM method.{did_you_mean(str(method), TABLE)} "
                             f"Use one of {', '.join(TABLE)}")
    return key


def _fullgrad_layers(inner: nn.Module, inputs: Any, layers: Any) -> list[tuple[str, nn.Module]]:
    """FullGrad's layers: every convolution with a bias and every batch norm of the input's rank."""
    if layers is not None:
        raise SettingError("layers= is not a setting of fullgrad, which sums the bias gradients of every convolution "
                           "and batch norm; drop layers=, or use another method to explain one layer")
    rank = inputs.ndim - 2
    found = biased_layers(inner, rank)
    if not found:
        raise HookscopeError(f"fullgrad needs the biases of convolutions or batch norms of {rank}-D maps, and "
                             f"{type(inner).__name__} has none; use another method")
    return found


def _check_call(model: nn.Module, inputs: Any, method: str, target: Target, fuse: str, batch_size: int) -> nn.Module:
    inner, _ = unwrap(model)
    if fuse not in ("mean", "max"):
        raise HookscopeError(f"fuse={fuse!r} is not a fusion; use 'mean' or 'max'")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise HookscopeError(f"batch_size={batch_size!r} must be a positive int")
    if not isinstance(inputs, torch.Tensor) or not 3 <= inputs.ndim <= 5:
        shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise HookscopeError(f"inputs of shape {shape} are not signals, images or volumes; pass a B x C x L, "
                             "B x C x H x W or B x C x D x H x W batch")
    if is_function(target) and method == "cam":
        raise HookscopeError("method='cam' weighs channels by the head's row of a class, so it needs class-index "
                             "targets (int, list or None), not a function; use 'gradcam' for a target function")
    if method in ("scorecam", "fullgrad") and not inputs.is_floating_point():
        why = "multiplies the inputs by masks" if method == "scorecam" else "multiplies the inputs by their gradient"
        raise HookscopeError(f"{method} {why}, so they must be floating point, not {inputs.dtype}")
    if is_function(target) and method == "finercam":
        raise HookscopeError("finercam compares the target class with the classes nearest it, so it needs class-index "
                             "targets (int, list or None), not a function; use 'gradcam' for a target function")
    coupled = batch_coupled(inner)
    if method in ("scorecam", "ablationcam") and coupled is not None and (inputs.shape[0] > 1 or batch_size > 1):
        what = "a masked" if method == "scorecam" else "an ablated"
        raise HookscopeError(f"{coupled} normalises with each batch's own statistics even in eval mode, so {what} "
                             "input's score would depend on the others in its batch; pass one image with "
                             "batch_size=1, or use a gradient method")
    if method in ("shapleycam", "fullgrad") and coupled is not None and inputs.shape[0] > 1:
        raise HookscopeError(f"{coupled} normalises with each batch's own statistics even in eval mode, so the "
                             f"samples of a batch interact; pass one sample at a time to {method}")
    return inner


def _read_scores(target: Target, output: Callable[[Any], torch.Tensor] | None, out: Any, B: int, method: str
            ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(score of each sample, class targets, logits) read from the model's output; None where not read."""
    if is_function(target):
        return user_scores(cast(Callable[[Any], Any], target), output, out, B, f"a batch of {B}"), None, None
    try:
        logits = read_logits(output, out, B)
    except HookscopeError:
        if not TABLE[method].scored and target is None:  # Eigen-CAM and its kin need no score: none read is fine
            return None, None, None
        raise
    targets = logits.argmax(1) if target is None else class_targets(target, B, logits.shape[1], logits.device)
    return logits.gather(1, targets.unsqueeze(1)).squeeze(1), targets, logits
