"""DDP knobs: what find_unused_parameters, static_graph, clipping, gloo and DataParallel cost here."""

from __future__ import annotations

import streamlit as st

from simddp import units
from simddp_app import charts, state, widgets

st.title("DDP knobs")
st.caption("The planner's scenario with one torch DDP option changed at a time, by its scenario key: "
           "`ddp.find_unused_parameters` (a graph search after each forward, the used-parameter all-reduce, "
           "buckets never rebuilt), `ddp.static_graph`, `training.grad_clip_norm`, `ddp.backend: gloo` (host "
           "staging, TCP) and `ddp.wrapper: dataparallel` (one process on one node). Same table as "
           "`simddp knobs`; docs/ddp_knobs.md has the sources.")

table = state.knobs(state.scenario_dict())
if table is not None:
    m = st.columns(2)
    m[0].metric("Step without them", units.fmt_time(table.baseline_s), border=True)
    m[1].metric("Start-up broadcast (once)", units.fmt_time(table.startup_broadcast_s), border=True,
                help="DDP's constructor broadcasts the parameters from rank 0; `simddp run` counts it once.")
    st.plotly_chart(charts.knob_chart(table), key="knob_chart")
    widgets.table(charts.knob_frame(table), key="knob_table")
