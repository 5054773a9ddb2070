"""Planner: pick a model, a cluster and a layout; see step time, communication, throughput and memory."""

from __future__ import annotations

import streamlit as st

import simddp
from simddp import units
from simddp.config import GPU, Cluster, DDPConfig, Link, Network, Parallelism, Training, TransformerSpec
from simddp.presets import CLUSTER_PRESETS, MODEL_PRESETS
from simddp.results import StepResult
from simddp.zero import describe, zero_rule
from simddp_app import charts, state, widgets
from simddp_app.widgets import field_help

CUSTOM_TRANSFORMER = "custom transformer"
CUSTOM_PARAMETERS = "custom parameter list"
CUSTOM_CLUSTER = "custom cluster (from the scenario)"
MODEL_KEY = "w:model"
CLUSTER_KEY = "w:cluster_preset"
GBS_AUTO_KEY = "w:gbs_auto"
GBS_KEY = "w:training.global_batch_size"
#: What a null bucket cap is, by the implementation's bucket rule (simddp.zero.zero_rule; DDPConfig.bucket_cap_mb).
_DEFAULT_CAP = {"torch": "default: 25 MiB after a 1 MiB first", "deepspeed": "default: 5e8 elements",
                "megatron": "default: max(4e7, 1e6 x dp) elements"}


def _on_model() -> None:
    choice = st.session_state[MODEL_KEY]
    data = state.scenario_dict()
    if choice == CUSTOM_TRANSFORMER:
        tf = state.last_valid_scenario().model.transformer
        if tf is None:  # from a parameter-list model (ResNet-50): start from the default scenario's shape (the
            # choice showed "custom transformer" and changed nothing, with no shape to edit)
            tf = simddp.scenario_from_dict(state.default_scenario_dict()).model.transformer
        if tf is not None:
            data["model"] = {"transformer": tf.model_dump()}
    elif choice != CUSTOM_PARAMETERS:
        data["model"] = {"preset": choice}
    state.set_scenario_dict(data)
    state.forget_widgets("w:model.")


def _on_cluster() -> None:
    if st.session_state[CLUSTER_KEY] == CUSTOM_CLUSTER:
        return
    data = state.scenario_dict()
    nodes = state.last_valid_scenario().cluster.num_nodes
    data["cluster"] = {"preset": st.session_state[CLUSTER_KEY], "num_nodes": nodes}
    state.set_scenario_dict(data)
    state.forget_widgets("w:cluster.")


def _on_gbs_auto() -> None:
    auto = st.session_state[GBS_AUTO_KEY]
    state.set_path("training.global_batch_size", None if auto else state.last_valid_scenario().global_batch_size)
    st.session_state.pop(GBS_KEY, None)


def headline(result: StepResult) -> None:
    """The headline metrics of the planner's scenario, in two rows of three."""
    rows = st.columns(3), st.columns(3)
    c = [*rows[0], *rows[1]]
    c[0].metric("Step time", units.fmt_time(result.step_time_s), help=StepResult.__doc__, border=True)
    c[1].metric("Exposed communication", f"{result.exposed_comm_fraction:.1%}",
                help=StepResult.model_fields["exposed_comm_time_s"].description, border=True)
    c[2].metric("Tokens / s", f"{result.tokens_per_s:,.0f}", border=True,
                help=f"{result.samples_per_s:,.1f} samples/s over {result.num_gpus} GPUs")
    c[3].metric("MFU", f"{result.mfu:.1%}", help=StepResult.model_fields["mfu"].description, border=True)
    c[4].metric("Scaling efficiency", f"{result.scaling_efficiency:.1%}",
                help=StepResult.model_fields["scaling_efficiency"].description, border=True)
    memory = getattr(result, "memory", None)
    if memory is not None:
        fits = "fits" if memory.fits else "does NOT fit"
        c[5].metric("Memory / GPU", f"{memory.total_bytes / units.GiB:.1f} GiB",
                    delta=f"{fits} (of {memory.capacity_bytes / units.GiB:.2f} GiB)",
                    delta_color="green" if memory.fits else "red", delta_arrow="off", border=True,
                    help=f"{memory.verdict()}. Parameters, gradients, optimizer state, activations, buffers and "
                         "overhead: see the Memory page.")
    else:
        c[5].metric("Memory / GPU", "n/a", help="The memory model is not available in this simddp.", border=True)


st.title("Planner")
st.caption("Pick a model and a cluster, a parallel layout and DDP options; every change re-simulates the step.")

data = state.scenario_dict()
scenario = state.current_scenario()
shown = scenario or state.last_valid_scenario()
result = state.simulate(data) if scenario is not None else None
if result is not None:
    widgets.fit_banner(result)
    left, right = st.columns([3, 2], gap="medium", vertical_alignment="center")
    with left:
        headline(result)
    with right:
        st.plotly_chart(charts.step_breakdown(result, compact=True), key="breakdown")
    st.caption(
        f"**{result.scenario}**: {result.model} on {shown.cluster.num_nodes} x {result.cluster} "
        f"({result.num_gpus} GPUs), dp={result.dp} tp={result.tp} pp={result.pp}, global batch "
        f"{result.global_batch_size} = {shown.training.micro_batch_size} x {result.num_micro_batches} "
        f"micro-batch(es) x dp; {len(result.buckets)} buckets"
    )

col_model, col_cluster, col_layout = st.columns(3, gap="medium", border=True)

# ---------------------------------------------------------------------------------- model & batch
with col_model:
    st.subheader("Model and batch")
    model_options = [*MODEL_PRESETS, CUSTOM_TRANSFORMER]
    if "parameters" in data.get("model", {}) and data["model"].get("parameters"):
        model_options.append(CUSTOM_PARAMETERS)
    m = data.get("model", {})
    current_model = m.get("preset") or (CUSTOM_TRANSFORMER if m.get("transformer") else CUSTOM_PARAMETERS)
    if MODEL_KEY not in st.session_state:
        st.session_state[MODEL_KEY] = current_model
    st.selectbox("Model", model_options, key=MODEL_KEY, on_change=_on_model,
                 format_func=lambda n: f"{n}: {MODEL_PRESETS[n].description}" if n in MODEL_PRESETS else n,
                 help="A model preset (its source is in `simddp presets`), or a transformer shape of your own.")
    tf = shown.model.transformer
    if current_model == CUSTOM_TRANSFORMER and tf is not None:
        c1, c2 = st.columns(2)
        for i, (label, name) in enumerate([("Layers", "num_layers"), ("Hidden size", "hidden_size"),
                                           ("Attention heads", "num_heads"), ("FFN hidden size", "ffn_hidden_size"),
                                           ("Vocabulary", "vocab_size")]):
            widgets.number(label, f"model.transformer.{name}", getattr(tf, name), model=TransformerSpec,
                           field=name, integer=True, min_value=1, step=1, where=(c1, c2)[i % 2])
        widgets.number("KV heads", "model.transformer.num_kv_heads", tf.kv_heads, model=TransformerSpec,
                       field="num_kv_heads", integer=True, min_value=1, step=1, where=c2)
        widgets.flag("SwiGLU MLP", "model.transformer.gated_mlp", tf.gated_mlp, model=TransformerSpec,
                     field="gated_mlp")
    elif tf is not None:
        st.caption(f"{tf.num_layers} layers, hidden {tf.hidden_size}, {tf.num_heads} heads "
                   f"({tf.kv_heads} KV), FFN {tf.ffn_hidden_size}, vocab {tf.vocab_size}")
    tr = shown.training
    c1, c2 = st.columns(2)
    widgets.choice("Precision", "training.precision", tr.precision, ["bf16-mixed", "fp16-mixed", "fp32"],
                   model=Training, field="precision", where=c1)
    widgets.choice("Optimizer", "training.optimizer", tr.optimizer,
                   ["adamw", "adam", "sgd", "sgd-momentum", "adafactor"], model=Training, field="optimizer",
                   where=c2)
    widgets.number("Micro-batch size", "training.micro_batch_size", tr.micro_batch_size, model=Training,
                   field="micro_batch_size", integer=True, min_value=1, step=1, where=c1)
    widgets.number("Sequence length", "training.seq_len", tr.seq_len, model=Training, field="seq_len",
                   integer=True, min_value=1, step=256, where=c2)
    if GBS_AUTO_KEY not in st.session_state:
        st.session_state[GBS_AUTO_KEY] = data.get("training", {}).get("global_batch_size") is None
    st.toggle("Global batch = micro-batch x dp", key=GBS_AUTO_KEY, on_change=_on_gbs_auto,
              help=field_help(Training, "global_batch_size"))
    if not st.session_state[GBS_AUTO_KEY]:
        widgets.number("Global batch size", "training.global_batch_size", shown.global_batch_size,
                       model=Training, field="global_batch_size", integer=True, min_value=1, step=64)
    widgets.choice("Activation recompute", "training.recompute", tr.recompute,
                   ["none", "selective", "selective-op", "full"], model=Training, field="recompute")

# ---------------------------------------------------------------------------------- cluster
with col_cluster:
    st.subheader("Cluster")
    cl = shown.cluster
    presets = list(CLUSTER_PRESETS)
    if not data.get("cluster", {}).get("preset"):
        presets.append(CUSTOM_CLUSTER)
    if CLUSTER_KEY not in st.session_state:
        st.session_state[CLUSTER_KEY] = data.get("cluster", {}).get("preset") or CUSTOM_CLUSTER
    st.selectbox("Cluster preset", presets, key=CLUSTER_KEY, on_change=_on_cluster,
                 format_func=lambda n: f"{n}: {CLUSTER_PRESETS[n].description}" if n in CLUSTER_PRESETS else n,
                 help="Node type; its values are filled from spec sheets and nccl-tests (override below).")
    c1, c2 = st.columns(2)
    widgets.number("Number of nodes", "cluster.num_nodes", cl.num_nodes, model=Cluster, field="num_nodes",
                   integer=True, min_value=1, max_value=4096, step=1, where=c1)
    widgets.number("GPUs per node", "cluster.gpus_per_node", cl.gpus_per_node, model=Cluster,
                   field="gpus_per_node", integer=True, min_value=1, max_value=64, step=1, where=c2)
    st.caption(f"{cl.num_gpus} x {cl.gpu.name}, {units.fmt_bytes(cl.gpu.hbm_bytes)} each; "
               f"{cl.intra_node.kind} {units.fmt_bandwidth(cl.intra_node.bandwidth_bytes_per_s)} per GPU; "
               f"{cl.inter_node.nics_per_node} x {cl.inter_node.nic_bandwidth_bytes_per_s / units.GBIT:.0f} Gbit/s "
               f"{cl.inter_node.kind} per node")
    with st.expander("Hardware details (override the preset)"):
        c1, c2 = st.columns(2)
        widgets.number("BF16 peak (TFLOP/s)", "cluster.gpu.peak_bf16_flop_per_s", cl.gpu.peak_bf16_flop_per_s,
                       model=GPU, field="peak_bf16_flop_per_s", scale=units.TFLOP, min_value=0.0, step=10.0,
                       fmt="%.1f", where=c1)
        widgets.number("GEMM ceiling (fraction of peak)", "cluster.gpu.matmul_ceiling_fraction",
                       cl.gpu.matmul_ceiling_fraction, model=GPU, field="matmul_ceiling_fraction", min_value=0.0,
                       max_value=1.0, step=0.05, fmt="%.2f", where=c2)
        widgets.number("HBM (GiB)", "cluster.gpu.hbm_bytes", cl.gpu.hbm_bytes, model=GPU,
                       field="hbm_bytes", scale=units.GiB, min_value=0.0, step=8.0, fmt="%.1f", where=c1)
        widgets.number("Host overhead (ms)", "cluster.host_overhead_s", cl.host_overhead_s, model=Cluster,
                       field="host_overhead_s", scale=units.MS, min_value=0.0, step=1.0, fmt="%.2f", where=c2)
        widgets.number("Intra-node bandwidth (GB/s)", "cluster.intra_node.bandwidth_bytes_per_s",
                       cl.intra_node.bandwidth_bytes_per_s, model=Link, field="bandwidth_bytes_per_s",
                       scale=units.GB, min_value=0.0, step=25.0, fmt="%.1f", where=c1)
        widgets.number("Intra-node latency (us)", "cluster.intra_node.latency_s", cl.intra_node.latency_s,
                       model=Link, field="latency_s", scale=units.US, min_value=0.0, step=0.5, fmt="%.2f",
                       where=c2)
        widgets.number("NICs per node", "cluster.inter_node.nics_per_node", cl.inter_node.nics_per_node,
                       model=Network, field="nics_per_node", integer=True, min_value=1, step=1, where=c1)
        widgets.number("NIC line rate (Gbit/s)", "cluster.inter_node.nic_bandwidth_bytes_per_s",
                       cl.inter_node.nic_bandwidth_bytes_per_s, model=Network, field="nic_bandwidth_bytes_per_s",
                       scale=units.GBIT, min_value=0.0, step=25.0, fmt="%.0f", where=c2)
        widgets.number("Network efficiency", "cluster.inter_node.efficiency", cl.inter_node.efficiency,
                       model=Network, field="efficiency", min_value=0.0, max_value=1.0, step=0.01, fmt="%.2f",
                       where=c1)
        widgets.number("Network latency (us)", "cluster.inter_node.latency_s", cl.inter_node.latency_s,
                       model=Network, field="latency_s", scale=units.US, min_value=0.0, step=1.0, fmt="%.1f",
                       where=c2)

# ---------------------------------------------------------------------------------- layout & DDP
with col_layout:
    st.subheader("Parallel layout and DDP")
    par = shown.parallelism
    c1, c2, c3 = st.columns([1, 1, 1.5])
    widgets.number("tp", "parallelism.tp", par.tp, model=Parallelism, field="tp", integer=True, min_value=1,
                   step=1, where=c1)
    widgets.number("pp", "parallelism.pp", par.pp, model=Parallelism, field="pp", integer=True, min_value=1,
                   step=1, where=c2)
    widgets.choice("ZeRO stage", "parallelism.zero_stage", par.zero_stage, [0, 1, 2, 3], model=Parallelism,
                   field="zero_stage", format_func=lambda z: {0: "0 (DDP)", 3: "3 (FSDP)"}.get(z, str(z)), where=c3)
    st.caption(f"dp = GPUs / (tp x pp) = {shown.dp}" if data.get("parallelism", {}).get("dp") is None
               else f"dp = {shown.dp} (set in the scenario)")
    if par.tp > 1:
        widgets.flag("Sequence parallel", "parallelism.sequence_parallel", par.sequence_parallel,
                     model=Parallelism, field="sequence_parallel")
    if par.pp > 1:
        c1, c2 = st.columns(2)
        widgets.choice("Pipeline schedule", "parallelism.pipeline_schedule", par.pipeline_schedule,
                       ["1f1b", "gpipe", "interleaved-1f1b"], model=Parallelism, field="pipeline_schedule", where=c1)
        widgets.number("Virtual stages", "parallelism.virtual_stages", par.virtual_stages, model=Parallelism,
                       field="virtual_stages", integer=True, min_value=1, step=1, where=c2)
    st.divider()
    ddp = shown.ddp
    rule = zero_rule(shown)  # the implementation's defaults, where the scenario leaves a key null
    widgets.choice("Data-parallel implementation", "ddp.implementation", ddp.implementation,
                   ["torch", "deepspeed", "megatron"], model=DDPConfig, field="implementation")
    c1, c2 = st.columns(2)
    # Null is the framework's own cap, shown as such (it showed 25 MiB, and choosing 25 then changed nothing:
    # DeepSpeed's default is 5e8 elements); emptying the field goes back to it.
    widgets.number("Bucket cap (MiB)", "ddp.bucket_cap_mb", ddp.bucket_cap_mb, model=DDPConfig,
                   field="bucket_cap_mb", min_value=0.0, step=5.0, fmt="%.1f", where=c1,
                   placeholder=_DEFAULT_CAP.get(rule.bucket_rule, "default"), nullable=True)
    widgets.choice("All-reduce algorithm", "ddp.algorithm", ddp.algorithm, ["auto", "ring", "tree", "hierarchical"],
                   model=DDPConfig, field="algorithm", where=c2)
    widgets.flag("Overlap communication with backward", "ddp.overlap", rule.overlap, model=DDPConfig, field="overlap",
                 follows_default=True)
    widgets.flag("Reduce in fp32", "ddp.reduce_in_fp32", rule.reduce_in_fp32, model=DDPConfig,
                 field="reduce_in_fp32", follows_default=True)
    st.caption(describe(rule))
    if rule.bucket_rule == "units":  # FSDP reduces per unit: a cap set here is read by nothing
        st.caption("The bucket cap is not read by this implementation: FSDP reduces each unit's gradients at once.")
    elif rule.bucket_rule == "megatron" and rule.bucket_numel is None:  # Megatron buckets only with overlap
        st.caption("The bucket cap is not read here: without overlap Megatron reduces the gradients in one bucket "
                   "(turn overlap on to bucket them).")
    if ddp.overlap is not None and ddp.overlap != rule.overlap:  # the toggle moved, the step did not
        st.caption(f"{rule.name} does not take ddp.overlap={ddp.overlap}: it "
                   f"{'overlaps' if rule.overlap else 'reduces after the backward'} as shown above.")

# ---------------------------------------------------------------------------------- details
if result is not None:
    b = result.bounds
    st.caption(f"Bounds: no overlap {units.fmt_time(b.no_overlap_s)}, perfect overlap "
               f"{units.fmt_time(b.perfect_overlap_s)}; optimizer {units.fmt_time(result.optimizer_time_s)}, "
               f"all communication {units.fmt_time(result.comm_time_s)}.")
    for note in result.not_modelled:
        st.info(f"Not modelled: {note}", icon=":material/info:")
