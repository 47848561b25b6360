"""Small models built in code (no downloads), for the demo, the docs and the tests."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["TinyResNet"]


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
