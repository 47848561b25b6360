import pytest
import torch

import hookscope
from hookscope import HookscopeError, RecordError


def graph():
    w = torch.tensor([1.0], requires_grad=True)
    x = torch.tensor([2.0], requires_grad=True)
    a = w + x
    b = w + 1
    y = a * b
    return w, x, a, b, y


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_story1_gradient_through_an_intermediate_tensor():
    w, x, a, b, y = graph()
    with hookscope.grads(a=a, b=b) as g:
        y.backward()
    assert g["a"].grad.item() == 2.0 and g["b"].grad.item() == 3.0
    assert w.grad.item() == 5.0 and x.grad.item() == 2.0 and a.grad is None  # nothing else changed
    x2 = torch.tensor([1.0, 3.0], requires_grad=True)
    y2 = x2 * 2
    with hookscope.grads(y2) as g:
        y2.mean().backward()
    assert g["0"].grad.tolist() == [0.5, 0.5]


def test_story2_change_a_gradient_and_know_it_changed():
    w, x, a, b, y = graph()

    def double_then_triple(grad):
        grad.mul_(2)
        return grad * 3

    with hookscope.grads(w=w, fn=double_then_triple) as g:
        y.backward()
    assert w.grad.item() == 30.0
    rec = g["w"]
    assert rec.changed and rec.original.item() == 5.0 and rec.grad.item() == 30.0


def test_observing_fn_is_not_a_change():
    w, x, a, b, y = graph()
    seen = []
    with hookscope.grads(a=a, fn=lambda grad: seen.append(grad.item())) as g:
        y.backward()
    assert seen == [2.0] and not g["a"].changed and w.grad.item() == 5.0


def test_per_tensor_functions_clip_zero_replace():
    w, x, a, b, y = graph()
    fns = {"a": lambda grad: grad.clamp(max=1.0), "b": lambda grad: torch.zeros_like(grad)}
    with hookscope.grads(a=a, b=b, fn=fns) as g:
        y.backward()
    assert g["a"].grad.item() == 1.0 and g["b"].grad.item() == 0.0
    assert w.grad.item() == 1.0 and x.grad.item() == 1.0


def test_hooks_are_gone_after_the_block():
    w, x, a, b, y = graph()
    with hookscope.grads(a=a, fn=lambda grad: grad * 100):
        pass
    y.backward()
    assert w.grad.item() == 5.0


def test_bad_input_is_explained():
    with pytest.raises(HookscopeError, match="does not require grad"):
        hookscope.grads(t=torch.ones(2))
    with pytest.raises(HookscopeError, match="not a tensor"):
        hookscope.grads(t=[1.0])
    w, x, a, b, y = graph()
    with pytest.raises(HookscopeError, match="'c', which is not watched"):
        hookscope.grads(a=a, fn={"c": lambda g: g})
    with hookscope.grads(a=a) as g:
        pass
    with pytest.raises(RecordError, match="no gradient reached 'a'"):
        g["a"].grad
    with pytest.raises(RecordError, match="no watched tensor 'z' in this result"):
        g["z"]


def test_grads_copy_defaults_to_auto_and_never_copies_not_even_a_views_gradient():
    import inspect
    from hookscope import MutationError
    assert inspect.signature(hookscope.grads).parameters["copy"].default == "auto"
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    a = w.view(2, 2)
    with hookscope.grads(a=a, copy="never") as g:
        (a * 2).sum().backward(retain_graph=True)  # w.grad adopts this gradient's memory...
        (a * 3).sum().backward()  # ...and accumulates into it: the uncopied record is gone, and says so
    with pytest.raises(MutationError, match="copy='always'"):
        g["a"].grads
    assert w.grad.tolist() == [5.0] * 4
