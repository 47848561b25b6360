"""Every CAM method at the edges: batches with a target per sample, train mode, in-place ops after the layer,
channels-last, float64 / bfloat16 models, DataParallel; each map compared with the same method run another way."""

import copy
import warnings

import pytest
import torch
from conftest import no_hooks
from torch import nn

from hookscope.analysis.cam import METHODS, cam

ALL = [m for m in METHODS if m != "cam"]  # "cam" needs the pooled head's layer: tested in test_cam.py
SEED = {"randomcam": {"seed": 1}}


def net_2d(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(inplace=True),
                        nn.Conv2d(6, 5, 3, padding=1), nn.ReLU(inplace=True), nn.Dropout(0.3),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 4))
    with torch.no_grad():  # running statistics that are not the identity
        net[1].running_mean.normal_()
        net[1].running_var.uniform_(0.5, 2.0)
    return net


def run(net, x, method, target, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cam(net, x, layers=None if method == "fullgrad" else "3", method=method, target=target,
                   **SEED.get(method, {}), **kw)


@pytest.mark.parametrize("method", ALL)
def test_a_batch_with_a_target_per_sample_equals_each_sample_alone_and_train_mode_is_left_as_it_was(method):
    net, x, targets = net_2d().train(), torch.randn(3, 3, 8, 8), [0, 2, 3]
    state = copy.deepcopy(net.state_dict())
    res = run(net, x, method, targets)
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())  # BN's running stats untouched
    assert all(m.training for m in net.modules())
    alone = torch.cat([run(net, x[b:b + 1], method, targets[b]).maps for b in range(3)])
    assert torch.allclose(res.maps, alone, atol=1e-5)
    assert res.targets.tolist() == targets and no_hooks(net)


@pytest.mark.parametrize("method", ALL)
def test_channels_last_float64_bfloat16_and_dataparallel_give_the_float32_maps(method):
    net, x = net_2d().eval(), torch.randn(2, 3, 8, 8)
    want = run(net, x, method, [1, 2]).maps
    got = run(net, x.to(memory_format=torch.channels_last), method, [1, 2]).maps
    assert torch.allclose(got, want, atol=1e-5)
    wide = copy.deepcopy(net).double()
    got = run(wide, x.double(), method, [1, 2]).maps
    assert got.dtype == torch.float64 and torch.allclose(got.float(), want, atol=1e-5)
    low = copy.deepcopy(net).to(torch.bfloat16)
    got = run(low, x.to(torch.bfloat16), method, [1, 2]).maps
    assert got.dtype == torch.float32 and (got - want).abs().max() < 0.1  # bf16 keeps ~3 significant digits
    wrapped = nn.DataParallel(net)
    kw = {} if method == "fullgrad" else {"layers": "module.3"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = cam(wrapped, x, method=method, target=[1, 2], **SEED.get(method, {}), **kw).maps
    assert torch.equal(got, want)
    assert no_hooks(net) and no_hooks(wide) and no_hooks(low)


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.h = nn.Conv2d(3, 3, 3, padding=1), nn.Linear(3, 2)

    def forward(self, x):
        return self.h(self.c(torch.relu(self.c(x))).mean((2, 3)))


@pytest.mark.parametrize("method", ALL)
def test_a_layer_called_twice_is_refused_in_one_line_also_by_fullgrad(method):
    torch.manual_seed(0)
    net = Twice().eval()
    with pytest.raises(Exception) as e:
        cam(net, torch.randn(2, 3, 6, 6), layers=None if method == "fullgrad" else "c", method=method,
            **SEED.get(method, {}))
    assert "'c' ran 2 times" in str(e.value) and "\n" not in str(e.value)
    assert no_hooks(net)
