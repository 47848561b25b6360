"""watch names a NaN or Inf that a parent's own forward made (between two of its children) as the
parent's, with the two children; a NaN a child makes stays the child's; the model's input is told
apart; and all-finite runs cost what they did (no extra statistics pass, no extra record)."""

import math

import pytest
import torch
from helpers import no_hooks
from torch import nn

import hookscope.analysis._recorder as recorder_module
from hookscope.analysis.watch import NonFiniteError, watch


def eye(n: int = 4) -> nn.Linear:
    lin = nn.Linear(n, n)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(n))
        lin.bias.zero_()
    return lin


class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


class Parent(nn.Module):
    """``make`` runs in its own forward between ``a`` and ``b`` (or before ``a`` with first=True)."""

    def __init__(self, make=None, first: bool = False) -> None:
        super().__init__()
        self.a, self.b = eye(), eye()
        self.make, self.first = make or (lambda x: x), first

    def forward(self, x):
        if self.first:
            x = self.make(x)
        x = self.a(x)
        if not self.first:
            x = self.make(x)
        return self.b(x)


def nan(x):
    return x / 0 * 0  # 0 / 0 and +-inf * 0: NaN everywhere


def inf(x):
    return x * float("inf")  # +-inf where x != 0, NaN where x == 0


X = torch.tensor([[1.0, -2.0, 3.0, -4.0]])


def culprit_of(net, x=X, **kw):
    with watch(net, **kw) as w:
        net(x)
    assert no_hooks(net)
    return w


# --- the parent's own forward ---------------------------------------------------------------------
@pytest.mark.parametrize("keep", [("output", "grads"), "output", "all"])
def test_a_nan_made_between_two_children_is_the_parents(keep):
    net = nn.Sequential(eye(), Parent(nan), nn.ReLU())
    w = culprit_of(net, keep=keep)
    c = w.culprit
    assert (c.module, c.call, c.phase, c.which, c.path) == ("1", 0, "forward", "own_forward", "1.b input[0]")
    assert (c.nan, c.inf, c.numel, c.shape) == (4, 0, 4, (1, 4))
    assert c.describe() == ("appeared in '1' (Parent)'s own forward, between '1.a' (finite output) and '1.b' "
                            "(received NaN input): 4 NaN, 0 Inf of 4 values")
    assert w.table().splitlines()[0] == "first non-finite value: " + c.describe()
    assert [(r.module, r.which) for r in w.before if r.which == "output"] == [("0", "output"), ("1.a", "output")]
    assert all(r.finite for r in w.before) and not w.finite


def test_inf_and_nan_are_named_and_raise_on_nonfinite_raises_at_the_parent():
    net = nn.Sequential(eye(), Parent(inf))
    x = torch.tensor([[1.0, 0.0, 3.0, -4.0]])
    c = culprit_of(net, x).culprit
    assert (c.module, c.nan, c.inf) == ("1", 1, 3)
    assert "and '1.b' (received NaN and Inf input)" in c.describe()
    with pytest.raises(NonFiniteError) as info:
        with watch(net, raise_on_nonfinite=True):
            net(x)
    assert info.value.row.module == "1" and info.value.row.which == "own_forward"
    assert str(info.value).startswith("first non-finite value: appeared in '1' (Parent)'s own forward, between")
    assert no_hooks(net)


def test_a_nan_made_before_the_first_child():
    net = nn.Sequential(eye(), Parent(nan, first=True))
    c = culprit_of(net).culprit
    assert (c.module, c.path) == ("1", "1.a input[0]")
    assert c.describe() == ("appeared in '1' (Parent)'s own forward, before its first child '1.a' "
                            "(received NaN input): 4 NaN, 0 Inf of 4 values")


class Root(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = eye(), eye()

    def forward(self, x):
        return self.b(self.a(x) - math.inf)


def test_the_models_own_forward():
    c = culprit_of(Root()).culprit
    assert (c.module, c.which, c.inf, c.nan) == ("", "own_forward", 4, 0)
    assert c.describe() == ("appeared in the model's own forward (Root), between 'a' (finite output) and 'b' "
                            "(received Inf input): 0 NaN, 4 Inf of 4 values")


# --- nested parents: the innermost whose code made it ----------------------------------------------------
class Outer(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.inner = Parent(nan if where == "inner" else None)
        self.c = eye()
        self.where = where

    def forward(self, x):
        if self.where == "outer first":
            x = nan(x)
        x = self.inner(x)
        if self.where == "outer":
            x = nan(x)
        return self.c(x)


@pytest.mark.parametrize("where, module, words", [
    ("inner", "1.inner", "'1.inner' (Parent)'s own forward, between '1.inner.a' (finite output) and '1.inner.b'"),
    ("outer", "1", "'1' (Outer)'s own forward, between '1.inner' (finite output) and '1.c'"),
    ("outer first", "1", "'1' (Outer)'s own forward, before its first child '1.inner'"),
])
def test_nested_parents_name_the_innermost_whose_code_made_it(where, module, words):
    net = nn.Sequential(eye(), Outer(where), eye())
    for keep in (("output", "grads"), "all"):
        c = culprit_of(net, keep=keep).culprit
        assert c.module == module and c.which == "own_forward"
        assert c.describe() == f"appeared in {words} (received NaN input): 4 NaN, 0 Inf of 4 values"


# --- what is not the parent's ----------------------------------------------------------------------------
def test_a_nan_a_child_makes_is_still_the_childs():
    class LogParent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.log, self.b = eye(), Log(), eye()

        def forward(self, x):
            return self.b(self.log(self.a(x) * 1.0))  # own code between a and log: finite

    net = nn.Sequential(eye(), LogParent())
    for keep in (("output", "grads"), "all"):
        c = culprit_of(net, keep=keep).culprit  # log(-2), log(-4): NaN
        assert (c.module, c.which, c.nan) == ("1.log", "output", 2)
        assert c.describe() == "'1.log' call 0, forward output output 1x4: 2 NaN, 0 Inf of 4 values"


def test_a_non_finite_model_input_is_told_apart_as_before():
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = eye()

        def forward(self, x):
            return self.a(x.flatten(1))  # the model's code reshapes its own NaN input

    bad = torch.tensor([[[1.0, math.nan], [3.0, 4.0]]])
    for net in (nn.Sequential(eye(), eye()), Flat()):
        x = bad.flatten(1) if isinstance(net, nn.Sequential) else bad
        c = culprit_of(net, x).culprit
        assert (c.module, c.which) == ("0" if isinstance(net, nn.Sequential) else "a", "output")
        assert c.index == 0  # the check of the model's input is no record of its own
        c = culprit_of(net, x, keep="all").culprit
        assert c.which == "input" and c.module in ("0", "a")


def test_integer_inputs_are_not_checked_and_half_precision_sums_do_not_overflow():
    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.lin = nn.Embedding(10, 4), eye()

        def forward(self, ids):
            return self.lin(self.emb(ids + 1).to(torch.bfloat16).float() * 3e4)  # finite, large

    net = Embed()
    with torch.no_grad():
        net.emb.weight.fill_(2.0)  # 8 x 6e4 in bfloat16 sums beyond float16's 65504, still finite
    w = culprit_of(net, torch.tensor([[1, 2]]))
    assert w.finite and w.checked == 2


# --- all finite: nothing more is computed ---------------------------------------------------------------
def test_all_finite_takes_no_extra_statistics_and_no_extra_records(monkeypatch):
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.relu = eye(), nn.ReLU()

        def forward(self, x):
            out = self.a(x)
            out += x  # in place: the relu receives a tensor no watched call output
            return self.relu(out.view(-1, 4))

    calls = []
    real = recorder_module.tensor_stats
    monkeypatch.setattr(recorder_module, "tensor_stats", lambda t, s=None: calls.append(1) or real(t, s))
    net = nn.Sequential(Residual(), Residual())
    w = culprit_of(net)
    # records: a, relu and the block, twice; statistics: a and relu twice (a block's output is its
    # relu's, already taken); none of what the relus received, which the blocks' own code made
    assert w.finite and w.checked == 6 and len(calls) == 4
    assert all(r.which == "output" for r in w.rows)
    assert w.table() == "all finite: 6 outputs and gradients checked, no NaN and no Inf"


# --- with selectors: a module not watched may have made it ----------------------------------------------
class Gap(nn.Module):
    """``a``, then ``mid`` (made NaN here, a module that may be left unwatched), then ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.mid, self.b = eye(), Parent(nan), eye()

    def forward(self, x):
        return self.b(self.mid(self.a(x)))


def test_with_selectors_a_nan_made_in_an_unwatched_module_names_no_module():
    net = Gap()
    with watch(net, nn.Linear) as w:  # the Linears only: mid (Parent) is not watched
        net(X)
    c = w.culprit
    assert no_hooks(net)
    # the NaN came from mid's own code, between 'mid.a' and 'mid.b': mid is not watched, so no
    # module is named as its maker; the model ("") only holds it
    assert (c.module, c.which, c.path, c.nan) == ("", "unwatched", "mid.b input[0]", 4)
    assert c.describe() == (
        "appeared outside the watched modules, between 'mid.a' (finite output) and 'mid.b' (received NaN input): "
        "in the forward of the model or of a module in it that is not watched (watch without selectors to "
        "name it): 4 NaN, 0 Inf of 4 values")
    # watched without selectors, it is named: mid's own forward
    c = culprit_of(net).culprit
    assert (c.module, c.which) == ("mid", "own_forward")
    # every child of the watched parent watched: the parent's own forward, as without selectors
    with watch(net, "mid", "mid.a", "mid.b") as w:
        net(X)
    assert (w.culprit.module, w.culprit.which) == ("mid", "own_forward")


def test_tiny_llama_eager_attention_overflow_is_not_blamed_on_the_model():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    ll = transformers.LlamaForCausalLM(config).eval()
    attn = ll.model.layers[1].self_attn
    with torch.no_grad():  # scores overflow, softmax makes NaN: in LlamaAttention's own code
        attn.q_proj.weight.mul_(1e20)
        attn.k_proj.weight.mul_(1e20)
    ids = torch.randint(0, 100, (1, 6))
    with watch(ll, nn.Linear) as w:
        ll(ids)
    c = w.culprit
    assert (c.module, c.which, c.nan) == ("", "unwatched", 112)
    assert c.describe().startswith("appeared outside the watched modules, between 'model.layers.1.self_attn.v_proj' "
                                   "(finite output) and 'model.layers.1.self_attn.o_proj' (received NaN input)")
    assert "the model's own forward" not in c.describe()
    with watch(ll) as w:
        ll(ids)
    assert (w.culprit.module, w.culprit.which) == ("model.layers.1.self_attn", "own_forward")
    assert no_hooks(ll)


# --- a non-finite model input counts for its own forward pass only ---------------------------------------
class Cleans(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = eye(), eye()

    def forward(self, x, bad=False):
        h = self.a(torch.nan_to_num(x))  # missing values in the data are allowed and cleaned
        return self.b(nan(h) if bad else h)


def test_a_cleaned_nan_input_does_not_excuse_a_later_forwards_own_nan():
    net = Cleans()
    with watch(net) as w:
        net(torch.tensor([[math.nan, 1.0, 2.0, 3.0]]))  # all outputs finite
        net(X, bad=True)  # the model's own code makes NaN
    c = w.culprit
    assert (c.module, c.call, c.which, c.path, c.nan) == ("", 1, "own_forward", "b input[0]", 4)
    assert c.describe().startswith("appeared in the model's own forward (Cleans), between 'a' (finite output) "
                                   "and 'b' (received NaN input)")
    # within the forward whose input held the NaN, it is still the input's
    with watch(net) as w:
        net(torch.tensor([[math.nan, 1.0, 2.0, 3.0]]), bad=True)
    assert (w.culprit.module, w.culprit.which) == ("b", "output")
    assert no_hooks(net)


# --- torch.inference_mode ----------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [None, nan])
def test_watch_under_inference_mode(make):
    net = nn.Sequential(eye(), Parent(make), nn.ReLU())
    with torch.inference_mode():
        x = X.clone()  # an inference tensor: it has no version counter
        with watch(net) as w:
            net(x)
            net(x)
    assert no_hooks(net)
    if make is None:
        assert w.finite and w.checked == 10  # 5 outputs (0, 1.a, 1.b, 1, 2), twice
    else:
        c = w.culprit
        assert (c.module, c.call, c.which, c.nan) == ("1", 0, "own_forward", 4)
