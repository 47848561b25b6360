"""Small models built in code (no downloads), for the demo, the docs and the tests.

:class:`DemoNet` is the one trained model: :func:`demo_model` loads its weights, shipped inside the
package, trained by ``scripts/train_demo.py`` on :func:`hookscope.synthetic.shapes`.
"""

from __future__ import annotations

from importlib import resources

import torch
from torch import nn

from .errors import HookscopeError
from .synthetic import CLASSES

__all__ = ["TinyResNet", "DemoNet", "DEMO_CLASSES", "demo_model"]

DEMO_CLASSES: tuple[str, ...] = CLASSES


class Block(nn.Module):
    """A residual block with the two classic in-place traps: ``out += identity`` and ``ReLU(inplace=True)``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        y: torch.Tensor = self.relu(out)
        return y


class TinyResNet(nn.Module):
    """A 3x32x32 classifier shaped like torchvision's ResNet, small enough to run anywhere.

    Example:
        >>> TinyResNet()(torch.zeros(1, 3, 32, 32)).shape
        torch.Size([1, 10])
    """

    def __init__(self, num_classes: int = 10, width: int = 16, seed: int | None = 0) -> None:
        super().__init__()
        # a seed must not reset the caller's global generator: draw the weights from a forked one
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            self.stem = nn.Sequential(
                nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
            )
            self.layer1 = nn.Sequential(Block(width), Block(width))
            self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
            self.layer2 = nn.Sequential(Block(2 * width))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2 * width, num_classes)
            for m in self.modules():  # as if trained a little: batch norms that do something
                if isinstance(m, nn.BatchNorm2d) and m.running_mean is not None and m.running_var is not None:
                    nn.init.uniform_(m.weight, 0.5, 1.5)
                    nn.init.normal_(m.bias, 0.0, 0.2)
                    m.running_mean.normal_(0.0, 0.2)
                    m.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.down(self.layer1(self.stem(x))))
        logits: torch.Tensor = self.fc(torch.flatten(self.pool(x), 1))
        return logits


def _conv(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True)]


class DemoNet(nn.Module):
    """The demo classifier: tells the shapes of :func:`hookscope.synthetic.shapes` apart.

    Takes ``B x 3 x 64 x 64`` pictures in [0, 1] as they are (no normalisation) and returns
    ``B x len(DEMO_CLASSES)`` logits. Plain conv / batch norm / in-place ReLU stages, then a global
    average pool and one linear layer, so plain CAM applies to ``layer3`` (16 x 16 maps, the
    last convolution is inside it). Children: ``stem`` (64 x 64), ``layer1`` (32 x 32), ``layer2``
    and ``layer3`` (16 x 16), ``pool``, ``fc``. Use :func:`demo_model` for the trained weights.

    Args:
        num_classes: outputs of ``fc``.
        seed: seeds the initial weights, drawn without touching the global random generator
            (``None``: draw them from the global generator, as any ``nn.Module`` does).

    Example:
        >>> net = DemoNet().eval()
        >>> net(torch.zeros(2, 3, 64, 64)).shape, [name for name, _ in net.named_children()]
        (torch.Size([2, 6]), ['stem', 'layer1', 'layer2', 'layer3', 'pool', 'fc'])
    """

    def __init__(self, num_classes: int = len(DEMO_CLASSES), *, seed: int | None = 0) -> None:
        super().__init__()
        # a seed must not reset the caller's global generator: draw the weights from a forked one
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            self.stem = nn.Sequential(*_conv(3, 16))
            self.layer1 = nn.Sequential(*_conv(16, 32, 2), *_conv(32, 32))
            self.layer2 = nn.Sequential(*_conv(32, 64, 2), *_conv(64, 64))
            self.layer3 = nn.Sequential(*_conv(64, 64), *_conv(64, 64))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        logits: torch.Tensor = self.fc(torch.flatten(self.pool(x), 1))
        return logits


_WEIGHTS = "demo_net.pt"  # in hookscope/weights/


def demo_model(*, pretrained: bool = True) -> DemoNet:
    """The demo classifier in eval mode, with its trained weights (or freshly initialised ones).

    The weights ship inside the package (``hookscope/weights/demo_net.pt``, a ``state_dict``
    read with ``torch.load(weights_only=True)``); ``scripts/train_demo.py`` reproduces them.

    Args:
        pretrained: load the trained weights; ``False`` gives :class:`DemoNet` with seed-0 weights.

    Returns:
        A :class:`DemoNet` in eval mode, on the CPU.

    Raises:
        HookscopeError: the weights file is missing from the installation.

    Example:
        >>> from hookscope.synthetic import shapes
        >>> data = shapes(4, seed=123)
        >>> net = demo_model()
        >>> [DEMO_CLASSES[i] for i in net(data.images).argmax(1).tolist()]
        ['ring', 'square', 'circle', 'circle']
        >>> [data.classes[i] for i in data.labels.tolist()]
        ['ring', 'square', 'circle', 'circle']
    """
    model = DemoNet(seed=0)  # for pretrained, a fixed seed leaves the global generator alone
    if pretrained:
        source = resources.files(__package__ or "hookscope").joinpath("weights", _WEIGHTS)
        try:
            with resources.as_file(source) as path, open(path, "rb") as f:
                state = torch.load(f, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise HookscopeError(
                f"the demo model's weights (hookscope/weights/{_WEIGHTS}) are missing; reinstall hookscope "
                "or run scripts/train_demo.py to make them"
            ) from None
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.eval()
