"""What-if: move bucket size, bandwidth, latency, nodes and ZeRO stage; see the change against the planner."""

from __future__ import annotations

from typing import Any

import streamlit as st

from simddp import sweeps, units
from simddp.config import Cluster, DDPConfig, Link, Network, Parallelism
from simddp.results import StepResult
from simddp_app import charts, state
from simddp_app.widgets import field_help, span

PREFIX = "wi:"
CAPS_MB = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0)
NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NIC_GBIT = (25.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1600.0)
INTRA_GB = (16.0, 32.0, 64.0, 150.0, 300.0, 450.0, 900.0)

#: Heatmap axes: label -> (dotted scenario path, values, how a value is shown).
GRID_PARAMS: dict[str, tuple[str, tuple[Any, ...], Any]] = {
    "bucket cap (MiB)": ("ddp.bucket_cap_mb", (5.0, 10.0, 25.0, 50.0, 100.0, 250.0), lambda v: f"{v:g}"),
    "nodes": ("cluster.num_nodes", (1, 2, 4, 8, 16, 32), str),
    "NIC line rate (Gbit/s)": ("cluster.inter_node.nic_bandwidth_bytes_per_s",
                               tuple(g * units.GBIT for g in (50, 100, 200, 400, 800)),
                               lambda v: f"{v / units.GBIT:g}"),
    "network latency (us)": ("cluster.inter_node.latency_s", tuple(u * units.US for u in (2, 5, 14, 30, 60)),
                             lambda v: f"{v / units.US:g}"),
    "intra-node bandwidth (GB/s)": ("cluster.intra_node.bandwidth_bytes_per_s",
                                    tuple(g * units.GB for g in (32, 64, 150, 300, 450)),
                                    lambda v: f"{v / units.GB:g}"),
    "ZeRO stage": ("parallelism.zero_stage", (0, 1, 2, 3), str),
    "micro-batch size": ("training.micro_batch_size", (1, 2, 4, 8), str),
}


def _options(values: tuple[Any, ...], current: Any, nullable: bool = False) -> list[Any]:
    """The slider's values with the scenario's own; a ``nullable`` key has the framework's default (None) first,
    whatever its value (after applying 25 MiB there was no way back to the default but Reset)."""
    known = sorted({*values, *([current] if current is not None else [])})
    return [None, *known] if nullable else known


def _cap_label(v: float | None) -> str:
    return "default" if v is None else f"{v:g}"


def _seed(key: str, value: Any) -> str:
    key = PREFIX + key
    if key not in st.session_state:
        st.session_state[key] = value
    return key


def _reset() -> None:
    state.forget_widgets(PREFIX)


def _apply(data: dict[str, Any]) -> None:
    state.replace_scenario(data)
    state.forget_widgets(PREFIX)


def _metric_row(base: StepResult, new: StepResult, changed: bool) -> None:
    """What-if numbers, with deltas against the planner once a slider moved."""

    def delta(text: str) -> str | None:
        return text if changed else None

    c = st.columns(5)
    c[0].metric("Step time", units.fmt_time(new.step_time_s), border=True, delta_color="inverse",
                delta=delta(f"{(new.step_time_s - base.step_time_s) / units.MS:+.2f} ms"))
    c[1].metric("Exposed communication", f"{new.exposed_comm_fraction:.1%}", border=True, delta_color="inverse",
                delta=delta(f"{100 * (new.exposed_comm_fraction - base.exposed_comm_fraction):+.2f} pt"))
    c[2].metric("Tokens / s", f"{new.tokens_per_s:,.0f}", border=True,
                delta=delta(f"{new.tokens_per_s - base.tokens_per_s:+,.0f}"))
    c[3].metric("MFU", f"{new.mfu:.1%}", border=True, delta=delta(f"{100 * (new.mfu - base.mfu):+.2f} pt"))
    mem_new, mem_base = getattr(new, "memory", None), getattr(base, "memory", None)
    if mem_new is not None and mem_base is not None:
        fits = "" if mem_new.fits else " ✗"
        c[4].metric("Memory / GPU", f"{mem_new.total_bytes / units.GiB:.1f} GiB{fits}", border=True,
                    delta_color="inverse", help=mem_new.verdict(),
                    delta=delta(f"{(mem_new.total_bytes - mem_base.total_bytes) / units.GiB:+.2f} GiB"))
    else:
        c[4].metric("Buckets", len(new.buckets), border=True, delta_color="off",
                    delta=delta(f"{len(new.buckets) - len(base.buckets):+d}"))


st.title("What-if")
st.caption("Sliders start at the planner's scenario and change a copy of it; the planner is untouched until "
           "you apply. Deltas are against the planner.")

base_data = state.scenario_dict()
base_s = state.current_scenario()
base = state.simulate(base_data) if base_s is not None else None
if base_s is not None and base is not None:
    cl, ddp = base_s.cluster, base_s.ddp
    lat_us = round(cl.inter_node.latency_s / units.US, 3)
    with st.container(border=True):
        c1, c2, c3 = st.columns(3)
        # A null bucket cap is the framework's own (torch 25 MiB after a 1 MiB first bucket, DeepSpeed 5e8
        # elements, Megatron max(4e7, 1e6 x dp) elements): "default", not 25 MiB, which the step would not use.
        cap = c1.select_slider("Bucket cap (MiB)", _options(CAPS_MB, ddp.bucket_cap_mb, nullable=True),
                               key=_seed("bucket_cap_mb", ddp.bucket_cap_mb),
                               help=field_help(DDPConfig, "bucket_cap_mb"), format_func=_cap_label)
        nodes = c2.select_slider("Number of nodes", _options(NODES, cl.num_nodes), key=_seed("num_nodes", cl.num_nodes),
                                 help=field_help(Cluster, "num_nodes"))
        zero = c3.segmented_control("ZeRO stage", [0, 1, 2, 3], key=_seed("zero_stage", base_s.parallelism.zero_stage),
                                    required=True, help=field_help(Parallelism, "zero_stage"))
        nic = c1.select_slider("NIC line rate (Gbit/s)",
                               _options(NIC_GBIT, round(cl.inter_node.nic_bandwidth_bytes_per_s / units.GBIT, 3)),
                               key=_seed("nic_gbit", round(cl.inter_node.nic_bandwidth_bytes_per_s / units.GBIT, 3)),
                               help=field_help(Network, "nic_bandwidth_bytes_per_s"), format_func=lambda v: f"{v:g}")
        lat = c2.slider("Network latency per hop (us)", *span(0.0, 100.0, lat_us),  # a gloo fit's 150 us too
                        key=_seed("net_latency_us", lat_us), step=0.5,
                        help=field_help(Network, "latency_s"))
        intra = c3.select_slider("Intra-node bandwidth (GB/s)",
                                 _options(INTRA_GB, round(cl.intra_node.bandwidth_bytes_per_s / units.GB, 3)),
                                 key=_seed("intra_gb", round(cl.intra_node.bandwidth_bytes_per_s / units.GB, 3)),
                                 help=field_help(Link, "bandwidth_bytes_per_s"), format_func=lambda v: f"{v:g}")
        if cl.collective_fits:  # the fits answer the sizes they cover: those ignore the link sliders
            st.caption("This cluster has calibrated collective fits (cluster.collective_fits): collectives of the "
                       "ops, tiers and sizes they cover take the measured times, so the link sliders move only the "
                       "others.")
        keep_batch = st.toggle("Keep the global batch when nodes change", key=_seed("keep_batch", False),
                               help="Off: the global batch grows with the GPUs, keeping the samples per "
                                    "data-parallel replica (weak scaling). On: the global batch is kept (strong "
                                    "scaling).")
    updates: dict[str, Any] = {}
    if cap != ddp.bucket_cap_mb:
        updates["ddp.bucket_cap_mb"] = None if cap is None else float(cap)
    if nodes != cl.num_nodes:
        updates["cluster.num_nodes"] = int(nodes)
    if zero != base_s.parallelism.zero_stage:
        updates["parallelism.zero_stage"] = int(zero or 0)
    if nic != round(cl.inter_node.nic_bandwidth_bytes_per_s / units.GBIT, 3):
        updates["cluster.inter_node.nic_bandwidth_bytes_per_s"] = float(nic) * units.GBIT
    if lat != lat_us:
        updates["cluster.inter_node.latency_s"] = float(lat) * units.US
    if intra != round(cl.intra_node.bandwidth_bytes_per_s / units.GB, 3):
        updates["cluster.intra_node.bandwidth_bytes_per_s"] = float(intra) * units.GB
    what_if = sweeps.with_values(base_data, updates, batch="strong" if keep_batch else "weak")

    new = state.simulate(what_if)
    c1, c2, _ = st.columns([1, 1, 4])
    c1.button("Reset sliders", on_click=_reset, icon=":material/restart_alt:", key="whatif_reset")
    c2.button("Apply to planner", on_click=_apply, args=(what_if,), icon=":material/check:",
              disabled=new is None or not updates, key="whatif_apply")
    if new is not None:
        _metric_row(base, new, bool(updates))
        st.plotly_chart(charts.compare({"planner": base, "what-if": new}), key="whatif_compare")

        view = st.segmented_control("Explore", ["Bucket-cap sweep", "Heatmap"], default="Bucket-cap sweep",
                                    key="whatif_view", required=True)
        if view == "Bucket-cap sweep":
            current_cap = None if cap is None else float(cap)  # the framework's default: no marker on the axis
            caps = tuple(sorted({*CAPS_MB, *([current_cap] if current_cap is not None else [])}))
            bsweep = state.bucket_cap_sweep(what_if, caps)
            if bsweep is not None:
                st.plotly_chart(charts.bucket_sweep(bsweep, current_cap), key="bucket_sweep")
        else:
            names = list(GRID_PARAMS)
            c1, c2, c3 = st.columns(3)
            x_name = c1.selectbox("x", names, index=names.index("bucket cap (MiB)"), key="grid_x")
            y_name = c2.selectbox("y", names, index=names.index("NIC line rate (Gbit/s)"), key="grid_y")
            metrics = list(charts.GRID_METRICS)
            metric = c3.selectbox("Metric", metrics, index=metrics.index("exposed comm (%)"), key="grid_metric")
            if x_name == y_name:
                st.warning("Pick two different parameters.", icon=":material/warning:")
            else:
                (xp, xv, xf), (yp, yv, yf) = GRID_PARAMS[x_name], GRID_PARAMS[y_name]
                grid = state.grid_sweep(what_if, xp, xv, yp, yv, batch="strong" if keep_batch else "weak")
                if grid is not None:
                    st.plotly_chart(charts.heatmap(grid, metric, x_name, y_name, [xf(v) for v in xv],
                                                   [yf(v) for v in yv]), key="heatmap")
                    st.caption("Each cell is a full simulation of the what-if scenario with the two values set; "
                               "blank cells are invalid layouts (hover for why).")
