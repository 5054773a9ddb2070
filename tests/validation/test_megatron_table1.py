"""End to end against Megatron-LM's published A100 runs, every row held out (issue 8).

No constant of simddp was fitted on these papers: the A100 preset's kernel constants come from cuBLASLt and
FlashAttention benchmarks (``benchmarks/fit_compute.py``), its links from NCCL's model and nccl-tests, and
the interference from Agrawal et al. The configurations are the papers' (``benchmarks/megatron_table1.py``).

Tolerances sit below twice today's errors, so a change that doubled an error fails. The rows simddp gets
wrong are not asserted as right: DeepSpeed ZeRO-3 of 2021 (Narayanan Table 2) is reported in
docs/validation.md with its error, and only checked to stay an over-prediction (simddp's ZeRO-3 is NCCL
at its bus bandwidth, which the 2021 implementation was far from).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import megatron_table1


@pytest.fixture(scope="module")
def tables() -> dict[str, Any]:
    return {"table1": megatron_table1.table1(), "table2": megatron_table1.table2(),
            "table4": megatron_table1.table4(), "table5": megatron_table1.table5()}


def _err(sim: float, pub: float) -> float:
    return sim / pub - 1


def test_narayanan_table1_achieved_tflops(tables: dict[str, Any]) -> None:
    """10 rows, 1.7B to 1T on 32 to 3072 GPUs: MAPE 4.8%, max +9.5% (76B, interleaved) today; the issue's
    targets (MAPE <= 5%, max <= 10%) are the bounds."""
    errors = [_err(sim, pub) for _, pub, sim in tables["table1"]]
    assert len(errors) == 10
    assert sum(abs(e) for e in errors) / len(errors) <= 0.05
    assert max(abs(e) for e in errors) <= 0.10
    # the error no longer grows with model size (the single averaged efficiency ran +11% .. -24%)
    small, large = errors[:5], errors[5:]
    assert abs(sum(large) / 5 - sum(small) / 5) <= 0.10


@pytest.mark.parametrize("index", range(10))
def test_narayanan_table1_each_row(tables: dict[str, Any], index: int) -> None:
    size, published, simulated = tables["table1"][index]
    assert abs(_err(simulated, published)) <= 0.10, f"{size}B: {simulated:.0f} vs {published} TFLOP/s"


def test_narayanan_table2_ptd_p_rows(tables: dict[str, Any]) -> None:
    """GPT-3 175B, tp 8 x pp 12, batch 1536 on 384 / 768 / 1536 GPUs: +2.4 .. +3.4% today."""
    rows = [r for r in tables["table2"] if r[0] == "PTD-P"]
    assert len(rows) == 3
    for _, gpus, published, simulated in rows:
        assert abs(_err(simulated, published)) <= 0.06, f"{gpus} GPUs"
    # the published per-GPU throughput falls as the batch spreads thinner; so does simddp's
    assert rows[0][3] > rows[1][3] > rows[2][3]


def test_narayanan_table2_zero3_is_reported_not_matched(tables: dict[str, Any]) -> None:
    """DeepSpeed's 2021 ZeRO-3 ran far below NCCL's bandwidth (a constant step time as GPUs double):
    simddp over-predicts it (+55% .. +359%, docs/validation.md). Checked only to stay an over-prediction."""
    rows = [r for r in tables["table2"] if r[0] == "ZeRO-3"]
    assert all(simulated > published for _, _, published, simulated in rows)


def test_korthikanti_table4_one_22b_layer(tables: dict[str, Any]) -> None:
    """Forward +3.3 .. +3.8%, backward -2.8 .. +0.3% today; the issue's 5% is the bound."""
    for name, fwd, bwd, sim_fwd, sim_bwd in tables["table4"]:
        assert abs(_err(sim_fwd, fwd)) <= 0.05, f"{name} forward {sim_fwd:.2f} ms vs {fwd}"
        assert abs(_err(sim_bwd, bwd)) <= 0.05, f"{name} backward {sim_bwd:.2f} ms vs {bwd}"
    # what the paper measures: recompute costs backward time, sequence parallelism saves forward time
    t = {name: (f, b) for name, _, _, f, b in tables["table4"]}
    assert t["full recompute"][1] > t["selective recompute"][1] > t["baseline"][1]
    assert t["sequence parallel"][0] < t["baseline"][0]


def test_korthikanti_table5_iteration_times(tables: dict[str, Any]) -> None:
    """22B .. 1T, full recompute and SP + selective: MAPE 2.6%, max +6.1% today."""
    errors = []
    for name, full, sim_full, present, sim_present in tables["table5"]:
        errors += [_err(sim_full, full), _err(sim_present, present)]
        # the paper's headline: SP + selective recompute is ~30% faster than full recompute
        assert sim_full / sim_present == pytest.approx(full / present, rel=0.05), name
    assert max(abs(e) for e in errors) <= 0.10
    assert sum(abs(e) for e in errors) / len(errors) <= 0.05
