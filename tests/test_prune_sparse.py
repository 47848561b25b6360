"""2:4 weights exported to semi-structured sparse tensors: the layout found exactly where every group of 4
inputs holds 2 zeros (masks applied), and on the CPU, where no such kernel exists, a one-line refusal with
the model untouched. The CUDA conversion itself runs only where a GPU is (skipped here otherwise)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookscope
from hookscope.analysis.prune import semi_structured_layers
from hookscope.core import hook_count


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 6))


def test_the_layout_is_found_on_the_masked_weights_group_by_group():
    net = _mlp()
    hookscope.prune(net, method="wanda", data=torch.randn(32, 64), n_m=(2, 4))
    assert semi_structured_layers(net) == ["0", "2", "4"]
    with torch.no_grad():  # one group of one row with a single zero: that layer is no longer 2:4
        net[2].weight_mask[5, 8:12] = torch.tensor([0.0, 1.0, 1.0, 1.0])
    assert semi_structured_layers(net) == ["0", "4"]
    dense = _mlp()
    with torch.no_grad():
        dense[4].weight.copy_(torch.tensor([0.0, 0.0, 1.0, 2.0]).repeat(6, 8))  # zeros by hand, no mask
    assert semi_structured_layers(dense) == ["4"]


def test_on_the_cpu_the_export_is_refused_saying_there_is_no_speedup():
    net = _mlp()
    hookscope.prune(net, method="sparsegpt", data=torch.randn(32, 64), n_m=(2, 4))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(hookscope.HookscopeError, match="3 linear layers are 2:4, but '0' is on cpu") as e:
        hookscope.to_semi_structured(net)
    assert "no speedup" in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items()) and hook_count(net) == 3


def test_a_model_with_no_2_4_weight_is_refused():
    net = _mlp()
    hookscope.prune(net, method="wanda", data=torch.randn(32, 64), sparsity=0.5)
    with pytest.raises(hookscope.HookscopeError, match="no nn.Linear weight of Sequential is 2:4 sparse"):
        hookscope.to_semi_structured(net)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
                    reason="semi-structured sparse kernels need a CUDA GPU of compute capability 8.0+")
def test_on_a_gpu_the_weights_become_semi_structured_and_the_outputs_stay():
    net = _mlp().cuda().half()
    hookscope.prune(net, method="wanda", data=torch.randn(32, 64, device="cuda", dtype=torch.half), n_m=(2, 4))
    x = torch.randn(128, 64, device="cuda", dtype=torch.half)
    with torch.no_grad():
        want = net(x)
    # the last layer (6 x 32) is below the kernels' smallest shape: leave it dense
    with pytest.raises(hookscope.HookscopeError, match="multiples of 32 x 64"):
        hookscope.to_semi_structured(net)
    hookscope.remove_masks(net, "4")
    with torch.no_grad():
        net[4].weight[0, 0:4] = torch.tensor([1.0, 1.0, 1.0, 1.0], device="cuda")  # no longer 2:4
    want = net(x).detach()
    assert hookscope.to_semi_structured(net) == ["0", "2"]
    assert type(net[0].weight).__name__.startswith("SparseSemiStructuredTensor")
    with torch.no_grad():
        assert (net(x) - want).abs().max() <= 1e-2
