"""Per-layer workload: parameters, FLOP and memory traffic of one micro-batch on one GPU.

Transformer layers follow the FLOP accounting of Narayanan et al. (SC'21, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", eq. 3): a GEMM of an (m x k) input with a
(k x n) weight costs 2mkn FLOP forward, 2mkn for the input gradient (dgrad) and 2mkn for the weight
gradient (wgrad); attention scores and the weighted sum cost 4 s h per token forward and twice that
backward. Tensor parallelism divides GEMM and attention FLOP and the sharded weights by ``tp``
(Megatron column/row parallel linears, vocab-parallel embedding). Parameter names and their order follow
the Hugging Face implementations (GPT-2, BERT, Llama), so DDP buckets match what torch would build.

Models given as a parameter list use their layer FLOP when given, else the dense estimate of
2 x params x tokens per pass (Kaplan et al. 2020), split equally into forward, dgrad and wgrad.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simddp.config import ParameterSpec, Scenario, TransformerSpec
from simddp.units import dtype_bytes

#: Parameter dtype of transformer presets for each training precision (mixed precision keeps 16-bit
#: working weights and gradients beside fp32 master weights, as in the ZeRO paper's accounting).
PRECISION_PARAM_DTYPE = {"fp32": "float32", "bf16-mixed": "bfloat16", "fp16-mixed": "float16"}
PRECISION_ACT_BYTES = {"fp32": 4, "bf16-mixed": 2, "fp16-mixed": 2}


@dataclass(frozen=True)
class Layer:
    """One module's work for a micro-batch on one GPU.

    ``param_indices`` are the parameters whose gradient is complete once this layer's backward ends
    (a tied weight belongs to the layer that runs last in backward).
    """

    name: str
    param_indices: tuple[int, ...]
    fwd_flop: float
    dgrad_flop: float
    wgrad_flop: float
    fwd_bytes: float  # memory traffic of the forward kernel(s)
    bwd_bytes: float
    activation_bytes: int  # saved for backward (parameter-list models; transformers use memory.py)
    is_block: bool = False  # part of a transformer block (recompute applies)
    is_attention_core: bool = False
    stage: int = 0  # virtual pipeline stage (rank = stage % pp)
    tp_fwd_comm_bytes: int = 0  # tensor-parallel all-reduce after the forward (Megatron g / SP reduce-scatter)
    tp_bwd_comm_bytes: int = 0  # tensor-parallel all-reduce of the input gradient (Megatron f / SP all-gather)
    fwd_time_s: float | None = None  # measured (calibration) overrides the roofline
    bwd_time_s: float | None = None


@dataclass(frozen=True)
class Workload:
    """Parameters (in definition order), gradient-ready order and layers (in forward order) of one GPU."""

    parameters: tuple[ParameterSpec, ...]
    grad_ready_order: tuple[int, ...]
    layers: tuple[Layer, ...]
    tokens_per_micro_batch: int
    samples_per_micro_batch: int
    model_flop_per_sample: float  # whole model, fwd + bwd, no recompute, all tp ranks (for MFU)
    num_stages: int = 1  # virtual pipeline stages: pp x virtual_stages
    boundary_activation_bytes: int = 0  # sent between pipeline stages per micro-batch (per tp rank)
    notes: list[str] = field(default_factory=list)

    @property
    def num_params(self) -> int:
        return sum(p.numel for p in self.parameters)

    def stage_layers(self, stage: int) -> tuple[Layer, ...]:
        """Layers of one virtual stage, in forward order."""
        return tuple(layer for layer in self.layers if layer.stage == stage)

    def rank_layers(self, rank: int, pp: int) -> tuple[Layer, ...]:
        """Layers held by pipeline rank ``rank`` (all its virtual stages), in forward order."""
        return tuple(layer for layer in self.layers if layer.stage % pp == rank)


#: Floating dtypes narrower than fp32, whose gradients ``reduce_in_fp32`` all-reduces in fp32.
NARROW_FLOAT_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def grad_reduce_spec(p: ParameterSpec, reduce_in_fp32: bool) -> ParameterSpec:
    """The parameter as data-parallel reduction sees its gradient (Megatron ``grad_reduce_in_fp32``)."""
    if reduce_in_fp32 and p.dtype in NARROW_FLOAT_DTYPES:
        return p.model_copy(update={"dtype": "float32"})
    return p


def total_params(spec: TransformerSpec) -> int:
    """Parameter count of a transformer (no tensor parallelism)."""
    return sum(p.numel for p in _transformer_params(spec, 1, "float32")[0])


def build_workload(scenario: Scenario) -> Workload:
    """The per-GPU workload of ``scenario`` (its tp shard; every pipeline stage, tagged by ``stage``)."""
    tr = scenario.training
    if scenario.model.transformer is not None:
        return _transformer_workload(scenario, scenario.model.transformer)
    params = tuple(scenario.model.parameters or ())
    n = len(params)
    ready = tuple(scenario.model.grad_ready_order or range(n - 1, -1, -1))
    specs = scenario.model.layers
    act_bytes = PRECISION_ACT_BYTES[tr.precision]
    tokens = tr.micro_batch_size * tr.seq_len
    layers: list[Layer] = []
    if specs is None:
        # One layer per parameter, run forward in definition order... but backward must follow the
        # ready order, so forward order is the reverse of the ready order.
        for idx in reversed(ready):
            p = params[idx]
            flop = 2.0 * p.numel * tokens
            wbytes = p.numel * dtype_bytes(p.dtype)
            layers.append(Layer(p.name, (idx,), flop, flop, flop, wbytes, 2 * wbytes, 0))
    else:
        for spec in specs:
            numel = sum(params[i].numel for i in spec.param_indices)
            wbytes = sum(params[i].numel * dtype_bytes(params[i].dtype) for i in spec.param_indices)
            per_sample = spec.fwd_flop_per_sample
            fwd = per_sample * tr.micro_batch_size if per_sample is not None else 2.0 * numel * tokens
            act = (spec.activation_numel_per_sample or 0) * tr.micro_batch_size * act_bytes
            has_params = bool(spec.param_indices)
            layers.append(
                Layer(
                    spec.name,
                    tuple(spec.param_indices),
                    fwd,
                    fwd,
                    fwd if has_params else 0.0,
                    wbytes + act,
                    2 * (wbytes + act),
                    act,
                    fwd_time_s=spec.fwd_time_s,
                    bwd_time_s=spec.bwd_time_s,
                )
            )
    layers = _assign_stages(layers, scenario.parallelism.pp * scenario.parallelism.virtual_stages)
    flop_per_sample = sum(la.fwd_flop + la.dgrad_flop + la.wgrad_flop for la in layers) / tr.micro_batch_size
    return Workload(
        parameters=params,
        grad_ready_order=ready,
        layers=tuple(layers),
        tokens_per_micro_batch=tokens,
        samples_per_micro_batch=tr.micro_batch_size,
        model_flop_per_sample=flop_per_sample,
        num_stages=scenario.parallelism.pp * scenario.parallelism.virtual_stages,
    )


def _assign_stages(layers: list[Layer], pp: int) -> list[Layer]:
    """Split layers into ``pp`` contiguous stages with about equal parameter-free FLOP (greedy)."""
    if pp == 1:
        return layers
    total = sum(la.fwd_flop for la in layers) or 1.0
    out, acc = [], 0.0
    for i, la in enumerate(layers):
        remaining_layers = len(layers) - i
        stage = min(pp - 1, int(acc / total * pp))
        # Never leave a later stage empty.
        stage = max(stage, pp - remaining_layers)
        out.append(_replace(la, stage=stage))
        acc += la.fwd_flop
    return out


def _replace(layer: Layer, **changes: object) -> Layer:
    from dataclasses import replace

    return replace(layer, **changes)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ transformers
def _transformer_params(
    spec: TransformerSpec, tp: int, dtype: str
) -> tuple[list[ParameterSpec], dict[str, list[int]]]:
    """Per-GPU parameters in Hugging Face definition order, and the indices each module uses."""
    h, ffn, v = spec.hidden_size, spec.ffn_hidden_size, spec.vocab_size
    kv_dim = h // spec.num_heads * spec.kv_heads
    kv_shard = max(1, spec.kv_heads // tp) * (h // spec.num_heads)  # GQA with tp > kv_heads replicates
    q_shard = h // tp
    params: list[ParameterSpec] = []
    groups: dict[str, list[int]] = {}

    def add(module: str, name: str, numel: int) -> None:
        groups.setdefault(module, []).append(len(params))
        params.append(ParameterSpec(name=name, numel=numel, dtype=dtype))

    def norm(module: str, prefix: str) -> None:
        add(module, f"{prefix}.weight", h)
        if spec.norm == "layernorm":
            add(module, f"{prefix}.bias", h)

    llama = spec.gated_mlp
    if llama:
        add("embed", "model.embed_tokens.weight", v // tp * h)
    else:
        add("embed", "transformer.wte.weight", v // tp * h)
        if spec.position_embedding == "learned":
            add("embed", "transformer.wpe.weight", spec.max_position_embeddings * h)
        if spec.num_token_types:
            add("embed", "transformer.token_type_embeddings.weight", spec.num_token_types * h)
            norm("embed", "transformer.embeddings.LayerNorm")
    for i in range(spec.num_layers):
        if llama:
            p = f"model.layers.{i}"
            add(f"qkv.{i}", f"{p}.self_attn.q_proj.weight", q_shard * h)
            add(f"qkv.{i}", f"{p}.self_attn.k_proj.weight", kv_shard * h)
            add(f"qkv.{i}", f"{p}.self_attn.v_proj.weight", kv_shard * h)
            if spec.bias:
                for name, n in (("q_proj", q_shard), ("k_proj", kv_shard), ("v_proj", kv_shard)):
                    add(f"qkv.{i}", f"{p}.self_attn.{name}.bias", n)
            add(f"out.{i}", f"{p}.self_attn.o_proj.weight", h * q_shard)
            add(f"mlp_in.{i}", f"{p}.mlp.gate_proj.weight", ffn // tp * h)
            add(f"mlp_in.{i}", f"{p}.mlp.up_proj.weight", ffn // tp * h)
            add(f"mlp_out.{i}", f"{p}.mlp.down_proj.weight", h * ffn // tp)
            norm(f"norm1.{i}", f"{p}.input_layernorm")
            norm(f"norm2.{i}", f"{p}.post_attention_layernorm")
        else:
            p = f"transformer.h.{i}"
            norm(f"norm1.{i}", f"{p}.ln_1")
            add(f"qkv.{i}", f"{p}.attn.c_attn.weight", h * (q_shard + 2 * kv_shard))
            if spec.bias:
                add(f"qkv.{i}", f"{p}.attn.c_attn.bias", q_shard + 2 * kv_shard)
            add(f"out.{i}", f"{p}.attn.c_proj.weight", q_shard * h)
            if spec.bias:
                add(f"out.{i}", f"{p}.attn.c_proj.bias", h)
            norm(f"norm2.{i}", f"{p}.ln_2")
            add(f"mlp_in.{i}", f"{p}.mlp.c_fc.weight", h * ffn // tp)
            if spec.bias:
                add(f"mlp_in.{i}", f"{p}.mlp.c_fc.bias", ffn // tp)
            add(f"mlp_out.{i}", f"{p}.mlp.c_proj.weight", ffn // tp * h)
            if spec.bias:
                add(f"mlp_out.{i}", f"{p}.mlp.c_proj.bias", h)
    if spec.final_norm:
        norm("final_norm", "model.norm" if llama else "transformer.ln_f")
    if not spec.tied_embeddings:
        add("lm_head", "lm_head.weight", v // tp * h)
    del kv_dim
    return params, groups


def _transformer_workload(scenario: Scenario, spec: TransformerSpec) -> Workload:
    tr, par = scenario.training, scenario.parallelism
    tp = par.tp
    dtype = PRECISION_PARAM_DTYPE[tr.precision]
    a_bytes = PRECISION_ACT_BYTES[tr.precision]
    params, groups = _transformer_params(spec, tp, dtype)
    h, ffn, v, s = spec.hidden_size, spec.ffn_hidden_size, spec.vocab_size, tr.seq_len
    b = tr.micro_batch_size
    t = b * s  # tokens in the micro-batch
    kv_dim = h // spec.num_heads * spec.kv_heads
    wb = dtype_bytes(dtype)
    sp_div = tp if par.sequence_parallel else 1  # SP shards norms/dropouts along the sequence

    act_bytes = t * h * a_bytes if tp > 1 else 0  # one [s, b, h] activation, the TP collective's buffer

    def gemm(name: str, k: int, n: int, module: str | None, block: bool = True, tp_comm: str = "") -> Layer:
        """A (t x k) @ (k x n) GEMM, n sharded by tp.

        Megatron's column-parallel input (qkv, mlp_in) all-reduces its input gradient in backward; the
        row-parallel output (out_proj, mlp_out) all-reduces its output in forward (Shoeybi et al. 2019,
        "f" and "g"). With sequence parallelism these become all-gather + reduce-scatter of the same
        total bytes, which costs a ring all-reduce's time (Korthikanti et al. 2022).
        """
        flop = 2.0 * t * k * n / tp
        io = (t * k + t * n / tp) * a_bytes + k * n / tp * wb
        idx = tuple(groups.get(module, [])) if module else ()
        return Layer(
            name, idx, flop, flop, flop, io, 2 * io, 0, is_block=block,
            tp_fwd_comm_bytes=act_bytes if tp_comm == "fwd" else 0,
            tp_bwd_comm_bytes=act_bytes if tp_comm == "bwd" else 0,
        )

    def elementwise(name: str, module: str | None, width: int, block: bool = True) -> Layer:
        io = 2.0 * t * width * a_bytes / sp_div
        idx = tuple(groups.get(module, [])) if module else ()
        return Layer(name, idx, 0.0, 0.0, 0.0, io, 2 * io, 0, is_block=block)

    layers: list[Layer] = [elementwise("embed", "embed", h, block=False)]
    for i in range(spec.num_layers):
        attn_flop = 4.0 * t * s * h / tp
        attn_io = 4.0 * t * h / tp * a_bytes  # FlashAttention reads q, k, v and writes o once
        layers += [
            elementwise(f"layers.{i}.norm1", f"norm1.{i}", h),
            gemm(f"layers.{i}.qkv", h, h + 2 * kv_dim, f"qkv.{i}", tp_comm="bwd"),
            Layer(
                f"layers.{i}.attention",
                (),
                attn_flop,
                2 * attn_flop,
                0.0,
                attn_io,
                2 * attn_io,
                0,
                is_block=True,
                is_attention_core=True,
            ),
            gemm(f"layers.{i}.out_proj", h, h, f"out.{i}", tp_comm="fwd"),
            elementwise(f"layers.{i}.norm2", f"norm2.{i}", h),
            gemm(f"layers.{i}.mlp_in", h, ffn * (2 if spec.gated_mlp else 1), f"mlp_in.{i}", tp_comm="bwd"),
            gemm(f"layers.{i}.mlp_out", ffn, h, f"mlp_out.{i}", tp_comm="fwd"),
        ]
    layers.append(elementwise("final_norm", "final_norm", h, block=False))
    layers.append(gemm("lm_head", h, v, "lm_head" if not spec.tied_embeddings else None, block=False))
    loss_io = 2.0 * t * v / tp * 4  # fp32 logits read and written by the fused cross-entropy
    layers.append(Layer("loss", (), 0.0, 0.0, 0.0, loss_io, loss_io, 0))
    layers = _assign_stages_transformer(layers, par.pp * par.virtual_stages, spec.num_layers)

    # Gradient-ready order = reverse of execution order, parameter by parameter within a module.
    ready: list[int] = []
    for layer in reversed(layers):
        ready.extend(reversed(layer.param_indices))
    seen: set[int] = set()
    ready = [i for i in ready if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]
    assert sorted(ready) == list(range(len(params))), "every parameter belongs to one layer"

    flop_per_sample = tp * sum(la.fwd_flop + la.dgrad_flop + la.wgrad_flop for la in layers) / b
    notes = []
    if spec.kv_heads < tp:
        notes.append(f"num_kv_heads({spec.kv_heads}) < tp({tp}): K/V projections are replicated")
    return Workload(
        parameters=tuple(params),
        grad_ready_order=tuple(ready),
        layers=tuple(layers),
        tokens_per_micro_batch=t,
        samples_per_micro_batch=b,
        model_flop_per_sample=flop_per_sample,
        num_stages=par.pp * par.virtual_stages,
        boundary_activation_bytes=t * h * a_bytes // tp,  # Megatron scatter-gather p2p optimisation
        notes=notes,
    )


def _assign_stages_transformer(layers: list[Layer], pp: int, num_blocks: int) -> list[Layer]:
    """Blocks split evenly across stages (Megatron); embedding on the first, head and loss on the last."""
    if pp == 1:
        return layers
    out = []
    for la in layers:
        if la.name.startswith("layers."):
            block = int(la.name.split(".")[1])
            stage = block * pp // num_blocks
        else:
            stage = 0 if la.name == "embed" else pp - 1
        out.append(_replace(la, stage=stage))
    return out
