"""hookscope: see inside and steer any PyTorch model through hooks, correct by default.

Example:
    >>> import torch, hookscope
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> with hookscope.capture(net, torch.nn.Linear) as rec:
    ...     _ = net(torch.randn(2, 4))
    >>> rec["0"].output.shape
    torch.Size([2, 8])
"""

from .capture import Capture, capture
from .edit import Edit, ablate, edit, scale
from .grads import GradRecord, GradWatch, grads
from .errors import HookscopeError, MutationError, RecordError, SelectionError
from .records import CallRecord, LayerRecord, Recording, Retention
from .selection import layers, names, unwrap

__version__ = "0.1.0"

__all__ = [
    "CallRecord",
    "Capture",
    "Edit",
    "GradRecord",
    "GradWatch",
    "HookscopeError",
    "LayerRecord",
    "MutationError",
    "RecordError",
    "Recording",
    "Retention",
    "SelectionError",
    "ablate",
    "capture",
    "edit",
    "grads",
    "layers",
    "names",
    "scale",
    "unwrap",
]
