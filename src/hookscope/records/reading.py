"""Reading back a :class:`~hookscope.records.Recording` that :meth:`Recording.save` wrote
(:func:`load`): every call rebuilt as the capture left it.

Must not import: anything of hookscope but ``errors``, ``core``, ``_tree``, ``records``' own modules and
``_saved`` (when reading).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._tree import tree_map
from ..core.guard import Slot
from ..errors import RecordError, checked
from .call import HOLE, CallRecord, tensors_of
from .recording import FIELDS, Recording

__all__ = ["load"]


@checked
def load(path: str | os.PathLike[str]) -> Recording:
    """Read back a :class:`Recording` written by :meth:`Recording.save`.

    The result speaks the same protocol as the recording saved (``rec[name].output``,
    ``rec.calls``, ``table()``, ``rows``, ``to_dict()``); tensors are on the CPU. A store written by
    :func:`hookscope.extract` is refused: open it with :func:`hookscope.open_store`.

    Example:
        >>> import tempfile, torch, hookscope
        >>> net = torch.nn.Linear(2, 2)
        >>> with hookscope.capture(net, "", keep="io") as rec:
        ...     _ = net(torch.ones(1, 2)); _ = net(torch.zeros(1, 2))
        >>> again = load(rec.save(tempfile.mkdtemp() + "/rec"))
        >>> [c.index for c in again.calls], again[""].calls[1].input.sum().item()
        ([0, 1], 0.0)
    """
    from .._saved import read_recording

    selected, aliases, keep, saved, decoder = read_recording(path)
    try:
        if not set(keep) <= set(FIELDS):
            raise ValueError(f"keep holds {sorted(set(keep) - set(FIELDS))}")
        calls = [_saved_call(c, decoder) for c in saved]
        indices = [c.index for c in calls]
        if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
            raise ValueError("call indices are negative or repeated")
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise RecordError(f"{os.fspath(path)}/manifest.json does not describe a saved recording ({type(e).__name__}: "
                          f"{e}); save the recording again") from None
    rec = Recording(selected, aliases, keep)
    for call in calls:
        if call.name not in rec.selected:
            raise RecordError(f"{path}: call {call.index} is of {call.name!r}, which the recording does not select; "
                              "save the recording again")
        rec._adopt(call)
    return rec


def _fill(call: CallRecord, field: str, saved: Mapping[str, Any], decoder: Any) -> None:
    """Put one saved field back into ``call``, as the capture would have."""
    if "error" in saved:
        cls, message = saved["error"]
        call.fail(field, str(message), "MutationError" if cls == "MutationError" else "RecordError")
        return
    if saved.get("raised"):
        call.mark_running()
        return
    value = saved["value"]
    if field == "input":
        call.set_inputs(decoder.node(value["args"]), decoder.node(value["kwargs"]))
    elif field == "output":
        call.set_output(decoder.node(value))
    else:
        tree = decoder.node(value)
        skeleton = tree_map(lambda _: HOLE, tree, leaf=Slot)  # None stays None: no gradient arrived there
        expect = call.expect_grad_output if field == "grad_output" else call.expect_grad_input
        slots = tensors_of(tree)
        expect(skeleton, len(slots))[:] = slots


def _saved_call(saved: Mapping[str, Any], decoder: Any) -> CallRecord:
    """A :class:`CallRecord` rebuilt from its saved form (``decoder``: :class:`hookscope._saved.Decoder`)."""
    call = CallRecord(str(saved["name"]), int(saved["index"]))
    for field, value in saved["fields"].items():
        if field not in FIELDS:
            raise ValueError(f"unknown field {field!r}")
        decoder.where = (field, call.name, call.index)
        _fill(call, field, value, decoder)
    return call
