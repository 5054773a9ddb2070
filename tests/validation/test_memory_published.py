"""The memory model reproduces published formulas and figures (numbers, never formatted strings).

* ZeRO (Rajbhandari et al., SC'20): the 7.5B-parameter example at Nd = 64 (120 / 31.4 / 16.6 / 1.9 GB for
  baseline / stage 1 / 2 / 3) and the 7.5B column of Table 1, through a full simddp scenario.
* Korthikanti et al. 2022 (Table 2 and sec. 4): per-layer activations on the paper's model shapes (22B,
  GPT-3 175B, MT-NLG 530B, 1T), the 5as/h term (80 for GPT-3, 64 for MT-NLG), the 70% / 65% that
  selective recompute saves, and the ~5x reduction of sequence parallelism + selective recompute.
* Megatron-LM's theoretical memory report (megatron/training/theoretical_memory_usage.py) and
  DeepSpeed's estimators (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py; docs/code-docs memory.rst):
  re-stated below as reference formulas; where simddp differs, the difference is asserted exactly and
  explained in docs/memory.md.
* Measured peaks of real runs: torchtitan's Llama 3.1 8B / 70B / 405B runs on H100 (benchmarks/
  llama3_h100_202412_torchtitan.md) and simddp's own single-GPU training steps on an H100
  (benchmarks/data/h100_kernels.json, ``memory``): every run that trained is predicted to fit, and each
  row's error stays within 1.5x what it was when written, in-sample and held-out rows marked apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from simddp.config import Scenario, TransformerSpec, deep_merge
from simddp.memory import MemoryBreakdown, memory_breakdown, transformer_layer_activation_bytes
from simddp.scenario_io import scenario_from_dict
from simddp.units import GB, GiB

# Korthikanti et al. 2022, Table 3 (s = 2048, t = 8).
SHAPES = {
    "22B": (48, 6144, 64),
    "175B": (96, 12288, 96),
    "530B": (105, 20480, 128),
    "1T": (128, 25600, 160),
}


def gpt(num_layers: int, hidden: int, heads: int, vocab: int = 51200) -> TransformerSpec:
    return TransformerSpec(num_layers=num_layers, hidden_size=hidden, num_heads=heads,
                           ffn_hidden_size=4 * hidden, vocab_size=vocab)


def scenario(data: dict[str, Any]) -> Scenario:
    base = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "gpt2"}}
    return scenario_from_dict(deep_merge(base, data))


# ------------------------------------------------------------------------------------------ ZeRO
def psi_scenario(num_params: int, dp: int, zero_stage: int) -> Scenario:
    """Ψ parameters as one 16-bit tensor, trained with mixed-precision Adam on dp GPUs (no activations), by DeepSpeed,
    the paper's implementation: it flattens the parameters and splits them evenly (torch's ZeroRedundancyOptimizer
    hands each whole tensor to one rank, so one tensor would not be sharded at all)."""
    nodes, per_node = (dp // 8, 8) if dp >= 8 else (1, dp)
    return scenario({
        "cluster": {"num_nodes": nodes, "gpus_per_node": per_node},
        "model": {"preset": None, "parameters": [{"name": "psi", "numel": num_params, "dtype": "bfloat16"}]},
        "parallelism": {"zero_stage": zero_stage},
        "ddp": {"implementation": "deepspeed"},
        "training": {"precision": "bf16-mixed", "optimizer": "adam", "seq_len": 1},
    })


@pytest.mark.parametrize(("zero_stage", "published_gb"), [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example_7_5b_on_64_gpus(zero_stage, published_gb):
    m = memory_breakdown(psi_scenario(7_500_000_000, 64, zero_stage))
    assert m.model_states_bytes / GB == pytest.approx(published_gb, abs=0.05)


# ZeRO Table 1, 7.5B model: per-device GB for P_os, P_os+g, P_os+g+p at each DP degree.
ZERO_TABLE1_7_5B = {
    1: (120, 120, 120),
    4: (52.5, 41.3, 30),
    16: (35.6, 21.6, 7.5),
    64: (31.4, 16.6, 1.88),
    256: (30.4, 15.4, 0.47),
    1024: (30.1, 15.1, 0.12),
}


@pytest.mark.parametrize("dp", sorted(ZERO_TABLE1_7_5B))
def test_zero_table1_7_5b_column(dp):
    got = [memory_breakdown(psi_scenario(7_500_000_000, dp, z)).model_states_bytes / GB for z in (1, 2, 3)]
    assert got == pytest.approx(ZERO_TABLE1_7_5B[dp], abs=0.051)


# ----------------------------------------------------------------------------------- Korthikanti
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_korthikanti_table2_on_paper_shapes(name):
    num_layers, h, a = SHAPES[name]
    spec, s, b, t = gpt(num_layers, h, a), 2048, 1, 8
    sbh, attn = s * b * h, 5 * a * s / h
    rows = {
        (1, False, "none"): 34 + attn,
        (t, False, "none"): 10 + 24 / t + attn / t,
        (t, True, "none"): 34 / t + attn / t,
        (t, False, "selective"): 10 + 24 / t,
        (t, True, "selective"): 34 / t,
        (1, False, "full"): 2,
    }
    for (tp, sp, recompute), per_sbh in rows.items():
        got = transformer_layer_activation_bytes(spec, s, b, tp, sp, recompute)
        assert got == pytest.approx(per_sbh * sbh, rel=1e-12), (tp, sp, recompute)


@pytest.mark.parametrize(("name", "five_as_over_h", "selective_saving"), [("175B", 80, 0.70), ("530B", 64, 0.65)])
def test_korthikanti_attention_term_and_selective_saving(name, five_as_over_h, selective_saving):
    num_layers, h, a = SHAPES[name]
    spec, s = gpt(num_layers, h, a), 2048
    none = transformer_layer_activation_bytes(spec, s, 1, recompute="none")
    selective = transformer_layer_activation_bytes(spec, s, 1, recompute="selective")
    assert (none - selective) / (s * h) == pytest.approx(five_as_over_h)
    assert (none - selective) / none == pytest.approx(selective_saving, abs=0.005)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_sequence_parallel_and_selective_recompute_cut_activations_about_5x(name):
    num_layers, h, a = SHAPES[name]
    spec = gpt(num_layers, h, a)
    tp_only = transformer_layer_activation_bytes(spec, 2048, 1, 8, False, "none")
    both = transformer_layer_activation_bytes(spec, 2048, 1, 8, True, "selective")
    assert 4.5 < tp_only / both < 6.5  # abstract: "reduces activation memory by 5x"


# ------------------------------------------------------------------- Megatron theoretical report
def megatron_weight_and_optimizer_bytes(spec: TransformerSpec, padded_vocab: int, tp: int, pp: int,
                                        dp: int, distributed_optimizer: bool) -> float:
    """compute_weight_and_optimizer_memory for a dense model (no MoE, MTP or MLA)."""
    h, a, g = spec.hidden_size, spec.num_heads, spec.kv_heads
    norm_size = 1 if spec.norm == "rmsnorm" else 2
    gated = 3 / 2 if spec.gated_mlp else 1
    self_attn = 2 * h * h * ((1 + g / a) * 1.0)
    layer = 2 * h * (spec.ffn_hidden_size * gated + norm_size) + self_attn
    block = layer * spec.num_layers + norm_size * h
    embedding = h * padded_vocab
    most_loaded = (block / pp + embedding) / tp
    if not spec.tied_embeddings and pp == 1:
        most_loaded += embedding / tp
    per_param = 6 + 12 / dp if distributed_optimizer else 18
    return most_loaded * per_param


def megatron_activation_bytes_sp(spec: TransformerSpec, s: int, b: int, tp: int, pp: int, m: int,
                                 padded_vocab: int, v: int | None = None) -> float:
    """compute_activation_memory (the sequence-parallel + selective-recompute path; first stage)."""
    h = spec.hidden_size
    act = s * b * h * (18 + 4 * spec.ffn_hidden_size / h) * spec.num_layers
    act += 8 * s * b * pp + s * b * h * pp
    if v is not None:
        act *= 1 + (pp - 1) / (pp * v)
    elif pp > 1:
        act *= min(1, m / pp)
    if pp == 1:
        act += s * b * h * 4 * (1 + padded_vocab / h)
    return act / tp


def gpt3_megatron_scenario(**training: Any) -> Scenario:
    # GPT-3 175B as in Korthikanti et al. Table 3: t = 8, p = 8, SP, selective recompute, 1024 A100s.
    return scenario({
        "cluster": {"num_nodes": 128},
        "model": {"preset": "gpt3-175b"},
        "parallelism": {"tp": 8, "pp": 8, "sequence_parallel": True},
        "training": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_size": 1536, "recompute": "selective",
                     "attention": "unfused", **training},
        "ddp": {"reduce_in_fp32": True, "gradient_as_bucket_view": True},
    })


def test_megatron_per_layer_activation_formula_is_simddps():
    for num_layers, h, a in SHAPES.values():
        spec = gpt(num_layers, h, a)
        megatron = 2048 * h * (18 + 4 * spec.ffn_hidden_size / h) / 8
        assert transformer_layer_activation_bytes(spec, 2048, 1, 8, True, "selective") == pytest.approx(megatron)
        # compute_activation_memory_without_sp: sbh(10 + 24/t) per layer.
        assert transformer_layer_activation_bytes(spec, 2048, 1, 8, False, "selective") == pytest.approx(
            2048 * h * (10 + 24 / 8))


def test_megatron_report_on_gpt3_first_stage():
    s = gpt3_megatron_scenario()
    spec = s.model.transformer
    assert spec is not None
    m = memory_breakdown(s, stage=0)
    sb, tp, pp = 2048, 8, 8
    # Activations: identical but for two terms Megatron leaves out (token ids are not split by tp; one
    # layer's attention scores are re-created in backward).
    megatron = megatron_activation_bytes_sp(spec, 2048, 1, tp, pp, s.num_micro_batches, 51200)
    working_set = next(i.size_bytes for i in m.items if i.name == "recompute working set")
    token_ids_not_split = 8 * sb * pp * (1 - 1 / tp)
    assert m.activations_bytes - working_set - token_ids_not_split == pytest.approx(megatron, rel=1e-9)
    assert m.activations_bytes / megatron == pytest.approx(1.025, abs=0.005)
    # Weights + optimizer: both 18 B/param (bf16 weight, fp32 main grad, fp32 master + Adam); the shard
    # differs only in what Megatron's closed-form count omits (biases, position embeddings, vocab padding).
    megatron_states = megatron_weight_and_optimizer_bytes(spec, 51200, tp, pp, s.dp, False)
    assert m.model_states_bytes == 18 * m.num_params
    assert m.model_states_bytes / megatron_states == pytest.approx(1.0, abs=0.01)


def test_megatron_distributed_optimizer_is_zero1_with_fp32_grads():
    s = gpt3_megatron_scenario()
    z1 = s.model_copy(update={"parallelism": s.parallelism.model_copy(update={"zero_stage": 1}),
                              "ddp": s.ddp.model_copy(update={"implementation": "megatron"})})
    m = memory_breakdown(z1, stage=0)
    assert m.model_states_bytes == pytest.approx((6 + 12 / s.dp) * m.num_params, abs=2)
    megatron = megatron_weight_and_optimizer_bytes(s.model.transformer, 51200, 8, 8, s.dp, True)  # type: ignore[arg-type]
    assert m.model_states_bytes / megatron == pytest.approx(1.0, abs=0.01)


def test_megatron_interleaved_penalty():
    s = gpt3_megatron_scenario(global_batch_size=1536)
    inter = s.model_copy(update={"parallelism": s.parallelism.model_copy(
        update={"pipeline_schedule": "interleaved-1f1b", "virtual_stages": 2})})
    assert memory_breakdown(inter, stage=0).in_flight_micro_batches == pytest.approx(8 * (1 + 7 / 16))


def test_megatron_formula_on_llama2_70b_counts_swiglu_as_gelu():
    llama = scenario({"model": {"preset": "llama2-70b"}}).model.transformer
    assert llama is not None
    s, h = 4096, 8192
    megatron = s * h * (18 + 4 * llama.ffn_hidden_size / h) / 8  # 32 sbh / t
    simddp = transformer_layer_activation_bytes(llama, s, 1, 8, True, "selective", dropout=False)
    # SwiGLU saves 3 ffn-wide tensors (+2 ffn = +7h), no dropout masks (-2h), GQA K, V (-3.5h): +1.5h.
    assert simddp - megatron == pytest.approx(s * 1.5 * h / 8)


# --------------------------------------------------------------------------- DeepSpeed estimators
def deepspeed_zero2_gpu_bytes(total_params: float, num_gpus: int) -> int:
    """estimate_zero2_model_states_mem_needs, cpu_offload=False: 4Ψ + 16Ψ/N."""
    return int(4 * total_params + int(16 * total_params / num_gpus))


def deepspeed_zero3_gpu_bytes(total_params: float, largest_layer_params: float, num_gpus: int) -> int:
    """estimate_zero3_model_states_mem_needs, no offload: 4 x largest layer + 18Ψ/N."""
    return int(4 * largest_layer_params + int(18 * total_params / num_gpus))


def test_deepspeed_docs_examples_reproduce():
    # memory.rst: t5-3b (2851M params, 32M largest layer) on 1 node x 8 GPUs: 15.93 GB (ZeRO-2), 6.09 GB (ZeRO-3).
    assert deepspeed_zero2_gpu_bytes(2851e6, 8) / GiB == pytest.approx(15.93, abs=0.005)
    assert deepspeed_zero3_gpu_bytes(2851e6, 32e6, 8) / GiB == pytest.approx(6.09, abs=0.005)
    # The t5-large worked example: 737.67M params, 32.90M largest layer, 4 GPUs -> 3291 MB.
    assert deepspeed_zero3_gpu_bytes(737.67e6, 32.90e6, 4) >> 20 == 3291


def t5_3b_like(zero_stage: int, reduce_in_fp32: bool) -> Scenario:
    """2851M parameters as 89 layers of 32M plus one of 3M (DeepSpeed's t5-3b example) on 8 GPUs, DeepSpeed."""
    params = [{"name": f"l{i}.weight", "numel": 32_000_000, "dtype": "float16"} for i in range(89)]
    params.append({"name": "rest.weight", "numel": 3_000_000, "dtype": "float16"})
    return scenario({
        "model": {"preset": None, "parameters": params},
        "parallelism": {"zero_stage": zero_stage},
        "training": {"precision": "fp16-mixed", "optimizer": "adam", "seq_len": 1},
        "ddp": {"implementation": "deepspeed", "reduce_in_fp32": reduce_in_fp32},
    })


def test_deepspeed_zero3_estimator_versus_simddp():
    psi, layer, n = 2851e6, 32e6, 8
    deepspeed = deepspeed_zero3_gpu_bytes(psi, layer, n)
    ds32 = memory_breakdown(t5_3b_like(3, reduce_in_fp32=True))
    # DeepSpeed's 18 B/param = simddp with fp32 gradient partitions (2 + 4 + 12); the paper's 16 without.
    assert ds32.model_states_bytes == pytest.approx(18 * psi / n, abs=4)
    assert memory_breakdown(t5_3b_like(3, reduce_in_fp32=False)).model_states_bytes == pytest.approx(
        16 * psi / n, abs=4)
    assert deepspeed - ds32.model_states_bytes == pytest.approx(4 * layer, abs=4)  # the estimator's gathered layer

    def item(name: str) -> int:
        return sum(i.size_bytes for i in ds32.items if i.name == name)

    # Where the estimator counts one gathered 16-bit layer and its gradient (4 B x largest layer), DeepSpeed
    # with its defaults keeps more: the modules whose reuse comes within stage3_max_reuse_distance (1e9
    # elements: 2 x the elements after them < 1e9, so l73..l88 and rest, 515M elements) stay gathered from
    # forward to backward, beside the module computing and stage3_prefetch_bucket_size (5e7) ahead (two more
    # 32M modules); the module's gradient before it enters the contiguous 5e8-element reduce buffer.
    assert item("ZeRO-3 gathered parameters") == 2 * (16 * 32_000_000 + 3_000_000 + 3 * 32_000_000)
    assert item("ZeRO-3 unsharded gradients") == 2 * 32_000_000
    assert item("DeepSpeed reduce buffers") == 2 * 500_000_000


def test_deepspeed_zero2_estimator_versus_simddp():
    psi, n = 2851e6, 8
    m = memory_breakdown(t5_3b_like(2, reduce_in_fp32=True))
    # DeepSpeed 4Ψ + 16Ψ/N keeps a full 16-bit gradient copy; simddp (paper + fp32 grad partitions):
    # 2Ψ + 16Ψ/N, with the gradients in flight counted as DeepSpeed's contiguous reduce buffer instead (5e8
    # fp16 elements, 0.93 GiB here against the estimator's 2Ψ = 5.3 GiB) and the flattened bucket.
    assert deepspeed_zero2_gpu_bytes(psi, n) - m.model_states_bytes == pytest.approx(2 * psi, abs=4)
    assert sum(i.size_bytes for i in m.items if i.name == "DeepSpeed reduce buffers") == 2 * 500_000_000


# ---------------------------------------------------------------------- measured peaks of real runs
# Rows are "in-sample" when they were looked at while the model was built (they led to torchtitan's op-level
# checkpointing, the unfused cross-entropy and FSDP's held root gradients being modelled) and "held-out" when
# they were first compared after that, with the model frozen. No constant of the memory model is fitted to
# any row: fragmentation (10%, GMLake), CUDA context (512 MiB) and NCCL buffers keep their cited defaults.

#: H100 with 96 GB HBM2e (torchtitan's Grand Teton hosts): usable the same share of it as an 80 GB part
#: (81559 of 81920 MiB; an assumption, the benchmark does not say).
H100_96GB_BYTES = 96 * 81559 * 2**20 // 80


def torchtitan(model: str, gpus: int, tp: int, pp: int, local_batch: int, recompute: str,
               schedule: str = "1f1b", virtual_stages: int = 1) -> Scenario:
    """A torchtitan run (torchtitan 9dec370, torch 1963fc8, Dec 2024): FSDP2 (ZeRO-3) over the rest of the
    GPUs, bf16 parameters with fp32 reduction (mixed_precision_reduce), AdamW, sequence length 8192 (the
    configs' default; the benchmark does not state it), FlashAttention, F.cross_entropy on fp32 logits
    (loss-parallel with TP), sequence parallel with TP; with PP, as many micro-batches as stages."""
    dp = gpus // (tp * pp)
    micro = local_batch // pp if pp > 1 else local_batch
    return scenario({
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": gpus // 8, "gpu": {"hbm_bytes": H100_96GB_BYTES}},
        "model": {"preset": model},
        "parallelism": {"zero_stage": 3, "tp": tp, "pp": pp, "sequence_parallel": tp > 1,
                        "pipeline_schedule": schedule, "virtual_stages": virtual_stages},
        "training": {"seq_len": 8192, "micro_batch_size": micro, "global_batch_size": local_batch * dp,
                     "recompute": recompute, "attention": "flash", "cross_entropy": "unfused"},
        "ddp": {"implementation": "torch", "reduce_in_fp32": True},
    })


# (label, published GiB, in-sample, scenario); torchtitan benchmarks/llama3_h100_202412_torchtitan.md,
# "Memory(GiB)", most likely peak reserved (torchtitan logs max_reserved); "compile"/"Float8"/"AsyncTP" rows
# run features simddp does not model (the prediction is the same as without them).
TORCHTITAN_ROWS: list[tuple[str, float, bool, Callable[[], Scenario]]] = [
    ("T1 8B FSDP8", 82.4, True, lambda: torchtitan("llama3-8b", 8, 1, 1, 2, "selective-op")),
    ("T1 8B FSDP8 + compile", 77.0, True, lambda: torchtitan("llama3-8b", 8, 1, 1, 2, "selective-op")),
    ("T1 8B FSDP8 + compile + Float8", 76.8, True, lambda: torchtitan("llama3-8b", 8, 1, 1, 2, "selective-op")),
    ("T3 8B FSDP128", 67.0, False, lambda: torchtitan("llama3-8b", 128, 1, 1, 2, "selective-op")),
    ("T3 8B FSDP128 + compile", 62.0, False, lambda: torchtitan("llama3-8b", 128, 1, 1, 2, "selective-op")),
    ("T3 8B FSDP128 + compile + Float8", 61.8, False, lambda: torchtitan("llama3-8b", 128, 1, 1, 2, "selective-op")),
    ("T4 70B FSDP32 TP8 (compile, Float8)", 71.9, False, lambda: torchtitan("llama3-70b", 256, 8, 1, 16, "full")),
    ("T4 70B FSDP32 TP8 + AsyncTP", 67.6, False, lambda: torchtitan("llama3-70b", 256, 8, 1, 16, "full")),
    ("T5 405B FSDP8 TP8 PP8 1F1B", 82.5, False, lambda: torchtitan("llama3-405b", 512, 8, 8, 32, "full")),
    # In-sample since it showed the loss counted once per in-flight chunk of the last stage (+24% before);
    # the interleaving depth is not published: 2 chunks per stage assumed.
    ("T5 405B FSDP8 TP8 PP8 interleaved", 72.7, True,
     lambda: torchtitan("llama3-405b", 512, 8, 8, 32, "full", "interleaved-1f1b", 2)),
]


def h100_case(case: dict[str, Any]) -> Scenario:
    """A case of benchmarks/gpu/measure_kernels.py measure_memory(): one GPU, bf16 parameters and persistent
    bf16 gradients, fp32 master weights and AdamW states, FlashAttention, no dropout, untied head, no position
    table, F.cross_entropy(logits.float())."""
    llama = "llama" in case["case"]
    return scenario({
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "model": {"preset": None, "transformer": {
            "num_layers": case["layers"], "hidden_size": case["h"], "num_heads": case["heads"],
            "num_kv_heads": case["kv_heads"], "ffn_hidden_size": case["ffn"], "vocab_size": case["vocab"],
            "gated_mlp": llama, "norm": "rmsnorm" if llama else "layernorm", "bias": not llama,
            "tied_embeddings": False, "position_embedding": "rope"}},
        "training": {"seq_len": case["seq"], "micro_batch_size": case["micro_batch"], "recompute": case["recompute"],
                     "dropout": False, "attention": "flash", "cross_entropy": "unfused"},
    })


def h100_measured() -> list[tuple[dict[str, Any], int]]:
    """Each case with its second step's peak allocated bytes during forward and backward, corrected for the
    harness's leftover: the previous case's parameters and gradients (and its last master weight), which its
    ``loss`` graph and loop variables kept alive into this case's ``base`` and freed during its first step
    (4 bytes per parameter plus 4 per element of its output layer; fixed in the harness since)."""
    data = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/data/h100_kernels.json").read_text())
    out, prev = [], None
    for case in data["memory"]:
        peak = case["steps"][1]["peak_fwd_bwd_bytes"]
        if prev is not None:
            peak += 4 * (prev["num_params"] + prev["vocab"] * prev["h"])
        out.append((case, peak))
        prev = case
    return out


def allocated_bytes(m: MemoryBreakdown) -> int:
    """What ``torch.cuda.max_memory_allocated`` sees: all but the CUDA context and allocator fragmentation."""
    return m.total_bytes - sum(i.size_bytes for i in m.items if i.category == "overhead")


#: |simddp / measured - 1| bounds: 1.5 x the error at the time of writing (at least 3%), so a model change
#: that doubled any row's error fails.
TORCHTITAN_BOUNDS = {
    "T1 8B FSDP8": 0.03, "T1 8B FSDP8 + compile": 0.12, "T1 8B FSDP8 + compile + Float8": 0.125,
    "T3 8B FSDP128": 0.045, "T3 8B FSDP128 + compile": 0.17, "T3 8B FSDP128 + compile + Float8": 0.18,
    "T4 70B FSDP32 TP8 (compile, Float8)": 0.24, "T4 70B FSDP32 TP8 + AsyncTP": 0.16,
    "T5 405B FSDP8 TP8 PP8 1F1B": 0.2, "T5 405B FSDP8 TP8 PP8 interleaved": 0.014,
}
H100_BOUNDS = {"llama-1b-like": 0.15, "llama-1b-like-selective": 0.125, "llama-1b-like-full": 0.04,
               "gpt-760m-like": 0.03}


@pytest.mark.parametrize(("label", "published_gib", "in_sample", "make"), TORCHTITAN_ROWS,
                         ids=[r[0] for r in TORCHTITAN_ROWS])
def test_torchtitan_h100_runs_fit_and_peak_where_published(label, published_gib, in_sample, make):
    m = memory_breakdown(make())
    assert m.fits  # no false OOM: every published run trained
    error = m.total_bytes / GiB / published_gib - 1
    assert abs(error) <= TORCHTITAN_BOUNDS[label], f"{label}: {error:+.1%}"


@pytest.mark.parametrize("index", range(4))
def test_h100_single_gpu_steps_peak_where_measured(index):
    case, measured = h100_measured()[index]
    m = memory_breakdown(h100_case(case))
    assert m.num_params == case["num_params"]
    assert m.fits
    error = allocated_bytes(m) / measured - 1
    assert abs(error) <= H100_BOUNDS[case["case"]], f"{case['case']}: {error:+.1%}"
