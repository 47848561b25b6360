"""The check behind the component names: one short pass of the model, every named site read back, and
the identities a transformer's stream obeys recomputed from them (the logits from the last block's
``resid_post``, each block's residual sum, the heads' outputs through the output projection, and where
eager attention gives the pattern, ``z`` as the pattern applied to ``v``). A model whose layout differs
from its family's row breaks one of them and is refused in one line.

Must not import: ``selection``, capture, edit, analysis, ``anatomy``, ``loading``, ``viz``, ``report``, ``cli``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..core.hooks import HookGroup
from ..core.state import restored
from ..core.text import first_line
from ..errors import ForwardError, HookscopeError, SelectionError
from ._families import Family
from ._views import first_argument

if TYPE_CHECKING:
    from ._table import Component

__all__ = ["verify"]

Check = tuple[str, str, torch.Tensor, torch.Tensor]  # (kind, what, computed, read back)


def _kept(value: Any) -> Any:
    """A copy of what a hook saw: the model may change it in place later (Falcon adds the attention's
    output into the MLP's, in place)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return tuple(v.detach().clone() if isinstance(v, torch.Tensor) else v for v in value)
    return value


def _own_input(model: nn.Module, config: Any) -> torch.Tensor:
    """A short batch of token ids of the model's vocabulary, on its device."""
    device = next(iter(model.parameters()), torch.zeros(0)).device
    vocab = int(getattr(config, "vocab_size", 0) or 2)
    return (torch.arange(10, device=device).reshape(2, 5) * 7 + 1) % vocab


def _record(model: nn.Module, sites: Sequence[tuple[str, str]], inputs: Sequence[Any],
            kwargs: Mapping[str, Any]) -> tuple[dict[tuple[str, str], Any], Any]:
    """What each (module, field) held on one pass in eval mode, and the model's output."""
    modules = dict(model.named_modules())
    seen: dict[tuple[str, str], Any] = {}
    calls: dict[tuple[str, str], int] = {}
    group = HookGroup()

    def keep(key: tuple[str, str], value: Any) -> None:
        calls[key] = calls.get(key, 0) + 1
        seen.setdefault(key, _kept(value))

    try:
        for name, field in sites:
            key = (name, field)
            if field == "input":
                # own hook: the check reads its sites on its own short pass; this package stands below capture
                group.add(modules[name].register_forward_pre_hook(
                    lambda m, a, kw, key=key: keep(key, first_argument(m, a, kw)), with_kwargs=True))
            else:
                # own hook: as above, the output of each site
                group.add(modules[name].register_forward_hook(lambda m, a, out, key=key: keep(key, out)))
        with torch.no_grad(), restored(model, train=False):
            out = model(*inputs, **kwargs)
    except HookscopeError:
        raise
    except Exception as e:
        raise ForwardError(f"the component check's pass of {type(model).__name__} failed: {type(e).__name__}: "
                           f"{first_line(e)}; hand components() an input the model takes, or check=False") from e
    finally:
        group.remove()
    twice = [f"{n} ({f}, {c} times)" for (n, f), c in calls.items() if c > 1]
    unseen = [f"{n} ({f})" for n, f in sites if (n, f) not in seen]
    if twice or unseen:
        why = f"ran more than once: {', '.join(twice)}" if twice else f"never ran: {', '.join(unseen)}"
        raise SelectionError(f"on one pass of {type(model).__name__}, a module its component names read {why}; "
                             "its layout differs from the table")
    return seen, out


def _per_head(proj: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Sum over heads of ``z[..., h, :] @ W_O[h]``, plus the projection's bias."""
    weight = getattr(proj, "weight", None)
    heads, d_head = z.shape[-2:]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or heads * d_head not in weight.shape:
        raise SelectionError(f"the output projection {type(proj).__name__} has no [{heads * d_head}, out] weight to "
                             "split into heads: its layout differs from the table")
    w_in_out = weight.t() if isinstance(proj, nn.Linear) else weight  # transformers' Conv1D keeps [in, out]
    out = torch.einsum("...hd,hdo->...o", z.double(), w_in_out.double().reshape(heads, d_head, -1))
    bias = getattr(proj, "bias", None)
    return out + bias.double() if isinstance(bias, torch.Tensor) else out


def _heads_agree(model: nn.Module, rows: Mapping[str, Component], blocks: Sequence[int]) -> None:
    """The heads the views take apart are the ones each attention module computes with (a config
    changed after the model was built, or a pruned model, says otherwise: the sums over heads would
    not notice)."""
    modules = dict(model.named_modules())
    for i in blocks:
        attn, q = modules[rows[f"blocks.{i}.attn.pattern"].module], rows[f"blocks.{i}.attn.z"].view
        said = {"d_head": (q.d_head, ("head_dim", "head_size", "attention_head_size")),
                "heads": (q.heads, ("num_heads", "num_attention_heads"))}
        for what, (ours, attributes) in said.items():
            theirs = next((a for a in (getattr(attn, n, None) for n in attributes) if isinstance(a, int)), ours)
            if theirs != ours:
                raise SelectionError(f"blocks.{i}: the config says {what} {ours}, the attention module "
                                     f"{type(attn).__name__} computes with {theirs}: its layout differs from the "
                                     "table (a config changed after the model was built?)")


def _pattern_checks(v: Mapping[str, Any], block: str) -> Iterator[Check]:
    pattern = v.get(f"{block}.attn.pattern")
    if isinstance(pattern, torch.Tensor) and f"{block}.attn.v" in v:
        values, z = v[f"{block}.attn.v"], v[f"{block}.attn.z"]
        if pattern.dim() != 4 or pattern.shape[1] != z.shape[-2] or z.shape[-2] % values.shape[-2]:
            raise SelectionError(f"{block}.attn.pattern has shape {tuple(pattern.shape)} where the row expects "
                                 f"[batch, {z.shape[-2]} heads, pos, pos]: its layout differs from the table")
        values = values.repeat_interleave(z.shape[-2] // values.shape[-2], dim=-2)
        mixed = torch.einsum("bhqk,bkhd->bqhd", pattern.double(), values.double())
        yield "pattern", f"{block}.attn.z != pattern @ v", mixed, z


def _block_checks(model: nn.Module, family: Family, v: Mapping[str, Any], seen: Mapping[tuple[str, str], Any],
                  rows: Mapping[str, Component], i: int) -> Iterator[Check]:
    b = f"blocks.{i}"
    pre, attn, mlp, post = (v[f"{b}.{n}"].double() for n in ("resid_pre", "attn_out", "mlp_out", "resid_post"))
    if family.flat_mlp:  # OPT: [batch * pos, d] from the stream between attention and the MLP on
        mlp = mlp.reshape(pre.shape)
    if family.form == "parallel":
        yield "residual", f"{b}.resid_post != resid_pre + attn_out + mlp_out", pre + attn + mlp, post
    elif family.form == "sequential":
        mid = v[f"{b}.resid_mid"].double()
        mid = mid.reshape(pre.shape) if family.flat_mlp else mid
        yield "residual", f"{b}.resid_mid != resid_pre + attn_out", pre + attn, mid
        yield "residual", f"{b}.resid_post != resid_mid + mlp_out", mid + mlp, post
    else:
        block = dict(model.named_modules())[rows[f"{b}.resid_pre"].module]
        first, second = (block.get_submodule(n) for n in family.post_norms)
        mid = v[f"{b}.resid_mid"]
        yield "residual", f"{b}.resid_mid != norm(resid_pre + attn_out)", first(v[f"{b}.resid_pre"] + v[f"{b}.attn_out"]), mid
        yield "residual", f"{b}.resid_post != norm(resid_mid + mlp_out)", second(mid + v[f"{b}.mlp_out"]), v[f"{b}.resid_post"]
    proj = rows[f"{b}.attn.z"].module  # z is the output projection's input
    out = seen[(proj, "output")]
    yield "heads", f"{b}: the heads' z through the output projection != its output", \
        _per_head(dict(model.named_modules())[proj], v[f"{b}.attn.z"]), out if isinstance(out, torch.Tensor) else out[0]
    yield from _pattern_checks(v, b)


def _logits(model: nn.Module, family: Family, config: Any, v: Mapping[str, Any], out: Any,
            rows: Mapping[str, Component], last: str) -> Iterator[Check]:
    modules = dict(model.named_modules())
    stream = v[last]
    if "final_norm" in rows:
        stream = modules[rows["final_norm"].module](stream)
    if "unembed" not in rows:
        hidden = getattr(out, "last_hidden_state", None)
        hidden = hidden if isinstance(hidden, torch.Tensor) else out[0]
        yield "logits", f"final_norm({last}) != the model's last hidden state", stream, hidden
        return
    if family.form == "post_norm":  # an MLM head: its dense, activation and norm, then the decoder
        logits = modules[rows["unembed"].module.rsplit(".", 1)[0]](stream)
    else:
        logits = modules[rows["unembed"].module](stream)
    cap = getattr(config, family.logit_cap, None) if family.logit_cap else None
    if cap:
        logits, v_unembed = torch.tanh(logits / cap) * cap, torch.tanh(v["unembed"] / cap) * cap
    else:
        v_unembed = v["unembed"]
    want = getattr(out, "logits", None)
    want = want if isinstance(want, torch.Tensor) else out[0]
    yield "logits", f"unembed(final_norm({last})) != the model's logits", logits, want
    yield "logits", "unembed != the model's logits", v_unembed, want


def _tolerance(want: torch.Tensor, dtype: torch.dtype) -> float:
    """1e-5 in fp32 (and fp64), a few roundings of the model's dtype below that, both relative past 1."""
    scale = max(1.0, float(want.detach().abs().max())) if want.numel() else 1.0
    eps = 1e-5 if dtype in (torch.float32, torch.float64) else 8 * torch.finfo(dtype).eps
    return eps * scale


def verify(model: nn.Module, family: Family, config: Any, rows: Sequence[Component], inputs: Sequence[Any],
           kwargs: Mapping[str, Any] | None) -> dict[str, float]:
    """Check ``rows`` on one pass of ``model`` (its own short input where ``inputs`` is empty): the largest
    error of each kind of identity, or the one-line refusal naming the first that fails."""
    by_name = {r.name: r for r in rows}
    blocks = sorted({int(n.split(".")[1]) for n in by_name if n.startswith("blocks.")})
    outs = [(by_name[f"blocks.{i}.attn.z"].module, "output") for i in blocks]
    sites = list(dict.fromkeys([(r.module, r.field) for r in rows] + outs))
    _heads_agree(model, by_name, blocks)
    if any(p.is_meta for p in model.parameters()):
        raise HookscopeError(f"{type(model).__name__} has its parameters on the meta device: there is nothing to "
                             "check the component names against; load its weights, or pass check=False")
    kwargs = dict(kwargs or {})
    own = not inputs and not {"input_ids", "inputs_embeds"} & set(kwargs)  # the caller's ids, where given by keyword
    seen, out = _record(model, sites, (_own_input(model, config),) if own else inputs, kwargs)
    values: dict[str, Any] = {}
    for r in rows:
        try:
            values[r.name] = r.view.read(seen[(r.module, r.field)])
        except SelectionError:
            if not r.name.endswith(".attn.pattern"):  # sdpa gives no pattern: only eager attention does
                raise
    try:
        with torch.no_grad():
            checks = _checks(model, family, config, values, seen, out, by_name, blocks)
    except RuntimeError as e:  # tensors that do not even combine: a layout the row does not describe
        raise SelectionError(f"the {family.name} row's components of this {type(model).__name__} do not fit "
                             f"together ({first_line(e)}): its layout differs from the table") from e
    return _measure(model, family, checks, values["blocks.0.resid_pre"].dtype)


def _checks(model: nn.Module, family: Family, config: Any, values: Mapping[str, Any],
            seen: Mapping[tuple[str, str], Any], out: Any, by_name: Mapping[str, Component],
            blocks: Sequence[int]) -> list[Check]:
    checks: list[Check] = []
    if family.form != "post_norm":
        embedded = values["embed"]
        if "pos_embed" in values and values["pos_embed"].shape[-1:] == embedded.shape[-1:]:
            embedded = embedded + values["pos_embed"]
        checks.append(("embed", "embed (+ pos_embed) != blocks.0.resid_pre", embedded, values["blocks.0.resid_pre"]))
    checks += [("stream", f"blocks.{i}.resid_post != blocks.{i + 1}.resid_pre", values[f"blocks.{i}.resid_post"],
                values[f"blocks.{i + 1}.resid_pre"]) for i in blocks[:-1]]
    for i in blocks:
        checks += _block_checks(model, family, values, seen, by_name, i)
    return checks + list(_logits(model, family, config, values, out, by_name, f"blocks.{blocks[-1]}.resid_post"))


def _measure(model: nn.Module, family: Family, checks: Sequence[Check], dtype: torch.dtype) -> dict[str, float]:
    errors: dict[str, float] = {}
    for kind, what, got, want in checks:
        if got.shape != want.shape:
            raise SelectionError(f"this {type(model).__name__} does not match hookscope's {family.name} row: {what} "
                                 f"(shapes {tuple(got.shape)} and {tuple(want.shape)}): its layout differs from the "
                                 "table, so its component names would read the wrong tensors")
        err = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
        if not err <= _tolerance(want, dtype):
            raise SelectionError(f"this {type(model).__name__} does not match hookscope's {family.name} row: {what} "
                                 f"(largest error {err:.2e}): its layout differs from the table, so its component "
                                 "names would read the wrong tensors")
        errors[kind] = max(errors.get(kind, 0.0), err)
    return errors
