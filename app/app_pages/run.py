"""Run: the whole training run: days, GPU-hours, cost, failures, checkpoints, goodput."""

from __future__ import annotations

import copy
from typing import Any

import streamlit as st

from simddp import units
from simddp.config import RunConfig
from simddp_app import charts, state, widgets
from simddp_app.widgets import field_help

st.title("Run")
st.caption("The planner's scenario trained on a number of tokens: wall-clock days, GPU-hours and cost, with "
           "failures (exponential, per GPU or node), checkpoints (rank 0 alone or sharded) and restarts; the "
           "checkpoint interval that maximises goodput (Daly 2006), unless the scenario fixes one "
           "(run.checkpoint_interval_s; a note says so). Same model as `simddp run`.")

data = state.scenario_dict()
base = state.current_scenario()
if base is None:
    state.offer_to_drop("run", "run")
    st.stop()
run = base.run


def box(where: Any, label: str, low: float, high: float, value: float, key: str, field: str) -> float:
    """A number box for one ``run`` key, its bounds widened to hold the scenario's own value (any the config takes:
    a Compare upload; a value outside the box ended the page in a traceback)."""
    lo, hi = widgets.span(low, high, value)
    return float(where.number_input(label, min_value=lo, max_value=hi, value=value, key=key,
                                    help=field_help(RunConfig, field)))


c = st.columns(4)
tokens_b = box(c[0], "Tokens (billions)", 0.001, 1e6, float((run.tokens or 300e9) / 1e9), "run_tokens", "tokens")
price = box(c[1], "GPU-hour (USD)", 0.0, 1000.0, float(run.gpu_hour_cost_usd), "run_price", "gpu_hour_cost_usd")
mtbf = box(c[2], "MTBF (hours)", 0.01, 1e9, float(run.mtbf_hours), "run_mtbf", "mtbf_hours")
scope = c[3].segmented_control("MTBF per", ["gpu", "node"], default=run.mtbf_scope, key="run_scope", required=True,
                               help=field_help(RunConfig, "mtbf_scope"))
d = st.columns(4)
saving = d[0].segmented_control("Checkpoint saving", ["rank0", "sharded"], default=run.checkpoint_saving,
                                key="run_saving", required=True, help=field_help(RunConfig, "checkpoint_saving"))
storage = box(d[1], "Storage write (GB/s)", 0.001, 1e6, float(run.storage_write_bytes_per_s / units.GB), "run_storage",
              "storage_write_bytes_per_s")
restart = box(d[2], "Restart overhead (min)", 0.0, 1e5, float(run.restart_overhead_s / 60), "run_restart",
              "restart_overhead_s")
tflops = box(d[3], "Measured TFLOP/s per GPU (0 = simulate)", 0.0, 1e5, float(run.achieved_tflops_per_gpu or 0.0),
             "run_tflops", "achieved_tflops_per_gpu")

variant = copy.deepcopy(data)
variant["run"] = {**variant.get("run", {}), "tokens": tokens_b * 1e9, "gpu_hour_cost_usd": price,
                  "mtbf_hours": mtbf, "mtbf_scope": scope or "gpu", "checkpoint_saving": saving or "rank0",
                  "storage_write_bytes_per_s": storage * units.GB, "restart_overhead_s": restart * 60,
                  "achieved_tflops_per_gpu": tflops or None}
result = state.run(variant)
if result is not None:
    m = st.columns(5)
    m[0].metric("Days", f"{result.days:,.1f}", border=True,
                help=f"Wall clock; {result.training_days:,.1f} days of training without failures.")
    m[1].metric("GPU-hours", f"{result.gpu_hours:,.0f}", border=True)
    m[2].metric("Cost", f"${result.cost:,.0f}", border=True)
    m[3].metric("Expected failures", f"{result.expected_failures:,.1f}", border=True,
                help=f"Job MTBF {result.mtbf_s / units.HOUR:.3g} h.")
    m[4].metric("Goodput", f"{result.goodput:.1%}", border=True, help="Training time / wall clock.")
    st.plotly_chart(charts.goodput_curve(result), key="run_curve")
    st.caption(f"Throughput: {result.throughput_source}. Checkpoint {result.checkpoint_bytes / units.TB:.3g} TB: "
               f"{units.fmt_time(result.checkpoint_time_s)} ({result.checkpoint_saving}); restart "
               f"{units.fmt_time(result.restart_s)} per failure.")
    widgets.table(charts.run_table(result), key="run_table")
    for note in result.notes:
        st.caption(f"Note: {note}")
