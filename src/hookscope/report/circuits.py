"""The circuits section: results of the circuit analyses computed beforehand (an activation or attribution
patching sweep, a logit lens, a direct logit attribution), each drawn with :mod:`hookscope.viz.circuits`
under a heading, with a table of its largest cells and its full table folded away.

Nothing is computed here: the results come ready, as the training run comes as a log. Their classes are
read from :mod:`hookscope.analysis.circuits` only to tell them apart.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any, Union

from ..analysis.circuits import LogitAttribution, LogitLens, Patching
from ..errors import HookscopeError
from .html import Section
from .subject import Subject
from .widgets import row_table

__all__ = ["CircuitResult", "TOP", "check_circuits", "circuit_section"]

CircuitResult = Union[Patching, LogitLens, LogitAttribution]
TOP = 5  # the largest cells or terms listed under each picture


def check_circuits(circuits: Sequence[Any] | CircuitResult) -> list[CircuitResult]:
    """The results as a list; anything else fails before any work, naming what it is.

    Example:
        >>> check_circuits([1.0])
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: circuits= item 0 is a float, not a Patching, LogitLens or LogitAttribution; give results of hookscope.activation_patching, attribution_patching, logit_lens or logit_attribution
    """
    if isinstance(circuits, (Patching, LogitLens, LogitAttribution)):
        circuits = [circuits]
    found = list(circuits)
    for i, r in enumerate(found):
        if not isinstance(r, (Patching, LogitLens, LogitAttribution)):
            raise HookscopeError(f"circuits= item {i} is a {type(r).__name__}, not a Patching, LogitLens or "
                                 "LogitAttribution; give results of hookscope.activation_patching, "
                                 "attribution_patching, logit_lens or logit_attribution")
    return found


def _patching(r: Patching) -> tuple[str, list[str], list[list[str]], str]:
    how = {"activation": "Activation patching", "attribution": "Attribution patching",
           "eap-ig": f"Attribution patching with integrated gradients ({r.steps} steps)"}[r.method]
    title = f"{how}: {r.kind} per {r.per}, {r.direction}"
    share = {(row.layer, row.column): row.normalised for row in r.rows}
    rows = [[layer, col, f"{effect:+.4f}", f"{share[(layer, col)]:.3f}"] for layer, col, effect in r.top(TOP)]
    caption = (f"change of {r.metric} from the run patched into ({r.base:.4f}) when each cell is patched; red "
               f"raises it, blue lowers it (clean {r.clean:.4f}, corrupted {r.corrupted:.4f})")
    return title, ["layer", {"position": "position", "head": "head", "layer": "kind"}.get(r.per, r.per),
                   f"change of {r.metric}", "share of the gap"], rows, caption


def _lens(r: LogitLens) -> tuple[str, list[str], list[list[str]], str]:
    last = r.logits.shape[1] - 1
    rows = [[x.stream, str(x.top[0]), f"{x.top_probs[0]:.3f}", str(x.rank), f"{x.prob:.3f}", f"{x.kl:.3f}"]
            for x in r.rows if x.position == last]
    caption = (f"probability of the token followed at each stream (down) and position (across); the table: "
               f"position {last}")
    return r.kind.capitalize(), ["stream", "top token", "p(top)", "rank of the token", "p(token)", "KL"], rows, caption


def _attribution(r: LogitAttribution) -> tuple[str, list[str], list[list[str]], str]:
    what = f"logit[{r.answer}]" if r.wrong is None else f"logit[{r.answer}] - logit[{r.wrong}]"
    terms = sorted(r.rows, key=lambda x: -abs(x.value))[:TOP]
    rows = [[x.name, f"{x.value:+.4f}"] for x in terms]
    caption = (f"each term's part of {what} at position {r.position}: {r.logit:.4f}, which the terms sum to "
               f"({r.total:.4f}); red positive, blue negative")
    return f"Direct logit attribution of {what}", ["term", "value"], rows, caption


def _picture(r: CircuitResult) -> Any:
    from ..viz.circuits import plot_logit_attribution, plot_logit_lens, plot_patching

    if isinstance(r, Patching):
        return plot_patching(r)
    if isinstance(r, LogitLens):
        return plot_logit_lens(r)
    return plot_logit_attribution(r)


def _block(s: Subject, r: CircuitResult, i: int) -> tuple[str, str]:
    """One result's heading, picture, table of its largest cells and full table; and its heading."""
    from ..viz.plots import save_figure

    title, head, rows, caption = (_patching(r) if isinstance(r, Patching) else _lens(r) if isinstance(r, LogitLens)
                                  else _attribution(r))
    title = f"{title} ({r.model})"
    path = s.relative(save_figure(_picture(r), s.image(f"circuit_{i}")))
    e = html.escape
    listed = "the largest cells" if isinstance(r, Patching) else (
        "each stream at the last position" if isinstance(r, LogitLens) else "the largest terms")
    body = (f'<div class="circuit" id="circuit-{i}"><h3>{e(title)}</h3>'
            f'<figure><img src="{e(path)}" alt="{e(title)}"><figcaption>{e(caption)}</figcaption></figure>'
            f"<p>{e(listed)}:</p>{row_table(head, rows)}"
            f"<details><summary>full table</summary><pre>{e(r.table())}</pre></details></div>")
    return body, title


def circuit_section(s: Subject, circuits: Sequence[CircuitResult]) -> Section:
    """Each result's picture and tables, in the order given; ``report.json`` holds each one's ``to_dict()``."""
    sec = Section("circuits", "Circuits", data=[])
    sec.paragraphs.append(f"{len(circuits)} result{'s' if len(circuits) != 1 else ''} of the circuit analyses, "
                          "computed before the report and drawn as given.")
    for i, r in enumerate(circuits):
        body, title = _block(s, r, i)
        sec.blocks.append(body)
        sec.data.append({"type": type(r).__name__, "title": title, "picture": f"img/circuit_{i}.png", **r.to_dict()})
    return sec
