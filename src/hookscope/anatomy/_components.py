"""``hookscope.components`` / ``hookscope.component``: the component names of a transformers model,
resolved for its family (the table, the views, the check and the memo are ``hookscope.named``'s,
below ``selection``, so that the names work wherever a layer goes), the model seen inside its
DataParallel, DDP or ``torch.compile`` wrappers.

Must not import: analysis, ``loading``, ``capture``, ``viz``, ``report``, ``cli``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..core.inputs import model_args
from ..errors import checked
from ..named import BLOCK_NAMES, Component, Components, remembered, resolve, resolved
from ..selection import unwrap

__all__ = ["BLOCK_NAMES", "Component", "Components", "components", "component"]


@checked
def components(model: nn.Module, inputs: Any = None, *, kwargs: Mapping[str, Any] | None = None,
               check: bool = True) -> Components:
    """The component names of a transformers model, resolved for its family: which module, which
    field (input or output) and which view each name reads.

    Args:
        model: a model of a supported family (GPT-2, GPT-J, GPT-NeoX, OPT, LLaMA, Mistral, Qwen2,
            Qwen3, Gemma, Gemma2, OLMo, OLMo2, Phi-3, Phi, Falcon; BERT and RoBERTa where the words
            apply), with its head or without.
        inputs: the model's input for the check, or a tuple of several (default: a short row of token ids
            of its vocabulary).
        kwargs: keyword inputs of the model for the check.
        check: run one pass and check that the names hold what they say: the final norm and the
            unembedding of the last block's ``resid_post`` give the model's logits, each block's
            ``resid_post`` is its ``resid_pre`` plus ``attn_out`` plus ``mlp_out`` (through ``resid_mid``
            where the family has one), and the heads' ``z`` through the output projection sum to the
            attention's output (fp32: within 1e-5). A model whose layers break them is refused.

    The names are then remembered for the model (weakly: they go with it), and component names
    given as layers (``hookscope.capture(model, "blocks.3.attn.z")``) use them as this call left
    them, checked or not; where no call resolved them, the first such use runs this check on the
    model's own short input, once per model, and again only after its modules or parameter shapes
    change.

    Raises:
        SelectionError: an unsupported family (naming the closest supported one), or a model whose
            layout differs from its family's row.

    Example:
        >>> import transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
        >>> comps = hookscope.components(lm)
        >>> comps["blocks.1.attn.z"].module, comps["blocks.1.attn.z"].field
        ('transformer.h.1.attn.c_proj', 'input')
    """
    inner, wrapper = unwrap(model)  # DataParallel, DDP, torch.compile: the names keep their prefix
    comps = remembered(inner, model_args(inputs), kwargs, check)
    return comps.prefixed(wrapper) if wrapper else comps


@checked
def component(model: nn.Module, name: str, *, check: bool = True) -> Component:
    """One component name of a transformers model, resolved (:func:`components`, checked on the
    model's own short input unless ``check=False``; the check runs once per model, as for the names
    given as layers).

    Example:
        >>> import transformers, hookscope
        >>> lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
        >>> print(hookscope.component(lm, "blocks.0.attn.q").view)
        heads 2 x 16 at columns 16*h + d of 96
    """
    inner, wrapper = unwrap(model)
    comps = resolved(inner) if check else resolve(inner, check=False)  # checked: once per model
    return (comps.prefixed(wrapper) if wrapper else comps)[name]

