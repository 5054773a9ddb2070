"""Memory: bytes per GPU of the planner's scenario under DDP, ZeRO-1/2/3, TP and PP, against the capacity."""

from __future__ import annotations

import streamlit as st

from simddp import units
from simddp.verdict import MemoryVerdict
from simddp_app import charts, state, widgets

st.title("Memory")
st.caption("Peak memory of the most loaded GPU (simddp.memory): parameters, gradients, optimizer states, "
           "activations, buffers and overheads. Each strategy is the planner's scenario with only the parallel "
           "layout changed, on the same GPUs and batch.")

data = state.scenario_dict()
scenario = state.current_scenario()
if scenario is not None:
    per_node = scenario.cluster.gpus_per_node
    tf = scenario.model.transformer
    c1, c2 = st.columns(2)
    tp_options = [d for d in range(2, per_node + 1) if per_node % d == 0] or [1]
    tp = c1.select_slider("TP degree of the TP bar", tp_options, value=tp_options[-1], key="mem_tp",
                          help="Tensor-parallel degree (inside a node).")
    pp_options = [p for p in (2, 4, 8, 16, 32) if tf is None or p <= tf.num_layers] or [1]
    pp = c2.select_slider("PP degree of the PP bar", pp_options, value=4 if 4 in pp_options else pp_options[0],
                          key="mem_pp", help="Pipeline stages.")
    sweep = state.strategy_sweep(data, int(tp), int(pp))
    if sweep is not None:
        st.plotly_chart(charts.memory_strategies(sweep), key="memory_chart")
        widgets.table(charts.strategy_table(sweep))
        for p in sweep.points:
            if not p.ok:
                st.warning(f"{p.strategy}: {p.error}", icon=":material/warning:")

    result = state.simulate(data)
    memory = result.memory if result is not None else None
    if memory is not None:
        st.subheader(f"This scenario: {units.fmt_bytes(memory.total_bytes)} per GPU, "
                     f"{MemoryVerdict.of(memory).short()}")
        st.caption(f"Pipeline stage {memory.stage} (rank {memory.rank}); {memory.num_params:,} parameters before "
                   f"ZeRO sharding; {memory.in_flight_micro_batches:g} micro-batch(es) of activations in flight.")
        widgets.table(charts.memory_items(memory))
        for note in memory.notes:
            st.info(note, icon=":material/info:")
    if st.toggle("Search the layouts that fit on these GPUs", key="mem_search",
                 help="simddp.memory.smallest_layout_that_fits: every ZeRO stage x tp x pp x sequence parallelism "
                      "x recompute on the same GPUs."):
        found = state.layout_search(data)
        if found is not None:
            def describe(fit) -> str:  # type: ignore[no-untyped-def]
                return "none fits" if fit is None else f"{fit.label()}: {units.fmt_bytes(fit.total_bytes)}"
            st.markdown(
                f"- **least model parallelism that fits**: {describe(found.best)}\n"
                f"- lowest ZeRO stage at this tp, pp and recompute: {describe(found.smallest_zero_stage)}\n"
                f"- least recompute at this ZeRO stage, tp and pp: {describe(found.least_recompute)}\n"
                f"- lowest tp at this ZeRO stage, pp and recompute: {describe(found.smallest_tp)}\n"
                f"- lowest pp at this ZeRO stage, tp and recompute: {describe(found.smallest_pp)}\n"
                f"\n{found.num_layouts} valid layouts evaluated, {sum(f.fits for f in found.evaluated)} fit "
                "(fitting first, most preferred first):"
            )
            widgets.table(charts.layout_table(found), height=320)
