"""The training-run section: a run a monitor logged (``hookscope.monitor(..., log=DIR)``), read back with
:func:`hookscope.read_run` and drawn with :func:`hookscope.viz.plot_run`: the loss, then per layer and
sampled step the gradient norm, the update ratio and the dead fraction, the first NaN or Inf marked."""

from __future__ import annotations

from ..analysis.monitor import Run
from .html import Figure, Section
from .subject import Subject

__all__ = ["run_section"]


def _flagged(run: Run) -> str | None:
    steps = run.nonfinite_steps()
    if not steps:
        return None
    first = next(r for r in run.nonfinite if r.step == steps[0])
    where = f" in {first.layer}" if first.layer else ""
    more = f"; {len(steps) - 1} later step{'s' if len(steps) > 2 else ''} flagged too" if len(steps) > 1 else ""
    return f"A NaN or an Inf first appeared at step {steps[0]}{where}{more}: {first.note}"


def run_section(s: Subject, run: Run) -> Section:
    """The run's picture and, per layer, its last sampled values and their range over the run."""
    from ..viz.plots import save_figure
    from ..viz.runs import plot_run

    sec = Section("run", "Training run", warning=_flagged(run), text=run.table(), text_title="per layer",
                  data={"path": str(run.path), "steps": run.steps, "layers": run.layers,
                        "nonfinite_steps": run.nonfinite_steps(), "notes": run.notes})
    if not run.steps:
        sec.paragraphs.append(f"{run.path} holds no sampled step yet.")
        return sec
    sec.paragraphs.append(f"Read from {run.path}: {len(run.steps)} sampled steps ({run.steps[0]} to "
                          f"{run.steps[-1]}) of {len(run.layers)} layers, as the monitor logged them.")
    sec.paragraphs += run.notes
    drawn = save_figure(plot_run(run), s.image("run"))
    sec.figures.append(Figure(s.relative(drawn), "the loss, then each layer's gradient norm, update ratio and "
                              "dead fraction at each sampled step; a red line where a NaN or an Inf first "
                              "appeared, red cells where a logged value is not finite"))
    return sec
