"""The training monitor inside training frameworks: :class:`LightningMonitor`, a Lightning ``Callback``,
and :class:`TrainerMonitor`, a transformers ``TrainerCallback``, each running one
:func:`hookscope.monitor` over the framework's own steps.

``_driven`` (the monitor a framework drives: its settings, the step's two moments, skipping a
non-finite step) -> ``_lightning`` and ``_trainer`` (the framework's callbacks, their classes made
when first built, so that neither framework is imported before it is used).
"""

from ._lightning import LightningMonitor
from ._trainer import TrainerMonitor

__all__ = ["LightningMonitor", "TrainerMonitor"]
