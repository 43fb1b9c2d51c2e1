"""A plain residual tower with the shape of KataGo's b6c96, the yardstick of `tengen bench
features` (what one forward pass costs beside encoding its inputs) until nets has the full net.

Shape as in the paper's Appendix A: the 18 planes through a 5x5 convolution to c channels, the
10 globals added as a per-channel bias, b pre-activation residual blocks of two 3x3
convolutions (batch norm, ReLU), then a 1x1 policy map and a pooled value output. The heads
are cheap beside the trunk, which is what the comparison needs.
"""

from __future__ import annotations

import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W)
        y = self.conv1(torch.relu(self.norm1(x)))
        y = self.conv2(torch.relu(self.norm2(y)))
        return x + y


class ResidualTower(nn.Module):
    def __init__(self, blocks: int = 6, channels: int = 96, planes: int = 18, globals_: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(planes, channels, 5, padding=2, bias=False)
        self.global_bias = nn.Linear(globals_, channels, bias=False)
        self.blocks = nn.Sequential(*(_Block(channels) for _ in range(blocks)))
        self.norm = nn.BatchNorm2d(channels)
        self.policy = nn.Conv2d(channels, 2, 1)
        self.value = nn.Linear(channels, 3)

    def forward(self, planes: torch.Tensor, glob: torch.Tensor):
        x = self.stem(planes) + self.global_bias(glob)[:, :, None, None]  # (B, C, H, W)
        x = torch.relu(self.norm(self.blocks(x)))
        policy = self.policy(x).flatten(1)  # (B, 2 * H * W)
        value = self.value(x.mean(dim=(2, 3)))  # (B, 3)
        return policy, value
