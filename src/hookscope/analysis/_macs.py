"""Multiply-adds: a rule per common layer type, and a counter of the matrix products functions do.

A multiply-add is one multiplication of two numbers and the addition of the product to a sum:
a dot product of length k is k multiply-adds, a matrix product (n x k)(k x m) is n * m * k. Bias
additions, normalisations, activations and softmax count 0. PyTorch's ``FlopCounterMode`` counts
2 flops per multiply-add of the same products.

The rules see a module's call (its type, inputs and output); :class:`ProductCounter` sees the
torch functions a forward pass calls (``torch.matmul``, ``@``, ``F.linear``, ``einsum``,
``F.scaled_dot_product_attention``...), which is how attention written in a module's own forward
is counted. Nothing here registers a hook or knows about summaries.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .._tree import first_tensor
from ..core.compiled import eager

__all__ = ["own_macs", "has_rule", "is_torchs", "ProductCounter"]

# The module types own_macs has a rule for: the functions they call inside are theirs, not counted again.
_RULED: tuple[type[nn.Module], ...] = (
    nn.modules.conv._ConvNd, nn.Linear, nn.Bilinear, nn.MultiheadAttention, nn.RNNBase, nn.RNNCellBase,
)


def has_rule(module: nn.Module) -> bool:
    """Whether :func:`own_macs` counts this module's calls (then its inner functions are its own)."""
    return isinstance(module, _RULED)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


def _mha_macs(m: nn.MultiheadAttention, q: torch.Tensor, k: torch.Tensor) -> int:
    if q.dim() == 3:
        first, second = (1, 0) if m.batch_first else (0, 1)
        n, seq_q, seq_k = q.shape[second], q.shape[first], k.shape[first]
    else:  # unbatched (L, E)
        n, seq_q, seq_k = 1, q.shape[0], k.shape[0]
    e, a = m.embed_dim, m.num_heads * m.head_dim  # a < e once heads are removed (HeadPrunedMultiheadAttention)
    projections = seq_q * e * a + seq_k * (m.kdim + m.vdim) * a + seq_q * a * e  # q, k, v, out_proj
    attention = 2 * seq_q * seq_k * a  # Q K^T and weights @ V, all heads together
    return int(n * (projections + attention))


def _rnn_macs(m: nn.RNNBase, x: Any) -> int:
    if isinstance(x, nn.utils.rnn.PackedSequence):
        steps = x.data.shape[0]
    else:
        steps = x.shape[0] * x.shape[1] if x.dim() == 3 else x.shape[0]
    gates = {"LSTM": 4, "GRU": 3}.get(m.mode, 1)
    hidden, dirs = m.hidden_size, 2 if m.bidirectional else 1
    out = m.proj_size or hidden
    per_step = 0
    for layer in range(m.num_layers):
        n_in = m.input_size if layer == 0 else out * dirs
        per_step += gates * hidden * (n_in + out) + (hidden * m.proj_size if m.proj_size else 0)
    return steps * dirs * per_step


def own_macs(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> int:
    """Multiply-adds of one call of a layer of a common type (matrix products only; 0 for others).

    Counted: convolutions and transposed convolutions, ``Linear``, ``Bilinear``,
    ``MultiheadAttention`` (the four projections and both attention products), ``RNN``, ``LSTM``,
    ``GRU`` and their cells. Bias additions, normalisations and activations count 0.

    Example:
        >>> conv = nn.Conv2d(3, 8, 3)
        >>> x = torch.zeros(1, 3, 5, 5)
        >>> own_macs(conv, (x,), {}, conv(x))  # 8 x 3 x 3 outputs, 3 x 3 x 3 products each
        1944
    """
    out = first_tensor(output)
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        x = _arg(args, kwargs, 0, "input")  # every input element meets out_channels/groups kernels
        return int(x.numel()) * (module.out_channels // module.groups) * math.prod(module.kernel_size)
    if isinstance(module, nn.modules.conv._ConvNd) and out is not None:
        return out.numel() * (module.in_channels // module.groups) * math.prod(module.kernel_size)
    if isinstance(module, nn.Linear) and out is not None:
        return out.numel() * module.in_features
    if isinstance(module, nn.Bilinear) and out is not None:  # (x1^T A_k) then a dot with x2
        return out.numel() * (module.in1_features + 1) * module.in2_features
    if isinstance(module, nn.MultiheadAttention):
        return _mha_macs(module, _arg(args, kwargs, 0, "query"), _arg(args, kwargs, 1, "key"))
    if isinstance(module, nn.RNNBase):
        return _rnn_macs(module, _arg(args, kwargs, 0, "input"))
    if isinstance(module, nn.RNNCellBase):
        x = _arg(args, kwargs, 0, "input")
        gates = 4 if isinstance(module, nn.LSTMCell) else 3 if isinstance(module, nn.GRUCell) else 1
        batch = x.shape[0] if x.dim() == 2 else 1
        return batch * gates * module.hidden_size * (module.input_size + module.hidden_size)
    return 0


# --- functions ------------------------------------------------------------------------------------
# Each counter takes (args, kwargs, result) and returns the multiply-adds, or None when it cannot tell.
_Counter = Callable[[tuple[Any, ...], dict[str, Any], Any], "int | None"]


def _product(i: int, name: str) -> _Counter:
    """Every output element is a dot product along the last dimension of operand ``i``."""
    def count(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
        a = _arg(args, kwargs, i, name)
        return int(out.numel()) * (a.shape[-1] if a.dim() else 1)
    return count


def _rmatmul(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    return int(out.numel()) * int(args[1].shape[-1])  # b.__rmatmul__(a) is a @ b


def _addbmm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    b1, b2 = _arg(args, kwargs, 1, "batch1"), _arg(args, kwargs, 2, "batch2")
    return int(b1.numel()) * int(b2.shape[-1])  # the batch is summed: the output has no batch dimension


def _dot(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    return int(_arg(args, kwargs, 0, "input").numel())


def _bilinear(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    x1, x2 = _arg(args, kwargs, 0, "input1"), _arg(args, kwargs, 1, "input2")
    return int(out.numel()) * (int(x1.shape[-1]) + 1) * int(x2.shape[-1])  # as the nn.Bilinear rule


def _conv(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    w = _arg(args, kwargs, 1, "weight")  # (out, in / groups, *kernel)
    return int(out.numel()) * int(w.numel() // w.shape[0])


def _conv_transpose(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    x, w = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")  # w: (in, out / groups, *kernel)
    return int(x.numel()) * int(w.numel() // w.shape[0])


def _sdpa(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    q, k, v = (_arg(args, kwargs, i, n) for i, n in enumerate(("query", "key", "value")))
    # Q K^T: (..., L, E) x (..., E, S); weights @ V: (..., L, S) x (..., S, Ev); every head
    return int(q.numel() // q.shape[-1]) * int(k.shape[-2]) * int(q.shape[-1] + v.shape[-1])


def _labels(term: str, ndim: int) -> list[str]:
    """The label of each dimension of one einsum operand: its letter, or ``...k`` for the k-th
    dimension of the ellipsis counted from the right (so that broadcast ellipses line up)."""
    head, dots, tail = term.partition("...")
    if not dots:
        return list(head)
    n = ndim - len(head) - len(tail)
    return [*head, *(f"...{n - i}" for i in range(n)), *tail]


def _einsum(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int | None:
    """Output elements times the sizes of the indices the two operands contract, as torch runs it.

    One operand (a transpose, trace or sum) multiplies nothing: 0. Of two operands, an index is
    contracted when both have it, the output does not, and both sizes exceed 1: torch sums a
    broadcast (size-1) index beforehand, and with no index left to contract it multiplies element by
    element (an outer or elementwise product: no additions, 0 multiply-adds, as ``x * y`` counts 0).
    Three or more operands: ``None``, the cost depends on the order of the contractions.
    """
    equation = args[0] if args else kwargs.get("equation")
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        return None  # the sublist form
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands) or len(terms) > 2:
        return None
    if len(terms) == 1:
        return 0
    dims = [dict(zip(_labels(term, t.dim()), t.shape)) for term, t in zip(terms, operands)]
    dotted = {label for d in dims for label in d if label.startswith("...")}
    letters = [c for c in lhs if c.isalpha()]
    if arrow:
        output = set(rhs) | (dotted if "..." in rhs else set())
    else:  # implicit output: the ellipsis and the letters that occur once
        output = dotted | {c for c in letters if letters.count(c) == 1}
    contracted = [size for label, size in dims[0].items()
                  if label not in output and size > 1 and dims[1].get(label, 1) > 1]
    return int(out.numel()) * math.prod(contracted) if contracted else 0


_Ref = tuple[Any, str]  # (owner, attribute): where a torch function is found, such as (torch, "matmul")


def _entries() -> list[tuple[str, _Counter | None, tuple[_Ref, ...]]]:
    """Torch functions (and Tensor methods) that multiply matrices, by where they are found: name, counter
    (None: seen, not counted) and places."""
    T, L = torch.Tensor, torch.linalg
    counted: list[tuple[str, _Counter | None, tuple[_Ref, ...]]] = [
        ("matmul", _product(0, "input"), ((torch, "matmul"), (T, "matmul"), (T, "__matmul__"), (L, "matmul"))),
        ("matmul", _rmatmul, ((T, "__rmatmul__"),)),
        ("mm", _product(0, "input"), ((torch, "mm"), (T, "mm"))),
        ("bmm", _product(0, "input"), ((torch, "bmm"), (T, "bmm"))),
        ("mv", _product(0, "input"), ((torch, "mv"), (T, "mv"))),
        ("addmm", _product(1, "mat1"), ((torch, "addmm"), (T, "addmm"), (T, "addmm_"))),
        ("baddbmm", _product(1, "batch1"), ((torch, "baddbmm"), (T, "baddbmm"), (T, "baddbmm_"))),
        ("addmv", _product(1, "mat"), ((torch, "addmv"), (T, "addmv"), (T, "addmv_"))),
        ("addbmm", _addbmm, ((torch, "addbmm"), (T, "addbmm"), (T, "addbmm_"))),
        ("dot", _dot, ((torch, "dot"), (T, "dot"), (torch, "vdot"), (T, "vdot"))),
        ("inner", _product(0, "input"), ((torch, "inner"), (T, "inner"))),
        ("linear", _product(1, "weight"), ((F, "linear"),)),
        ("bilinear", _bilinear, ((F, "bilinear"),)),
        ("conv", _conv, ((F, "conv1d"), (F, "conv2d"), (F, "conv3d"))),
        ("conv_transpose", _conv_transpose, ((F, "conv_transpose1d"), (F, "conv_transpose2d"),
                                             (F, "conv_transpose3d"))),
        ("scaled_dot_product_attention", _sdpa, ((F, "scaled_dot_product_attention"),)),
        ("einsum", _einsum, ((torch, "einsum"),)),
    ]
    # Products whose cost depends on more than the shapes at hand, or fused layers without a module
    # rule around them: seen, so that the summary can say its count is a lower bound.
    uncounted = {
        "tensordot": ((torch, "tensordot"),),
        "chain_matmul": ((torch, "chain_matmul"), (L, "multi_dot")),
        "multi_head_attention_forward": ((F, "multi_head_attention_forward"), (torch, "_native_multi_head_attention")),
        "transformer_encoder_layer": ((torch, "_transformer_encoder_layer_fwd"),),
        "recurrent": tuple((torch, n) for n in ("lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell",
                                                "rnn_tanh_cell", "rnn_relu_cell")),
        "convolution": ((torch, "convolution"), (torch, "conv_tbc")),
    }
    return counted + [(name, None, refs) for name, refs in uncounted.items()]


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_ORIGINALS: dict[tuple[int, str], Any] = {}  # what each place held when hookscope was imported


def _native(owner: Any, attr: str) -> Any:
    """The function torch's C extension holds for a place, whatever the place holds now (None if none)."""
    if owner is torch.Tensor:
        return torch._C.TensorBase.__dict__.get(attr)
    homes = {torch: (torch._C._VariableFunctions,), F: (torch._C._nn, torch._C._VariableFunctions),
             torch.linalg: (getattr(torch._C, "_linalg", None),)}.get(owner, ())
    names = (f"linalg_{attr}",) if owner is torch.linalg else (attr,)
    return next((f for h in homes if h is not None for n in names if (f := getattr(h, n, None)) is not None), None)


def is_torchs(func: Any) -> bool:
    """Whether ``func`` is torch's own: built in, or Python code of the torch package (not another
    library's wrapper put in its place).

    Example:
        >>> is_torchs(torch.matmul), is_torchs(lambda *a: torch.matmul(*a))
        (True, False)
    """
    code = getattr(func, "__code__", None)
    if code is not None:
        return bool(os.path.abspath(code.co_filename).startswith(_TORCH_DIR))
    return type(func).__module__ in ("builtins", "torch", "torch._C") or type(func).__name__ in (
        "method_descriptor", "wrapper_descriptor", "builtin_function_or_method", "getset_descriptor")


def _place(owner: Any, attr: str) -> str:
    prefix = {torch: "torch", torch.Tensor: "Tensor", F: "F", torch.linalg: "torch.linalg"}.get(owner, "?")
    return f"{prefix}.{attr}"


def _functions() -> tuple[dict[Any, tuple[str, _Counter | None]], tuple[str, ...]]:
    """The functions to recognise now, and the places that hold a function that is not torch's.

    Each place gives what it holds now, what a ``functools.wraps`` wrapper there wraps, what it held at
    import and torch's own C function for it: whichever of them a pass calls is recognised, also when
    another library replaced the function before or after hookscope was imported.
    """
    table: dict[Any, tuple[str, _Counter | None]] = {}
    replaced: list[str] = []
    for name, count, refs in _entries():
        for owner, attr in refs:
            now = getattr(owner, attr, None)
            if now is None:
                continue
            found = [now, inspect.unwrap(now), _ORIGINALS.setdefault((id(owner), attr), now), _native(owner, attr)]
            if not is_torchs(now):
                replaced.append(_place(owner, attr))
            for f in found:
                try:
                    table[f] = (name, count)
                except TypeError:  # an unhashable callable put there: what it calls is recognised
                    pass
    return table, tuple(replaced)


_functions()  # what each place held at import


class ProductCounter(TorchFunctionMode):
    """While active, reports every matrix product a torch function computes: ``report(op, macs)``.

    ``macs`` is ``None`` for a product it cannot count (``einsum`` of three operands,
    ``tensordot``, a fused attention or recurrent kernel called outside its module). Only the
    outermost function is seen: the functions it calls run with the mode off, so ``F.linear`` inside
    ``F.multi_head_attention_forward`` is not reported again. ``replaced`` names the places (``torch.matmul``,
    ``Tensor.__matmul__``) that hold another library's function rather than torch's (torchlens wraps them
    until its ``unwrap_torch()``): what they call is still recognised, but a count cannot vouch for them.

    Example:
        >>> seen = []
        >>> with ProductCounter(lambda op, macs: seen.append((op, macs))):
        ...     _ = torch.ones(2, 3) @ torch.ones(3, 4)
        >>> seen  # 2 x 4 outputs, 3 products each
        [('matmul', 24)]
    """

    def __init__(self, report: Callable[[str, int | None], None]) -> None:
        super().__init__()
        self._report = eager(report)  # under torch.compile: called at run time, never traced
        self._functions, self.replaced = _functions()  # another library may have replaced some since import

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            known = self._functions.get(func)
        except TypeError:  # an unhashable callable: not one of ours
            known = None
        if known is not None:
            name, count = known
            macs: int | None = None
            if count is not None:
                try:
                    macs = count(args, kwargs, out)
                except (AttributeError, IndexError, KeyError, TypeError, ValueError):
                    macs = None  # arguments of an unexpected form: say so rather than guess
            self._report(name, macs)
        return out
