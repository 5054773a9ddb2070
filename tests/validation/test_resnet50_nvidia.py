"""ResNet-50 v1.5 training throughput against NVIDIA's published DGX A100 figures.

NVIDIA/DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training
performance: NVIDIA DGX A100 (8x A100 80GB)", mixed precision, batch 256 per GPU: 1 GPU 2,470 img/s,
8 GPUs 16,621 img/s. The preset's convolution efficiency (0.2) was set from the 1-GPU figure, so that row
checks the arithmetic; the 8-GPU row is a prediction, and simddp is optimistic there (docs/validation.md):
the published 6.72x strong scaling loses time to the input pipeline and host work that simddp does not
model, while its DDP all-reduce hides behind backward.
"""

from __future__ import annotations

import pytest

import simddp


def _images_per_s(gpus: int) -> float:
    r = simddp.simulate(
        {
            "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": gpus},
            "model": {"preset": "resnet50"},
            "training": {"micro_batch_size": 256, "seq_len": 1, "optimizer": "sgd-momentum",
                         "precision": "fp16-mixed"},
        },
        trace=False,
    )
    return r.samples_per_s


def test_one_gpu_matches_published() -> None:
    assert _images_per_s(1) == pytest.approx(2470, rel=0.05)


def test_eight_gpus_is_an_optimistic_bound() -> None:
    eight = _images_per_s(8)
    assert 16621 <= eight <= 16621 * 1.25  # +21%: no input pipeline or host stalls modelled
    assert eight / _images_per_s(1) == pytest.approx(8.0, rel=0.02)
