"""The writers that need an extra: TensorBoard (``torch.utils.tensorboard``, the ``tensorboard``
extra) and Weights & Biases (``wandb``, the ``wandb`` extra), each imported when the writer is made."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ...errors import HookscopeError, checked_init
from ._telemetry import Histogram, Telemetry, scalars
from ._writers import Writer, checked_folder

__all__ = ["TensorBoardWriter", "WandbWriter"]


def _needs(package: str, writer: str) -> HookscopeError:
    return HookscopeError(f"{writer} needs the {package} package, from the {package} extra: "
                          f"pip install 'hookscope[{package}]'")


def _hist_tags(h: Histogram) -> str:
    return f"{h.of}/{h.layer}" if h.of in ("output", "grad_output") else f"{h.of}/{h.layer}.{h.path}"


@checked_init
class TensorBoardWriter(Writer):
    """Event files in ``folder`` that TensorBoard reads: every scalar of the step (see
    :func:`~hookscope.analysis.monitor.scalars`, named ``grad_norm/layer1.0.conv1`` so that
    TensorBoard groups them), and each histogram as a TensorBoard histogram of its finite values
    in bins, with its NaN, +Inf, -Inf and out-of-range counts as scalars
    (``hist_nan/output/<layer>`` ...). Flushed after every step.

    Args:
        folder: the run's folder (made if missing), TensorBoard's ``--logdir`` or one of its runs.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _needs("tensorboard", "TensorBoardWriter") from None
        self.folder = checked_folder(folder, "TensorBoardWriter")
        self._writer = SummaryWriter(log_dir=str(self.folder))

    def write(self, telemetry: Telemetry) -> None:
        step = telemetry.step
        for tag, value in scalars(telemetry).items():
            self._writer.add_scalar(tag, value, step)
        for h in telemetry.histograms:
            tag = _hist_tags(h)
            for name in ("nan", "posinf", "neginf", "below", "above"):
                self._writer.add_scalar(f"hist_{name}/{tag}", float(getattr(h, name)), step)
            if sum(h.counts):
                centres = [(a + b) / 2 for a, b in zip(h.edges, h.edges[1:])]
                self._writer.add_histogram_raw(
                    tag, min=h.edges[0], max=h.edges[-1], num=sum(h.counts),
                    sum=sum(c * x for c, x in zip(h.counts, centres)),
                    sum_squares=sum(c * x * x for c, x in zip(h.counts, centres)),
                    bucket_limits=h.edges[1:], bucket_counts=h.counts, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


@checked_init
class WandbWriter(Writer):
    """A Weights & Biases run: every scalar of the step under its name (``grad_norm/layer1.0.conv1``)
    and each histogram as a ``wandb.Histogram`` of its bins, with its NaN, +Inf, -Inf and
    out-of-range counts as scalars (``hist_nan/output/<layer>`` ...), all at the step's number.

    Args:
        run: a run already started (``wandb.init(...)``), which stays open; or ``None`` to start one
            here with ``project``, ``dir`` and ``mode`` (``"offline"`` writes only to ``dir``;
            ``None`` follows ``WANDB_MODE``), finished when the monitor ends.
        project, dir, mode: as ``wandb.init`` takes them.
    """

    def __init__(self, run: Any = None, *, project: str | None = "hookscope", dir: str | os.PathLike[str] | None = None,
                 mode: str | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise _needs("wandb", "WandbWriter") from None
        self._wandb = wandb
        self._own = run is None
        if dir is not None:
            checked_folder(dir, "WandbWriter(dir")
        chosen: Any = mode  # wandb's own check names the modes it takes
        self.run = run if run is not None else wandb.init(project=project, dir=None if dir is None else str(dir),
                                                          mode=chosen, reinit="create_new")

    def write(self, telemetry: Telemetry) -> None:
        data: dict[str, Any] = dict(scalars(telemetry))
        for h in telemetry.histograms:
            tag = _hist_tags(h)
            data.update({f"hist_{n}/{tag}": getattr(h, n) for n in ("nan", "posinf", "neginf", "below", "above")})
            if h.counts and all(math.isfinite(e) for e in h.edges):
                data[tag] = self._wandb.Histogram(np_histogram=(np.array(h.counts), np.array(h.edges)))
        self.run.log(data, step=telemetry.step)

    def close(self) -> None:
        if self._own:
            self.run.finish()
