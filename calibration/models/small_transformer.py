"""A small TransformerEncoder (the CPU acceptance model): 6 layers, d_model 256, 4 heads, FFN 1024.

4.8 M parameters (19 MiB of fp32 gradients) in 76 tensors; a batch of 4 sequences of 64 tokens makes one
CPU step ~100 ms on one core, with the gradient all-reduce a visible share of it on gloo.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallTransformer(nn.Module):
    def __init__(self, d_model: int = 256, num_layers: int = 6, num_heads: int = 4, ffn: int = 1024,
                 num_outputs: int = 256) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, num_heads, ffn, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def factory(batch_size: int = 4, seq_len: int = 64) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = SmallTransformer()
    return model, (torch.randn(batch_size, seq_len, 256),)


def tiny() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A two-layer, d_model 64 version for tests (seconds, not minutes)."""
    torch.manual_seed(0)
    model = SmallTransformer(d_model=64, num_layers=2, num_heads=2, ffn=128, num_outputs=32)
    return model, (torch.randn(2, 16, 64),)


def gpu() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A GPU-sized version: 12 layers, d_model 1024, 16 heads, FFN 4096 (151 M parameters), 8 x 512 tokens,
    large enough that an H100's kernels, not its launches, set the per-layer times."""
    torch.manual_seed(0)
    model = SmallTransformer(d_model=1024, num_layers=12, num_heads=16, ffn=4096, num_outputs=1024)
    return model, (torch.randn(8, 512, 1024),)
