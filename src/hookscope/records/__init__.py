"""What is kept of a module call, and how: the retention policy and the records, one a call.

``retention`` (:class:`Retention`: copy, detach, device, dtype), ``call`` (:class:`CallRecord`, one
call of one module), ``layer`` (:class:`LayerRecord`, every call of one module), ``recording``
(:class:`Recording`, a capture's records by name), ``reading`` (:func:`load`, a saved recording read
back). Must not import: ``capture``, ``analysis``, ``viz``, ``cli``.
"""

from .call import HOLE as HOLE
from .call import CallRecord, Hole as Hole, tensors_of as tensors_of
from .layer import LayerRecord
from .reading import load
from .recording import CallRow as CallRow
from .recording import Recording
from .retention import CopyPolicy as CopyPolicy
from .retention import Retention, check_device

__all__ = ["Retention", "CallRecord", "LayerRecord", "Recording", "check_device", "load"]
