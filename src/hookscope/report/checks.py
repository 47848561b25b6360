"""Report sections about the model as a whole: predictions, trace, the NaN/Inf check, gradient flow."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..analysis.gradflow import gradient_flow
from ..analysis.trace import Trace, trace
from ..analysis.watch import Watch, watch
from ..errors import HookscopeError
from .html import Figure, Section
from .subject import Subject, loss_of

__all__ = ["debug_sections", "predictions"]

_SHOWN = 8  # images listed one by one; more are summed up


def predictions(s: Subject) -> Section:
    """The model's prediction for each input: class (with its name) and probability."""
    with torch.no_grad():
        out = s.model(s.inputs())
    if not isinstance(out, torch.Tensor):  # a transformers ModelOutput, or a dict holding "logits"
        out = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    logits = out if isinstance(out, torch.Tensor) else None
    sec = Section("predictions", "Predictions")
    if logits is None or logits.dim() != 2:
        sec.paragraphs.append("The model's output is not a B x classes tensor: no predictions shown.")
        return sec
    p, k = logits.float().softmax(-1).max(-1)
    names = s.class_names
    if names is not None and len(names) != logits.shape[1]:
        raise HookscopeError(f"class_names has {len(names)} names but the model has {logits.shape[1]} outputs; "
                             "give one name per output, in class order")
    classes, probs = k.tolist(), p.tolist()
    rows = [{"image": i, "class": c, "name": names[c] if names is not None else None, "prob": probs[i]}
            for i, c in enumerate(classes)]
    sec.facts = [(f"image {i}", f"class {s.label(c)}, probability {probs[i]:.3f}")
                 for i, c in enumerate(classes[:_SHOWN])]
    if len(rows) > _SHOWN:
        sec.paragraphs.append(f"{len(rows) - _SHOWN} more images in report.json.")
    sec.data = rows
    return sec


def _checked(s: Subject) -> tuple[Trace, Watch]:
    """One forward and backward pass, traced and watched at once: both see the same tensors, so this is
    what two passes gave, for half the work."""
    s.model.zero_grad(set_to_none=True)  # both read this pass's gradients only
    t = trace(s.model, keep=("output", "grads"), param_grads=True)
    w = watch(s.model)
    with t, w:
        loss_of(s.model(s.inputs())).backward()
    return t, w


def debug_sections(s: Subject) -> list[Section]:
    """Trace (forward and backward statistics), the NaN/Inf check and gradient flow, from one pass."""
    from ..viz.plots import plot_gradient_flow, plot_trace, save_figure

    t, w = _checked(s)
    flow = gradient_flow(s.model, trace=t)
    s.model.zero_grad(set_to_none=True)
    tr = Section("trace", "Trace", text=t.table(), text_title=f"every row ({len(t.rows)})",
                 paragraphs=["Per layer standard deviation and largest |x| of outputs (forward) and of "
                             "their gradients (backward, loss = logsumexp of the logits), in execution order."],
                 data=t.to_dict())
    tr.figures.append(Figure(s.relative(save_figure(plot_trace(t), s.image("trace"))), "trace"))
    ok = w.finite
    nf = Section("nonfinite", "NaN / Inf check", data=w.to_dict(),
                 paragraphs=["Every output and gradient was finite."] if ok else [],
                 text=None if ok else w.table(), text_title="where it first appeared",
                 warning=None if ok else "Non-finite values found.")
    gf = Section("gradflow", "Gradient flow", text=flow.table(), text_title="every layer", data=flow.to_dict(),
                 paragraphs=[f"Vanishing (< {flow.vanish:g}): {', '.join(flow.vanishing) or 'none'}; "
                             f"exploding (> {flow.explode:g}): {', '.join(flow.exploding) or 'none'}."])
    drawn = save_figure(plot_gradient_flow(flow, trace=t), s.image("gradflow"))
    gf.figures.append(Figure(s.relative(drawn), "gradient flow"))
    return [tr, nf, gf]

