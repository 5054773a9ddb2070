"""Plan: the fastest parallel layouts that fit the planner's model, batch and cluster (``simddp plan``)."""

from __future__ import annotations

import streamlit as st

from simddp import safeio, units
from simddp.config import MAX_GPUS, ScenarioError, set_value
from simddp.planner import OBJECTIVES, fsdp_caveat, layout_settings, plan_layouts, plan_start, scenario_layout
from simddp_app import charts, state, widgets

RESULT_KEY = "plan_result"

st.title("Plan")
st.caption("Every layout of tp (within a node), pp, virtual stages, dp, ZeRO stage, micro-batch, recompute, "
           "sequence parallelism and bucket cap for the planner's model and global batch: the memory model rules "
           "out those that do not fit, and the fastest of the rest are simulated (exactly: a layout is skipped only "
           "when a lower bound on its step shows it cannot make the list or the front).")

data = state.scenario_dict()
# The search replaces the layout: a Planner scenario whose own layout is not valid (a batch smaller than its GPUs)
# is still planned, as `simddp plan` does (simddp.planner.plan_start); only its cluster must be valid.
cluster = state.valid_cluster(data)
if cluster is not None:
    problem = state.validation_error(data)
    if problem is not None:
        st.info(f"The Planner's layout is not valid as it is; the search replaces it: {safeio.one_line(problem, 200)}",
                icon=":material/info:")
    per_node = cluster.gpus_per_node
    c1, c2, c3 = st.columns(3)
    # Up to the GPUs any scenario may have (the Planner's cluster can be that large: 4,096 nodes of 64 GPUs).
    gpus = int(c1.number_input("GPUs", min_value=1, max_value=MAX_GPUS, value=min(cluster.num_gpus, MAX_GPUS),
                               step=per_node, key="plan_gpus",
                               help=f"A whole number of {per_node}-GPU nodes (or part of one node)."))
    top = int(c2.number_input("Layouts to list", min_value=1, max_value=100, value=10, key="plan_top"))
    objective = c3.segmented_control("Rank by", OBJECTIVES, default="step_time", key="plan_objective",
                                     required=True, format_func=lambda o: o.replace("_", " "))
    exact_front = st.toggle("Exact front", key="plan_front_exact",
                            help="Also simulate every layout that could be on the front of step time against memory "
                                 "(slower: many more simulations). Off, the front is that of the simulated layouts.")
    request = (state.to_json(data), gpus, top, objective, exact_front)
    if st.button("Search layouts", type="primary", key="plan_run", icon=":material/search:"):
        bar = st.progress(0.0, text="Checking memory...")

        def progress(done: int, total: int) -> None:
            bar.progress(min(done / max(total, 1), 1.0), text=f"{done:,} / {total:,} (memory, then simulations)")

        try:
            start = plan_start(data, gpus)
            result = plan_layouts(start.base, gpus, top=top, objective=objective or "step_time", progress=progress,
                                  pareto=True, exact_front=exact_front)
            yours = None if start.own is None else scenario_layout(start.own)
            st.session_state[RESULT_KEY] = (request, result, yours, start)
        except ScenarioError as err:
            st.session_state.pop(RESULT_KEY, None)
            st.error(f"Cannot plan: {safeio.one_line(err).replace('--gpus', 'GPUs')}", icon=":material/error:")
        bar.empty()
    held = st.session_state.get(RESULT_KEY)
    if held is not None and held[0] != request:
        st.info("The scenario or the search settings changed since the last search: search again.",
                icon=":material/refresh:")
    elif held is not None:
        result, yours, start = held[1], held[2], held[3]
        scenario = start.base
        m = st.columns(4)
        m[0].metric("Layouts evaluated", f"{result.evaluated:,}", border=True,
                    help=f"{result.dominated:,} of them ruled out by a smaller micro-batch or heavier recompute of "
                         "the same layout that did not fit")
        m[1].metric("Fit in memory", f"{result.fitting:,}", border=True)
        m[2].metric("Simulated", f"{result.simulated:,}", border=True,
                    help="The others' lower bound could not beat the list or reach the front")
        if result.untimed:
            st.warning(f"{result.untimed:,} layouts that fit could not be simulated and are not ranked: "
                       f"{safeio.one_line(result.untimed_reason or '', 200)}", icon=":material/warning:")
        if result.layouts:
            m[3].metric("Best step time", units.fmt_time(result.layouts[0].step_time_s), border=True,
                        help=f"MFU {result.layouts[0].mfu:.1%}")
            widgets.table(charts.plan_table(result))
            st.caption(f"Your layout ({yours.label()}): {units.fmt_time(yours.step_time_s)}, MFU {yours.mfu:.1%}, "
                       f"{units.fmt_bytes(yours.memory_bytes)} per GPU{'' if yours.fits else ', does not fit'}."
                       if yours is not None else
                       f"Your layout is not compared: {safeio.one_line(start.why_not or 'it cannot be simulated')}")
            caveat = fsdp_caveat(scenario, result.layouts[0])
            if caveat:
                st.caption(f"Note: {caveat}.")
            st.plotly_chart(charts.plan_front(result, scenario.cluster.gpu.hbm_bytes), key="plan_front")
            c1, c2 = st.columns([1, 3])
            rank = int(c1.selectbox("Layout", range(1, len(result.layouts) + 1), key="plan_pick",
                                    format_func=lambda k: f"#{k}"))
            if c2.button("Open in Planner", key="plan_open", icon=":material/open_in_new:"):
                chosen = result.layouts[rank - 1]
                for path, value in {**start.cluster_sets, **layout_settings(scenario, result.num_gpus, chosen)}.items():
                    data = set_value(data, path, value)
                state.replace_scenario(data)
                st.session_state.pop(RESULT_KEY, None)
                st.switch_page("app_pages/planner.py")
        else:
            st.warning("No layout fits in memory: more GPUs, a larger GPU, a smaller model or a shorter sequence.",
                       icon=":material/memory:")
