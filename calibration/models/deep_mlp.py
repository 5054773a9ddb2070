"""A deep, narrow MLP: many small layers, so DDP's per-node host costs are large beside its compute.

400 blocks of Linear(16, 16) + ReLU (800 parameter tensors, 2,001 autograd nodes per forward): a held-out
model for the per-node cost of DDP's unused-parameter search (``cluster.autograd_node_traversal_s`` is fitted
on ``small_transformer.py:tiny``), see docs/ddp_knobs.md.
"""

from __future__ import annotations

import torch
from torch import nn


def factory(num_blocks: int = 400, width: int = 16, batch_size: int = 4) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(num_blocks):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers), (torch.randn(batch_size, width),)
