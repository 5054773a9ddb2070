"""Timeline: backward per layer against the bucket all-reduces of the NCCL stream (and pipeline stages)."""

from __future__ import annotations

import streamlit as st

from simddp import units
from simddp.exports import frame_to_csv
from simddp_app import charts, state, widgets

st.title("Timeline")
st.caption("One simulated step of the most loaded GPU: compute stream (forward and backward per layer) against "
           "the communication stream (one collective per DDP bucket, in bucket order). Hover for sizes and "
           "algorithms; export the full trace to Perfetto from the sidebar.")

data = state.scenario_dict()
result = state.simulate(data, trace=True)
if result is not None:
    widgets.fit_banner(result)
if result is not None and result.trace is not None:
    zoom = st.toggle("Zoom to the last micro-batch (where DDP overlaps)", value=True, key="timeline_zoom",
                     help="Earlier micro-batches run under no_sync and do not communicate.")
    window = charts.last_backward_window(result.trace) if zoom else None
    st.plotly_chart(charts.timeline(result.trace, window, title=f"{result.scenario}: step "
                                    f"{units.fmt_time(result.step_time_s)}"), key="timeline")
    c = st.columns(4)
    c[0].metric("Buckets", len(result.buckets), border=True)
    c[1].metric("All communication", units.fmt_time(result.comm_time_s), border=True)
    c[2].metric("Exposed communication", units.fmt_time(result.exposed_comm_time_s), border=True)
    c[3].metric("Backward + forward", units.fmt_time(result.compute_time_s), border=True)
    if result.pp > 1:
        schedule = data.get("parallelism", {}).get("pipeline_schedule", "1f1b")
        st.caption(f"Pipeline ({schedule}): one compute and one comm row per stage; Fi / Bi = forward "
                   "/ backward of micro-batch i (vs = virtual stage). Figures above are for "
                   f"{result.reported_rank}; bubble {units.fmt_time(result.pipeline_bubble_time_s)}.")
    st.subheader("Buckets")
    table = charts.bucket_table(result)
    widgets.table(table, height=320)
    st.download_button("Buckets CSV", data=lambda: frame_to_csv(table), file_name="buckets.csv",
                       mime="text/csv", on_click="ignore", icon=":material/download:")
