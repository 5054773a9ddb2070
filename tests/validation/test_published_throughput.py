"""End-to-end throughput of eager PyTorch FSDP runs (MosaicML llm-foundry, torchtitan, IBM fms-fsdp) and of
BLOOM-176B (Megatron-DeepSpeed, tp 4 x pp 12), all held out: no constant of simddp was fitted to them.

The rows, their sources and the settings each source leaves out are in ``data/published_throughput.yaml``
(collected 2026-11-25). simddp is NOT matched on these: it over-predicts every FSDP row, by 15.0% on A100 and
40.4% on H100 on average (docs/validation.md says where the time goes: compute of eager PyTorch, H100s run at a
500 W cap, FSDP overlap at small per-GPU batches). Each set's mean and worst error are asserted below twice
today's, so a change that doubled an error fails, and the table in docs/validation.md is what this computes.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

import simddp

ROWS: list[dict[str, Any]] = yaml.safe_load((Path(__file__).parent / "data" / "published_throughput.yaml").read_text())

#: Per set: (rows, mean |error| today, worst |error| today), 2026-11-25.
TODAY = {"fsdp-a100": (14, 0.150, 0.333), "fsdp-h100": (7, 0.404, 0.611), "3d": (1, 0.2085, 0.2085)}


def _bloom_tflops(result: Any, scenario: simddp.Scenario) -> float:
    """Megatron-DeepSpeed's TFLOP/s per GPU as BLOOM's logs count it: 24 x 4 B s l h^2 (1 + s / 6h + V / 16lh)
    (the 4: forward, backward and the forward again of activation checkpointing)."""
    tf, tr = scenario.model.transformer, scenario.training
    assert tf is not None
    b, s, layers, h, v = scenario.global_batch_size, tr.seq_len, tf.num_layers, tf.hidden_size, tf.vocab_size
    flop = 24 * 4 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    return flop / result.step_time_s / result.num_gpus / 1e12


def _error(row: dict[str, Any]) -> float:
    scenario = simddp.as_scenario(row["scenario"])
    result = simddp.simulate(scenario, trace=False)
    if row["metric"] == "tokens_per_s_per_gpu":
        got = result.tokens_per_s / result.num_gpus
    else:
        got = _bloom_tflops(result, scenario)
    return got / row["published"] - 1.0


@pytest.fixture(scope="module")
def errors() -> dict[str, float]:
    return {row["name"]: _error(row) for row in ROWS}


def test_the_planner_states_these_figures() -> None:
    """``simddp plan``'s note on torch FSDP quotes the FSDP means measured here."""
    from simddp.planner import PUBLISHED_FSDP_ERROR

    assert PUBLISHED_FSDP_ERROR == {"A100": TODAY["fsdp-a100"][1], "H100": TODAY["fsdp-h100"][1]}


@pytest.mark.parametrize("name", sorted(TODAY))
def test_each_set_within_twice_todays_error(name: str, errors: dict[str, float]) -> None:
    rows, mean, worst = TODAY[name]
    got = [abs(errors[r["name"]]) for r in ROWS if r["set"] == name]
    assert len(got) == rows
    assert statistics.mean(got) < 2 * mean and max(got) < 2 * worst
    assert statistics.mean(got) == pytest.approx(mean, abs=0.0015)  # the figure docs/validation.md states


def test_every_row_names_its_source_and_fits() -> None:
    for row in ROWS:
        assert row["source"] and row["assumptions"] and row["published"] > 0
        assert simddp.memory_breakdown(simddp.as_scenario(row["scenario"])).fits, row["name"]
