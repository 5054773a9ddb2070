"""Plotly figures for the dashboard, built from simddp's typed results (no streamlit import here).

Figures only convert units for display (ms, GiB, GB/s, through :mod:`simddp.units`); every number comes
from simddp.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simddp import units
from simddp.results import StepResult, Trace
from simddp.sweeps import BucketCapSweep, GridSweep, ScalingSweep, StrategySweep

MS = units.MS
COLORS = {
    "compute": "#4C78A8",
    "forward": "#72B7B2",
    "stage_forward": "#72B7B2",
    "stage_backward": "#4C78A8",
    "backward": "#4C78A8",
    "accumulation": "#9ecae9",
    "optimizer": "#B279A2",
    "host": "#BAB0AC",
    "comm": "#F58518",
    "tp": "#F2CF5B",
    "exposed": "#E45756",
    "gather": "#EECA3B",
    "other": "#54A24B",
    "recompute": "#9D755D",
    "interference": "#FF9DA6",
    "imbalance": "#D67195",
    "clip": "#D4A6C8",
    "p2p": "#E7BA52",
}
_LAYOUT = {"margin": {"l": 10, "r": 10, "t": 40, "b": 10},
           "legend": {"orientation": "h", "yanchor": "top", "y": -0.25}}


def _mark_x(fig: go.Figure, x: float, text: str, cols: Sequence[int] = (1,)) -> None:
    """A dashed vertical line at ``x`` on a log x axis, labelled at the top.

    The line is a shape (data coordinates) and the label an annotation, which on a log axis takes log10(x).
    """
    for col in cols:
        ref = "x" if col == 1 else f"x{col}"
        fig.add_shape(type="line", xref=ref, yref="paper", x0=x, x1=x, y0=0, y1=1,
                      line={"dash": "dash", "color": "grey", "width": 1})
        fig.add_annotation(xref=ref, yref="paper", x=math.log10(x), y=0.99, text=text, showarrow=False,
                           xanchor="left", yanchor="top", font={"size": 11, "color": "grey"})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / MS


# ------------------------------------------------------------------------------------------ planner
#: The step as simddp splits it: compute + pipeline bubble + exposed communication + optimizer + host.
#: The step's parts (:data:`simddp.results.BREAKDOWN_PARTS`, which add up to the step) in the order stacked, with
#: their colours; a part a step does not have is left out.
_STEP_PARTS = [
    ("compute", "compute"), ("recompute", "recompute"), ("interference", "interference"), ("tp_comm", "gather"),
    ("pipeline_bubble", "accumulation"), ("stage_imbalance", "imbalance"), ("pipeline_p2p", "p2p"),
    ("dp_comm", "exposed"),
    ("ddp_host", "other"), ("grad_clip", "clip"), ("optimizer", "optimizer"), ("host", "host"),
]


def _parts(results: Sequence[StepResult]) -> list[tuple[str, str, str]]:
    """(key, label, colour) of every part that any of ``results`` has, in stacking order."""
    labels = {p.key: p.label for r in results for p in r.breakdown}
    return [(key, labels[key], color) for key, color in _STEP_PARTS
            if key in labels and any(r.part(key) > 0 for r in results)]


def step_breakdown(result: StepResult, title: str = "Where the step goes", compact: bool = False) -> go.Figure:
    """The step as compute, bubble, exposed communication, optimizer and host; all communication beside it.

    ``compact``: no legend, the parts labelled inside their bars (for a narrow column).
    """
    fig = go.Figure()
    for key, label, color in _parts([result]):
        ms = result.part(key) / MS
        fig.add_bar(y=["step"], x=[ms], name=label, orientation="h", marker_color=COLORS[color],
                    text=[f"{label.split(' (')[0]} {ms:,.0f} ms"] if compact else None, textposition="inside",
                    insidetextanchor="middle", hovertemplate=f"{label}: %{{x:.2f}} ms<extra></extra>")
    comm_ms = result.comm_time_s / MS
    fig.add_bar(y=["all comm"], x=[comm_ms], name="all communication (mostly overlapped)", orientation="h",
                marker_color=COLORS["comm"], text=[f"{comm_ms:,.1f} ms"] if compact else None,
                textposition="auto", hovertemplate="all communication: %{x:.2f} ms<extra></extra>")
    layout = dict(_LAYOUT)
    if compact:
        layout["showlegend"] = False
    fig.update_layout(barmode="stack", title=title, xaxis_title="ms", height=220 if compact else 260,
                      uniformtext={"minsize": 10, "mode": "hide"}, **layout)
    return fig


# ------------------------------------------------------------------------------------------ timeline
_PIPE_OP = re.compile(r"^[FB]\d")  # pipeline schedule operations: "F3", "B3 vs1"


def _span_kind(name: str, stream: str) -> str:
    # The stream first: a TP wait is named for the pass it belongs to ("F0: tensor-parallel collectives") and was
    # drawn as that pass's compute; TP collectives per layer were drawn as bucket all-reduces.
    if stream.startswith("comm tp"):
        return "tp"
    if _PIPE_OP.match(name):
        return "stage_forward" if name[0] == "F" else "stage_backward"
    if name.startswith("fwd"):
        return "forward"
    if name.startswith("bwd"):
        return "backward"
    if name.startswith("micro-batch"):
        return "accumulation"
    if name.startswith("optimizer"):
        return "optimizer"
    if name.startswith("all-gather"):
        return "gather"
    if stream == "comm" or "reduce" in name:
        return "comm"
    return "other"


_KIND_LABEL = {
    "forward": "forward per layer",
    "backward": "backward per layer",
    "stage_forward": "forward of a micro-batch (pipeline)",
    "stage_backward": "backward of a micro-batch (pipeline)",
    "accumulation": "earlier micro-batches (no_sync)",
    "optimizer": "optimizer step",
    "comm": "bucket all-reduce / reduce-scatter",
    "tp": "tensor-parallel collectives",
    "gather": "parameter all-gather",
    "other": "other",
}


def _stream_order(name: str) -> tuple[int, int, str]:
    """compute, comm; with a pipeline: compute 0, comm 0, compute 1, ... (stage by stage)."""
    m = re.search(r"(\d+)$", name)
    return (int(m.group(1)) if m else -1, 0 if name.startswith("compute") else 1, name)


def timeline(trace: Trace, x_range_s: tuple[float, float] | None = None, title: str = "Timeline") -> go.Figure:
    """Gantt chart: one row per stream (compute, comm, pipeline stages when present), spans as bars."""
    streams = sorted({s.stream for s in trace.spans}, key=_stream_order)
    by_kind: dict[str, list[Any]] = {}
    for s in trace.spans:
        by_kind.setdefault(_span_kind(s.name, s.stream), []).append(s)
    fig = go.Figure()
    for kind, spans in by_kind.items():
        detail = []
        for s in spans:
            extra = ""
            if "size_bytes" in s.args:
                extra = f"<br>{units.fmt_bytes(s.args['size_bytes'])}, {s.args.get('algorithm', '')}"
            detail.append(f"{s.name}<br>start {s.start_s / MS:.3f} ms, {units.fmt_time(s.end_s - s.start_s)}{extra}")
        fig.add_bar(
            y=[s.stream for s in spans],
            x=[(s.end_s - s.start_s) / MS for s in spans],
            base=[s.start_s / MS for s in spans],
            orientation="h",
            name=_KIND_LABEL.get(kind, kind),
            marker={"color": COLORS.get(kind, COLORS["other"]), "line": {"width": 0.5, "color": "white"}},
            hovertext=detail,
            hoverinfo="text",
            text=[s.name if _PIPE_OP.match(s.name) else "" for s in spans],
            textposition="inside",
            insidetextanchor="middle",
        )
    fig.update_layout(barmode="overlay", title=title, xaxis_title="time (ms)", height=190 + 60 * len(streams),
                      yaxis={"categoryorder": "array", "categoryarray": streams[::-1]}, **_LAYOUT)
    fig.update_layout(legend={"y": -0.5 if len(streams) <= 2 else -0.15})
    if x_range_s is not None:
        fig.update_xaxes(range=[x_range_s[0] / MS, x_range_s[1] / MS])
    return fig


def last_backward_window(trace: Trace) -> tuple[float, float]:
    """From the start of the last micro-batch's forward to the end of the trace (the part DDP overlaps)."""
    fwd = [s.start_s for s in trace.spans if s.name.startswith("fwd ")]
    start = min(fwd) if fwd else 0.0  # a pipeline schedule interleaves micro-batches: the whole step
    end = max(s.end_s for s in trace.spans)
    return start, end


def bucket_table(result: StepResult) -> Any:
    """Per-bucket timings in display units (ms, MiB)."""
    df = result.to_dataframe()
    if df.empty:
        return df
    out = df[["index", "num_params", "algorithm", "protocol"]].copy()
    out["size (MiB)"] = df["size_bytes"] / units.MiB
    for col in ("ready_s", "start_s", "end_s"):
        out[col.replace("_s", " (ms)")] = df[col] / MS
    out["waited (ms)"] = (df["start_s"] - df["ready_s"]) / MS
    out["duration (ms)"] = (df["end_s"] - df["start_s"]) / MS
    return out


# ------------------------------------------------------------------------------------------ scaling
def scaling(sweep: ScalingSweep, mark_gpus: Sequence[int] = (128,)) -> go.Figure:
    """Step time and tokens/s (left); exposed communication and scaling efficiency (right), log2 GPUs."""
    pts = [p for p in sweep.points if p.ok]
    gpus = [p.num_gpus for p in pts]
    fig = make_subplots(rows=1, cols=2, specs=[[{"secondary_y": True}, {}]],
                        subplot_titles=("Step time and throughput", "Communication overhead and efficiency"))
    fig.add_scatter(x=gpus, y=[_ms(p.step_time_s) for p in pts], name="step time (ms)", mode="lines+markers",
                    line_color=COLORS["compute"], row=1, col=1, secondary_y=False)
    fig.add_scatter(x=gpus, y=[p.tokens_per_s for p in pts], name="tokens/s", mode="lines+markers",
                    line={"color": COLORS["other"], "dash": "dot"}, row=1, col=1, secondary_y=True)
    fig.add_scatter(x=gpus, y=[100 * (p.exposed_comm_fraction or 0) for p in pts], name="exposed comm (% of step)",
                    mode="lines+markers", line_color=COLORS["exposed"], row=1, col=2)
    fig.add_scatter(x=gpus, y=[100 * (p.scaling_efficiency or 0) for p in pts], name="scaling efficiency (%)",
                    mode="lines+markers", line_color=COLORS["optimizer"], row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(type="log", tickvals=gpus, ticktext=[str(g) for g in gpus], title_text="GPUs",
                         row=1, col=col)
    fig.update_yaxes(title_text="step time (ms)", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="tokens/s", type="log", dtick=1, exponentformat="SI", row=1, col=1,
                     secondary_y=True)
    fig.update_yaxes(title_text="%", range=[0, 105], row=1, col=2)
    for g in sorted({*mark_gpus, sweep.reference_num_gpus}):
        if any(p.num_gpus == g for p in pts):
            _mark_x(fig, g, f"{g} GPUs", cols=(1, 2))
    fig.update_layout(height=420, **_LAYOUT)
    return fig


def scaling_table(sweep: ScalingSweep) -> Any:
    df = sweep.to_dataframe()
    out = df[["num_gpus", "num_nodes", "dp", "global_batch_size"]].copy()
    out["step time (ms)"] = df["step_time_s"] / MS
    out["exposed comm (%)"] = 100 * df["exposed_comm_fraction"]
    out["tokens/s"] = df["tokens_per_s"]
    out["MFU (%)"] = 100 * df["mfu"]
    out["scaling efficiency (%)"] = 100 * df["scaling_efficiency"]
    out["note"] = df["error"].fillna("")
    return out


# ------------------------------------------------------------------------------------------ what-if
def bucket_sweep(sweep: BucketCapSweep, current_cap_mb: float | None = None) -> go.Figure:
    """Step time and exposed communication against the DDP bucket cap (log scale)."""
    pts = [p for p in sweep.points if p.ok]
    caps = [p.bucket_cap_mb for p in pts]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=caps, y=[_ms(p.step_time_s) for p in pts], name="step time (ms)", mode="lines+markers",
                    line_color=COLORS["compute"], secondary_y=False,
                    customdata=[p.num_buckets for p in pts],
                    hovertemplate="%{x} MiB: %{y:.2f} ms, %{customdata} buckets<extra></extra>")
    fig.add_scatter(x=caps, y=[_ms(p.exposed_comm_time_s) for p in pts], name="exposed comm (ms)",
                    mode="lines+markers", line_color=COLORS["exposed"], secondary_y=True)
    if current_cap_mb is not None:
        _mark_x(fig, current_cap_mb, f"{current_cap_mb:g} MiB")
    fig.update_xaxes(type="log", title_text="bucket_cap_mb (MiB)")
    fig.update_yaxes(title_text="step time (ms)", secondary_y=False)
    fig.update_yaxes(title_text="exposed comm (ms)", rangemode="tozero", secondary_y=True)
    fig.update_layout(title="Bucket-cap sweep", height=380, **_LAYOUT)
    return fig


#: Grid metrics: (StepResult-derived point field, label, display scale, number format).
GRID_METRICS: dict[str, tuple[str, str, float, str]] = {
    "step time (ms)": ("step_time_s", "step time (ms)", 1 / MS, ".1f"),
    "exposed comm (%)": ("exposed_comm_fraction", "exposed comm (%)", 100.0, ".1f"),
    "tokens/s": ("tokens_per_s", "tokens/s", 1.0, ",.0f"),
    "MFU (%)": ("mfu", "MFU (%)", 100.0, ".1f"),
    "scaling efficiency (%)": ("scaling_efficiency", "scaling efficiency (%)", 100.0, ".1f"),
}


def heatmap(grid: GridSweep, metric: str, x_label: str, y_label: str,
            x_text: Sequence[str] | None = None, y_text: Sequence[str] | None = None) -> go.Figure:
    """A metric over every (x, y) pair of a grid sweep; invalid variants are blank with their error on hover."""
    field, label, scale, fmt = GRID_METRICS[metric]
    nx = len(grid.x_values)
    z: list[list[float | None]] = []
    hover: list[list[str]] = []
    for j in range(len(grid.y_values)):
        row, row_hover = [], []
        for i in range(nx):
            p = grid.points[j * nx + i]
            v = getattr(p, field)
            row.append(None if v is None else v * scale)
            row_hover.append(p.error or f"{label}: {v * scale:{fmt}}")
        z.append(row)
        hover.append(row_hover)
    xs = list(x_text) if x_text is not None else [str(v) for v in grid.x_values]
    ys = list(y_text) if y_text is not None else [str(v) for v in grid.y_values]
    text = [[("" if v is None else f"{v:{fmt}}") for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=z, x=xs, y=ys, text=text, texttemplate="%{text}", hovertext=hover,
                               hoverinfo="text", colorscale="RdYlGn_r" if field in ("step_time_s",
                               "exposed_comm_fraction") else "RdYlGn", colorbar={"title": label}))
    fig.update_layout(title=f"{label} over {x_label} x {y_label}", xaxis_title=x_label, yaxis_title=y_label,
                      xaxis_type="category", yaxis_type="category", height=460,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def delta_table(rows: Mapping[str, tuple[float, float]]) -> Any:
    import pandas as pd

    return pd.DataFrame([{"metric": k, "planner": a, "what-if": b} for k, (a, b) in rows.items()])


# ------------------------------------------------------------------------------------------ compare
def compare(results: Mapping[str, StepResult]) -> go.Figure:
    """Stacked step breakdown of each saved scenario, side by side."""
    names = list(results)
    fig = go.Figure()
    for key, label, color in _parts([results[n] for n in names]):
        fig.add_bar(x=names, y=[results[n].part(key) / MS for n in names], name=label, marker_color=COLORS[color])
    fig.update_layout(barmode="stack", title="Step time by scenario", yaxis_title="ms", height=420, **_LAYOUT)
    return fig


def compare_table(results: Mapping[str, StepResult], memory_gib: Mapping[str, float | None] | None = None) -> Any:
    import pandas as pd

    rows = []
    for name, r in results.items():
        row = {
            "scenario": name,
            "model": r.model,
            "cluster": r.cluster,
            "GPUs": r.num_gpus,
            "dp x tp x pp": f"{r.dp} x {r.tp} x {r.pp}",
            "global batch": r.global_batch_size,
            "step time (ms)": r.step_time_s / MS,
            "exposed comm (%)": 100 * r.exposed_comm_fraction,
            "tokens/s": r.tokens_per_s,
            "MFU (%)": 100 * r.mfu,
            "scaling efficiency (%)": 100 * r.scaling_efficiency,
        }
        if memory_gib is not None:
            row["memory / GPU (GiB)"] = memory_gib.get(name)
        rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ memory
MEMORY_PARTS = [
    ("parameters", "params_bytes", "#4C78A8"),
    ("gradients", "grads_bytes", "#F58518"),
    ("optimizer (master + states)", "optimizer_bytes", "#B279A2"),
    ("activations", "activations_bytes", "#54A24B"),
    ("buffers", "buffers_bytes", "#EECA3B"),
    ("overhead", "overhead_bytes", "#BAB0AC"),
]


def memory_strategies(sweep: StrategySweep) -> go.Figure:
    """Stacked memory per GPU of each strategy, side by side, with the device capacity as a line."""
    pts = [p for p in sweep.points if p.ok and p.memory_bytes is not None]
    names = [p.strategy for p in pts]
    fig = go.Figure()
    for label, field, color in MEMORY_PARTS:
        fig.add_bar(x=names, y=[getattr(p, field) / units.GiB for p in pts], name=label, marker_color=color,
                    hovertemplate=f"{label}: %{{y:.2f}} GiB<extra></extra>")
    totals = [(p.memory_bytes or 0) / units.GiB for p in pts]
    fig.add_scatter(x=names, y=totals, mode="text", showlegend=False,
                    text=[f"{t:.1f} GiB" + ("" if p.memory_fits else " ✗") for t, p in zip(totals, pts, strict=True)],
                    textposition="top center", hoverinfo="skip")
    capacity = next((p.capacity_bytes for p in pts if p.capacity_bytes), None)
    if capacity:
        fig.add_hline(y=capacity / units.GiB, line_dash="dash", line_color="#E45756",
                      annotation_text=f"capacity {capacity / units.GiB:.1f} GiB", annotation_position="top right")
    fig.update_layout(barmode="stack", title="Memory per GPU by strategy", yaxis_title="GiB", height=460,
                      **_LAYOUT)
    return fig


def strategy_table(sweep: StrategySweep) -> Any:
    df = sweep.to_dataframe()
    out = df[["strategy", "dp", "tp", "pp", "zero_stage"]].copy()
    out["memory / GPU (GiB)"] = df["memory_bytes"] / units.GiB
    out["fits"] = df["memory_fits"]
    out["step time (ms)"] = df["step_time_s"] / MS
    out["exposed comm (%)"] = 100 * df["exposed_comm_fraction"]
    out["tokens/s"] = df["tokens_per_s"]
    out["note"] = df["error"].fillna("")
    return out


def layout_table(search: Any) -> Any:
    """Every layout a LayoutSearch evaluated, memory in GiB (fitting first, most preferred first)."""
    df = search.to_dataframe()
    out = df[["fits", "zero_stage", "tp", "pp", "dp", "sequence_parallel", "recompute"]].copy()
    out["memory / GPU (GiB)"] = df["total_bytes"] / units.GiB
    return out


def memory_items(memory: Any) -> Any:
    """A MemoryBreakdown's items in GiB."""
    df = memory.to_dataframe()
    if df.empty:
        return df
    out = df[["category", "name"]].copy()
    out["GiB"] = df["size_bytes"] / units.GiB
    out["note"] = df["note"]
    return out


# ------------------------------------------------------------------------------------------ plan
def plan_table(result: Any) -> Any:
    """The planner's ranked layouts: rank, layout, step time (ms), tokens/s, MFU (%), memory (GiB)."""
    import pandas as pd

    rows = [{"rank": k, "tp": lay.tp, "pp": lay.pp, "virtual stages": lay.virtual_stages, "dp": lay.dp,
             "ZeRO": lay.zero_stage, "micro-batch": lay.micro_batch_size, "recompute": lay.recompute,
             "sequence parallel": lay.sequence_parallel, "bucket cap (MiB)": lay.bucket_cap_mb,
             "step time (ms)": _ms(lay.step_time_s), "tokens/s": lay.tokens_per_s,
             "MFU (%)": None if lay.mfu is None else 100 * lay.mfu, "memory / GPU (GiB)": lay.memory_bytes / units.GiB}
            for k, lay in enumerate(result.layouts, start=1)]
    return pd.DataFrame(rows)


def plan_front(result: Any, capacity_bytes: float | None = None) -> go.Figure:
    """Step time against memory per GPU of every simulated layout, the Pareto front joined, the top ranked."""
    def label(lay: Any) -> str:
        v = f" v{lay.virtual_stages}" if lay.virtual_stages > 1 else ""
        return (f"tp{lay.tp} pp{lay.pp}{v} dp{lay.dp} ZeRO-{lay.zero_stage} mbs{lay.micro_batch_size} "
                f"{lay.recompute}{' SP' if lay.sequence_parallel else ''} {lay.bucket_cap_mb:g}MiB")

    fig = go.Figure()
    every = result.simulated_layouts
    fig.add_trace(go.Scatter(x=[lay.memory_bytes / units.GiB for lay in every],
                             y=[_ms(lay.step_time_s) for lay in every], mode="markers", name="simulated layouts",
                             marker={"color": COLORS["compute"], "size": 7, "opacity": 0.6},
                             text=[label(lay) for lay in every], hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:.1f} ms"))
    if result.front:
        fig.add_trace(go.Scatter(x=[lay.memory_bytes / units.GiB for lay in result.front],
                                 y=[_ms(lay.step_time_s) for lay in result.front], mode="lines+markers",
                                 name="Pareto front (no layout is both faster and smaller)"
                                 + ("" if result.exact_front else ", of the simulated layouts"), line={"shape": "hv"},
                                 marker={"color": COLORS["exposed"], "size": 9},
                                 text=[label(lay) for lay in result.front],
                                 hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:.1f} ms"))
    top = result.layouts
    fig.add_trace(go.Scatter(x=[lay.memory_bytes / units.GiB for lay in top], y=[_ms(lay.step_time_s) for lay in top],
                             mode="markers+text", name="ranked", text=[str(k) for k in range(1, len(top) + 1)],
                             textposition="top center", marker={"symbol": "star", "size": 12, "color": COLORS["other"]},
                             hoverinfo="skip"))
    if capacity_bytes:
        fig.add_vline(x=capacity_bytes / units.GiB, line={"dash": "dash", "color": "grey", "width": 1},
                      annotation_text="GPU memory", annotation_position="top left")
    fig.update_layout(title="Step time against memory per GPU", xaxis_title="memory per GPU (GiB)",
                      yaxis_title="step time (ms)", **_LAYOUT)
    return fig


# ------------------------------------------------------------------------------------------ calibration
def collective_fits(profile: Any) -> go.Figure:
    """Measured collective times against each fitted alpha-beta segment (log-log), per op and communicator."""
    fig = go.Figure()
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#B279A2", "#72B7B2", "#EECA3B", "#9D755D"]
    groups = list(dict.fromkeys((r.fit.op, r.group) for r in profile.fits))
    for k, (op, group) in enumerate(groups):
        color = palette[k % len(palette)]
        reports = [r for r in profile.fits if (r.fit.op, r.group) == (op, group)]
        pts = sorted(p for r in reports for p in r.points)
        label = f"{op}, {group} ({reports[0].fit.measured_ranks} ranks)"
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1] / units.US for p in pts], mode="markers", name=label,
                        marker={"color": color, "size": 8}, legendgroup=label,
                        hovertemplate="%{x} B: measured %{y:.1f} us<extra></extra>")
        for r in reports:
            seg = sorted(r.points)
            fig.add_scatter(x=[p[0] for p in seg], y=[p[2] / units.US for p in seg], mode="lines",
                            line={"color": color}, legendgroup=label, showlegend=False,
                            hovertemplate=(f"fit: {r.fit.latency_per_step_s / units.US:.2f} us/step, "
                                           f"{r.fit.bus_bandwidth_bytes_per_s / units.GB:.2f} GB/s busbw, "
                                           f"R² {r.r2:.3f}<extra></extra>"))
    fig.update_xaxes(type="log", title_text="message size (bytes)")
    fig.update_yaxes(type="log", title_text="time (us)")
    fig.update_layout(title="Collectives: measured (points) vs fitted model (lines)", height=460, **_LAYOUT)
    return fig


def fit_table(profile: Any) -> Any:
    import pandas as pd

    return pd.DataFrame([
        {
            "op": r.fit.op,
            "group": r.group,
            "tier": r.fit.tier,
            "ranks": r.fit.measured_ranks,
            "sizes": f"{units.fmt_bytes(r.fit.min_bytes)} .. {units.fmt_bytes(r.fit.max_bytes)}",
            "points": r.num_points,
            "latency / step (us)": r.fit.latency_per_step_s / units.US,
            "busbw (GB/s)": r.fit.bus_bandwidth_bytes_per_s / units.GB,
            "R²": r.r2,
            "rel. residual (%)": 100 * r.fit.rel_residual,
        }
        for r in profile.fits
    ])


def _cap_label(cap: float | None) -> str:
    return "default" if cap is None else f"{cap:g} MiB"


def validation(report: Any) -> go.Figure:
    """Measured DDP step (median, p10..p90) against the simulator's prediction (with its band) per bucket cap."""
    cases = report.cases
    labels = [_cap_label(c.bucket_cap_mb) for c in cases]
    measured = [c.measured_s / MS for c in cases]
    predicted = [c.prediction.step_time_s / MS for c in cases]
    fig = go.Figure()
    fig.add_bar(x=labels, y=measured, name="measured (median, p10..p90)", marker_color=COLORS["compute"],
                error_y={"type": "data", "symmetric": False,
                         "array": [c.measured_p90_s / MS - m for c, m in zip(cases, measured, strict=True)],
                         "arrayminus": [m - c.measured_p10_s / MS for c, m in zip(cases, measured, strict=True)]})
    fig.add_bar(x=labels, y=predicted, name="simddp (band)", marker_color=COLORS["comm"],
                text=[f"{c.error:+.1%}" for c in cases], textposition="outside",
                error_y={"type": "data", "symmetric": False,
                         "array": [c.prediction.high_s / MS - p for c, p in zip(cases, predicted, strict=True)],
                         "arrayminus": [p - c.prediction.low_s / MS for c, p in zip(cases, predicted, strict=True)]})
    fig.update_layout(barmode="group", title=f"DDP step: measured vs model (MAPE {report.mape:.1%})",
                      xaxis_title="bucket_cap_mb", yaxis_title="step time (ms)", height=420, **_LAYOUT)
    return fig


def validation_table(report: Any) -> Any:
    import pandas as pd

    return pd.DataFrame([
        {
            "bucket cap": _cap_label(c.bucket_cap_mb),
            "buckets (measured / model)": f"{c.measured_num_buckets} / {c.prediction.num_buckets}",
            "measured (ms)": c.measured_s / MS,
            "p10 .. p90 (ms)": f"{c.measured_p10_s / MS:.2f} .. {c.measured_p90_s / MS:.2f}",
            "simddp (ms)": c.prediction.step_time_s / MS,
            "band (ms)": f"{c.prediction.low_s / MS:.2f} .. {c.prediction.high_s / MS:.2f}",
            "error (%)": 100 * c.error,
        }
        for c in report.cases
    ])


def knob_checks_table(report: Any) -> Any:
    """The DDP options measured as paired differences against plain DDP (``simddp calibrate validate``'s table)."""
    import pandas as pd

    return pd.DataFrame([
        {"DDP option (against plain DDP)": k.setting, "predicted (ms)": k.predicted_s / MS,
         "measured median (ms)": k.measured_median_s / MS, "p25 (ms)": k.measured_p25_s / MS,
         "p75 (ms)": k.measured_p75_s / MS, "pairs": k.num_pairs}
        for k in report.knobs
    ])


def extrapolation(predictions: Sequence[Any], measured_ranks: int | None = None) -> go.Figure:
    """Predicted step time against data-parallel ranks, with the calibration's uncertainty band."""
    xs = [p.world_size for p in predictions]
    fig = go.Figure()
    fig.add_scatter(x=xs, y=[p.high_s / MS for p in predictions], mode="lines", line={"width": 0},
                    showlegend=False, hoverinfo="skip")
    fig.add_scatter(x=xs, y=[p.low_s / MS for p in predictions], mode="lines", fill="tonexty", line={"width": 0},
                    name="band", fillcolor="rgba(245,133,24,0.25)")
    fig.add_scatter(x=xs, y=[p.step_time_s / MS for p in predictions], mode="lines+markers", name="predicted step",
                    line_color=COLORS["comm"])
    fig.add_scatter(x=xs, y=[p.exposed_comm_time_s / MS for p in predictions], mode="lines+markers",
                    name="exposed comm", line={"color": COLORS["exposed"], "dash": "dot"})
    if measured_ranks is not None and measured_ranks in xs:
        _mark_x(fig, measured_ranks, f"measured on {measured_ranks}")
    fig.update_xaxes(type="log", tickvals=xs, ticktext=[str(x) for x in xs], title_text="data-parallel ranks")
    fig.update_layout(title="Extrapolation from the calibration", yaxis_title="ms", height=400, **_LAYOUT)
    return fig


# ---------------------------------------------------------------------------------------- variability
def step_histogram(result: Any) -> go.Figure:
    """Monte Carlo step times (ms) with the simulated step, p50 and p99 marked."""
    ms = [t / MS for t in result.step_times_s]
    fig = go.Figure(go.Histogram(x=ms, nbinsx=40, marker_color=COLORS["compute"], name="steps"))
    for x, text, color in ((result.p50_s / MS, "p50", "#54A24B"), (result.p99_s / MS, "p99", "#E45756"),
                           (result.deterministic_step_s / MS, "simulated", "grey")):
        fig.add_vline(x=x, line={"dash": "dash", "color": color, "width": 2})
        fig.add_annotation(x=x, y=1, yref="paper", text=f"{text} {x:.4g} ms", showarrow=False, xanchor="left",
                           yanchor="top", font={"size": 11, "color": color})
    fig.update_layout(title=f"Step time over {result.num_steps} Monte Carlo steps, {result.num_ranks:,} ranks",
                      xaxis_title="step time (ms)", yaxis_title="steps", height=380, bargap=0.05, **_LAYOUT)
    return fig


def tails_vs_ranks(points: Sequence[Any]) -> go.Figure:
    """p99, p50 and the simulated step against the number of GPUs (weak scaling, log2 x)."""
    gpus = [p.num_gpus for p in points]
    fig = go.Figure()
    fig.add_scatter(x=gpus, y=[p.p99_s / MS for p in points], name="p99", mode="lines+markers",
                    line_color=COLORS["exposed"])
    fig.add_scatter(x=gpus, y=[p.p50_s / MS for p in points], name="p50", mode="lines+markers",
                    line_color=COLORS["other"])
    fig.add_scatter(x=gpus, y=[p.deterministic_step_s / MS for p in points], name="simulated (no variation)",
                    mode="lines+markers", line={"color": "grey", "dash": "dot"})
    fig.update_xaxes(type="log", tickvals=gpus, ticktext=[str(g) for g in gpus], title_text="GPUs")
    fig.update_yaxes(title_text="step time (ms)", rangemode="tozero")
    fig.update_layout(title="p99 step time against the number of GPUs", height=380, **_LAYOUT)
    return fig


def sync_point_table(result: Any) -> Any:
    import pandas as pd

    return pd.DataFrame([{"synchronisation point": w.label, "wait per step (ms)": w.wait_s / MS,
                          "share of the tail (%)": 100 * w.share} for w in result.sync_points])


# ------------------------------------------------------------------------------------------------ run
def goodput_curve(result: Any) -> go.Figure:
    """Goodput against the checkpoint interval (log x), the chosen interval marked."""
    xs = [p.checkpoint_interval_s / units.MINUTE for p in result.curve]
    fig = go.Figure(go.Scatter(x=xs, y=[100 * p.goodput for p in result.curve], mode="lines",
                               line_color=COLORS["compute"], name="goodput"))
    chosen = result.checkpoint_interval_s / units.MINUTE
    fig.add_scatter(x=[chosen], y=[100 * result.goodput], mode="markers", marker={"size": 11, "color": "#E45756"},
                    name="chosen interval")
    _mark_x(fig, chosen, f"{chosen:.3g} min")
    fig.update_xaxes(type="log", title_text="checkpoint interval (minutes of training)")
    fig.update_yaxes(title_text="goodput (%)")
    fig.update_layout(title="Goodput against the checkpoint interval", height=380, **_LAYOUT)
    return fig


def run_table(result: Any) -> Any:
    import pandas as pd

    rows = [
        ("training, no failures (days)", result.training_days),
        ("wall clock (days)", result.days),
        ("GPU-hours", result.gpu_hours),
        ("cost (USD)", result.cost),
        ("expected failures", result.expected_failures),
        ("job MTBF (hours)", result.mtbf_s / units.HOUR),
        ("checkpoint size (TB)", result.checkpoint_bytes / units.TB),
        ("checkpoint, rank 0 alone (s)", result.checkpoint_time_rank0_s),
        ("checkpoint, sharded (s)", result.checkpoint_time_sharded_s),
        ("checkpoint interval (min)", result.checkpoint_interval_s / units.MINUTE),
        ("Young's interval (min)", result.young_interval_s / units.MINUTE),
        ("restart per failure (min)", result.restart_s / units.MINUTE),
        ("start-up broadcast (s)", result.startup_s),
        ("tokens/s", result.tokens_per_s),
        ("TFLOP/s per GPU", result.achieved_flop_per_s_per_gpu / units.TFLOP),
        ("goodput (%)", 100 * result.goodput),
    ]
    return pd.DataFrame({"figure": [r[0] for r in rows], "value": [r[1] for r in rows]})


# ---------------------------------------------------------------------------------------------- knobs
def knob_chart(table: Any) -> go.Figure:
    """Step time change of each DDP knob (% of its baseline)."""
    rows = [r for r in table.rows if r.step_time_s is not None and r.baseline_s]
    fig = go.Figure(go.Bar(
        x=[100 * (r.delta_s or 0.0) / r.baseline_s for r in rows], y=[f"{r.knob} = {r.setting}" for r in rows],
        orientation="h", marker_color=[COLORS["exposed"] if (r.delta_s or 0) > 0 else COLORS["other"] for r in rows],
        text=[f"{100 * (r.delta_s or 0.0) / r.baseline_s:+.2f}%" for r in rows], textposition="auto"))
    fig.update_layout(title="Step time change of each DDP knob", xaxis_title="% of the step without it",
                      height=120 + 45 * len(rows), **_LAYOUT)
    return fig


def knob_frame(table: Any) -> Any:
    import pandas as pd

    return pd.DataFrame([{"knob": r.knob, "setting": r.setting,
                          "step (ms)": None if r.step_time_s is None else r.step_time_s / MS,
                          "baseline (ms)": None if r.baseline_s is None else r.baseline_s / MS,
                          "change (ms)": None if r.delta_s is None else r.delta_s / MS,
                          "where": r.moved, "note": r.note} for r in table.rows])
