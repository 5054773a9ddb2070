"""Variability: jitter, stragglers and sequence lengths; the step-time histogram and p99 against the GPUs."""

from __future__ import annotations

import copy

import streamlit as st

from simddp import units
from simddp.config import VariabilityConfig
from simddp_app import charts, state, widgets
from simddp_app.widgets import field_help

st.title("Variability")
st.caption("Every rank's compute times a lognormal jitter (drawn per rank and step), k stragglers slower by a "
           "factor, and the cost of the documents each micro-batch holds. Every collective waits for its slowest "
           "member: the step is the critical path through the synchronisation points (Monte Carlo over steps, "
           "`simddp tails`).")

#: The largest whole number a browser's number input holds (JavaScript's Number.MAX_SAFE_INTEGER); a scenario
#: takes seeds to 2^53 (its seed up to 2^31 - 1 was refused with a traceback).
_MAX_SEED = 2**53 - 1

data = state.scenario_dict()
base = state.current_scenario()
if base is None:
    state.offer_to_drop("variability", "variability")
    st.stop()
var = base.variability
#: Without variation in the scenario the page starts from 5% jitter (a starting point to explore: a calibration
#: measures your own), so that its first screen is a distribution; the scenario is unchanged until "Keep".
start_cv = var.jitter_cv if var.active else 0.05

c = st.columns(4)
# The sliders reach the scenario's own values (any the config takes), not clamped to their usual range: a CV of
# 50% showed as 30%, a slowdown of 5x as 3x, and the page contradicted `simddp tails`.
cv_value, slow_value = float(100 * start_cv), float(var.straggler_slowdown)
cv = c[0].slider("Jitter CV (%)", *widgets.span(0.0, 30.0, cv_value), value=cv_value, step=0.5, key="var_cv",
                 help=field_help(VariabilityConfig, "jitter_cv"))
stragglers = c[1].number_input("Stragglers", min_value=0, max_value=base.cluster.num_gpus,
                               value=int(var.num_stragglers), step=1, key="var_stragglers",
                               help=field_help(VariabilityConfig, "num_stragglers"))
slowdown = c[2].slider("Straggler slowdown (x)", *widgets.span(1.0, 3.0, slow_value), value=slow_value, step=0.05,
                       key="var_slowdown", help=field_help(VariabilityConfig, "straggler_slowdown"))
steps = c[3].select_slider("Monte Carlo steps", [50, 100, 200, 500, 1000], value=200, key="var_steps")
d = st.columns(4)
lengths = d[0].selectbox("Document lengths", ["fixed", "uniform", "lognormal"],
                         index=["fixed", "uniform", "lognormal"].index(var.seq_len_distribution), key="var_lengths",
                         help=field_help(VariabilityConfig, "seq_len_distribution"))
handling = d[1].segmented_control("Sequences", ["padding", "packing"], default=var.sequence_handling,
                                  key="var_handling", required=True,
                                  help=field_help(VariabilityConfig, "sequence_handling"))
seq_len = base.training.seq_len
mean_len = d[2].number_input("Mean document (tokens)", min_value=1, max_value=seq_len,
                             value=int(var.mean_seq_len or max(1, seq_len // 4)), key="var_mean",
                             help=field_help(VariabilityConfig, "mean_seq_len"))
# A seed beyond the box (2^53, which the scenario takes) is used as it is, not clamped: the box is then disabled.
beyond = var.seed > _MAX_SEED
seed = d[3].number_input("Seed", min_value=0, max_value=_MAX_SEED, value=min(int(var.seed), _MAX_SEED), key="var_seed",
                         disabled=beyond, help=field_help(VariabilityConfig, "seed") + (
                             f" The scenario's seed {var.seed} is beyond this box; it is used as it is."
                             if beyond else ""))

settings = {"jitter_cv": cv / 100, "num_stragglers": int(stragglers), "straggler_slowdown": slowdown,
            "seq_len_distribution": lengths, "sequence_handling": handling or "padding",
            "mean_seq_len": int(mean_len), "seed": int(var.seed if beyond else seed)}
variant = copy.deepcopy(data)
variant["variability"] = {**variant.get("variability", {}), **settings}
if st.button("Keep these settings in the scenario", key="var_keep", icon=":material/save:",
             help="Write them to the planner's scenario (variability section): the exports and `simddp run` use "
                  "them."):
    state.set_path("variability", variant["variability"])

result = state.tails(variant, int(steps))
if result is not None:
    if result.num_steps < steps:
        st.caption(f"{result.num_steps:,} Monte Carlo steps, not {steps:,}: more would take arrays beyond the draws' "
                   "limit (simddp.limits.MAX_TAIL_DRAWS) at this batch.")
    m = st.columns(5)
    m[0].metric("Mean step", units.fmt_time(result.mean_s), border=True,
                delta=f"{(result.mean_s / result.deterministic_step_s - 1):+.1%} vs simulated",
                delta_color="inverse")
    m[1].metric("p50 step", units.fmt_time(result.p50_s), border=True)
    m[2].metric("p99 step", units.fmt_time(result.p99_s), border=True)
    m[3].metric("Lost to the tail", f"{result.tail_loss_fraction:.1%}", border=True,
                help="1 - balanced / mean: the throughput lost because every collective waits for its slowest "
                     "member (balanced: every rank at the mean).")
    m[4].metric("Tokens / s", f"{result.tokens_per_s:,.0f}", border=True,
                help=f"Real tokens; padding is {result.padding_fraction:.1%} of the tokens computed.")
    st.plotly_chart(charts.step_histogram(result), key="var_histogram")
    if result.worst_sync_point:
        st.markdown(f"Most of the waiting is at the **{result.worst_sync_point}**.")
    widgets.table(charts.sync_point_table(result), key="var_sync")
    if result.below_zero_note:
        st.caption(result.below_zero_note[0].upper() + result.below_zero_note[1:] + ".")

    st.subheader("p99 against the number of GPUs")
    per_node = base.cluster.gpus_per_node
    up_to = st.select_slider("Up to nodes", [4, 8, 16, 32, 64, 128], value=32, key="var_max_nodes",
                             help="Weak scaling: the same samples per data-parallel replica on more nodes; each "
                                  f"point is a simulated step and {int(steps)} Monte Carlo steps.")
    nodes = tuple(n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= up_to)
    points = state.tails_vs_ranks(variant, nodes, int(steps))
    if points:
        st.plotly_chart(charts.tails_vs_ranks(points), key="var_ranks")
        left_out = sorted(set(nodes) - {p.num_nodes for p in points})
        st.caption(f"{per_node} GPUs per node; the seed is the same at every size."
                   + (f" Left out (the layout does not fit them, or their draws are beyond the Monte Carlo's limit): "
                      f"{', '.join(map(str, left_out))} node(s)."
                      if left_out else ""))
