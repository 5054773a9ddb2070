"""Shared scenario dicts for tests (a plain module: conftest names clash across test folders)."""

from __future__ import annotations

from typing import Any


def base_scenario(**overrides: Any) -> dict[str, Any]:
    """A small, fast scenario dict (GPT-2 on 2 DGX-A100 nodes) for tests to modify."""
    data: dict[str, Any] = {
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
        "model": {"preset": "gpt2"},
        "training": {"micro_batch_size": 4, "seq_len": 1024},
    }
    for key, value in overrides.items():
        data[key] = value
    return data


