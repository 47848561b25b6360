"""The summary section: the model's totals as a table people read (``Parameters 11.7 M``), the full
per-layer table of :func:`hookscope.summary` below it."""

from __future__ import annotations

from ..analysis.summary import Summary
from ..core.text import shape_text
from .html import Section
from .subject import Subject

__all__ = ["count", "size", "summary_facts", "summary_section"]


def count(n: int) -> str:
    """A count as people read it: ``11.7 M``, ``950``, ``1.8 G``.

    Example:
        >>> count(950), count(11_689_512), count(1_814_083_072), count(12_345)
        ('950', '11.7 M', '1.81 G', '12.3 k')
    """
    for unit, scale in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return str(n)


def size(n: int) -> str:
    """Bytes as people read them, in powers of 1024 as the summary table has them: ``44.6 MiB``.

    Example:
        >>> size(40), size(46_758_048), size(2048)
        ('40 B', '44.6 MiB', '2 KiB')
    """
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{value:.3g} {unit}"


def _zeros(result: Summary) -> str:
    t = result.totals
    if t.zeros is None or t.sparsity is None:
        return "unknown (the values cannot be read here)"
    pct = 100 * t.sparsity
    share = f"{pct:.1f}%" if pct >= 1 else f"{pct:.2f}%" if pct >= 0.01 else "under 0.01%"  # never a bare 0.0%
    return "none" if not t.zeros else f"{share} ({t.zeros:,} of {t.params:,})"


def summary_facts(result: Summary) -> list[tuple[str, str]]:
    """(label, value) rows of the model's totals, in words and units: no field names, no Python values.

    Example:
        >>> import torch
        >>> from hookscope import summary
        >>> facts = dict(summary_facts(summary(torch.nn.Linear(4, 2), torch.zeros(3, 4))))
        >>> facts["Parameters"], facts["Multiply-adds"], facts["Masked layers"]
        ('10 (trainable 10, frozen 0)', '24', 'none')
    """
    t = result.totals
    inputs = ", ".join(f"{shape_text(shape).replace('x', ' × ')} {dtype}" for shape, dtype in result.inputs)
    macs = count(t.macs) + (" at least: some products could not be counted (see Notes in the table)"
                            if t.macs_partial else "")
    calls = f"{t.calls:,} calls of {t.modules:,} modules" + (f"; {t.not_called:,} never called" if t.not_called else "")
    return [
        ("Model", result.model),
        ("Input", inputs or "none"),
        ("Parameters", f"{count(t.params)} (trainable {count(t.trainable)}, frozen {count(t.frozen)})"),
        ("Parameter memory", size(t.param_bytes)),
        ("Buffers", f"{t.buffers:,} tensors, {count(t.buffer_numel)} values, {size(t.buffer_bytes)}"),
        ("Multiply-adds", macs),
        ("Input memory", size(t.input_bytes)),
        ("Activation memory", f"{size(t.activation_bytes)} (new outputs of the innermost modules)"),
        ("Module calls", calls),
        ("Zero parameters", _zeros(result)),
        ("Masked layers", ", ".join(t.masked) or "none"),
    ]


def summary_section(s: Subject) -> Section:
    """Layers, parameters, multiply-adds and shapes (``hookscope.summary``), as a table and in full."""
    result = s.summary()
    sec = Section("summary", "Summary", text=result.table(), text_title="every layer", data=result.to_dict())
    sec.facts = summary_facts(result)
    return sec
