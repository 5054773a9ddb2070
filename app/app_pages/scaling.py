"""Scaling: the planner's scenario from 1 GPU to thousands; step time, communication overhead, efficiency."""

from __future__ import annotations

import streamlit as st

from simddp.exports import frame_to_csv
from simddp_app import charts, state, widgets

st.title("Scaling")
st.caption("The planner's scenario on 1, 2, 4, ... GPUs (one partial node below a node, then whole nodes), with "
           "dp = GPUs / (tp x pp). Every point is a full simulation.")

data = state.scenario_dict()
c1, c2 = st.columns([2, 1])
batch = c1.segmented_control(
    "Batch as GPUs grow", ["weak", "strong"], default="weak", key="scaling_batch", required=True,
    format_func=lambda b: {"weak": "weak: batch grows with the GPUs (samples per replica kept)",
                           "strong": "strong: global batch kept"}[b],
    help="Weak scaling grows the global batch with dp (the usual data-parallel scaling); strong scaling keeps "
         "it, so GPU counts it does not divide into are reported as invalid.",
)
max_gpus = c2.select_slider("Up to GPUs", [256, 512, 1024, 2048, 4096, 8192], value=2048, key="scaling_max")
sweep = state.scaling_sweep(data, batch or "weak", int(max_gpus))
if sweep is not None:
    st.plotly_chart(charts.scaling(sweep, mark_gpus=(128,)), key="scaling_chart")
    table = charts.scaling_table(sweep)
    widgets.table(table)
    frame = sweep.to_dataframe()
    st.download_button("Scaling CSV", data=lambda: frame_to_csv(frame),
                       file_name="scaling.csv", mime="text/csv", on_click="ignore", icon=":material/download:")
    bad = [p for p in sweep.points if not p.ok]
    if bad:
        st.caption(f"{len(bad)} GPU count(s) are not valid layouts for this scenario; see the note column.")
