"""Properties of the step engine over generated layouts: bounds, a breakdown that adds up, shared links.

The invariants (issue 9): the perfect-overlap bound <= the step <= the no-overlap bound; no link of a GPU is
busier than the step is long; the named parts of the breakdown sum to the step. Generated over ZeRO stages and
the implementation that runs them (torch, DeepSpeed, Megatron, with their bucket, overlap, fp32-reduction and
prefetch options), tensor/pipeline/data parallel layouts, schedules, overlap options, interference, and four
clusters including a network-bound Ethernet one (AWS p4d's EFA).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simddp import ScenarioError, simulate

ROOT = Path(__file__).resolve().parent.parent

CLUSTERS = ["dgx-a100-80gb", "dgx-h100-80gb", "aws-p4d-24xlarge", "pcie-a100-80gb"]


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    nodes = draw(st.sampled_from([1, 2, 4]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    impl = draw(st.sampled_from(["torch", "deepspeed", "megatron"]))
    stages = {"torch": [0, 1, 2, 3], "deepspeed": [0, 1, 2, 3] if pp == 1 else [0, 1], "megatron": [0, 1]}[impl]
    zero = draw(st.sampled_from(stages))
    overlap = draw(st.sampled_from([None, True, False]))
    layers = draw(st.sampled_from([4, 8]))
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b"])) if pp > 1 else "1f1b"
    v = 2 if schedule == "interleaved-1f1b" else 1
    gpus = nodes * 8
    dp = gpus // (tp * pp)
    micro = draw(st.sampled_from([1, 2, 4, 8]))
    if schedule == "interleaved-1f1b":
        micro = pp * draw(st.sampled_from([1, 2]))
    return {
        "cluster": {"preset": draw(st.sampled_from(CLUSTERS)), "num_nodes": nodes,
                    "comm_compute_interference": draw(st.sampled_from([0.0, 0.189, 0.5]))},
        "model": {"transformer": {"num_layers": layers, "hidden_size": draw(st.sampled_from([512, 1024, 2048])),
                                  "num_heads": 16, "ffn_hidden_size": 4096, "vocab_size": 32000,
                                  "gated_mlp": draw(st.booleans()), "tied_embeddings": draw(st.booleans())}},
        "parallelism": {"tp": tp, "pp": pp, "zero_stage": zero, "pipeline_schedule": schedule,
                        "virtual_stages": v, "sequence_parallel": tp > 1 and draw(st.booleans()),
                        "tp_comm_overlap": draw(st.sampled_from(["none", "backward", "full"])),
                        "pp_p2p_overlap": draw(st.booleans())},
        "training": {"micro_batch_size": draw(st.sampled_from([1, 2])), "seq_len": draw(st.sampled_from([512, 2048])),
                     "global_batch_size": None,
                     "recompute": draw(st.sampled_from(["none", "selective", "selective-op", "full"])),
                     "cross_entropy": draw(st.sampled_from(["fused", "unfused"])),
                     "attention": draw(st.sampled_from(["flash", "unfused"]))},
        "ddp": {"implementation": impl, "overlap": overlap,
                "bucket_cap_mb": draw(st.sampled_from([None, 1, 25, 100])),
                "reduce_in_fp32": draw(st.sampled_from([None, True, False])),
                "overlap_param_gather": impl == "megatron" and zero == 1 and overlap is True and draw(st.booleans()),
                "stage3_prefetch_numel": draw(st.sampled_from([None, 0, 10_000_000])),
                "stage3_max_reuse_distance_numel": draw(st.sampled_from([None, 0]))},
        "memory": {"fsdp_prefetch_layers": draw(st.sampled_from([0, 1, 2]))},
        "_micro": micro * dp,
    }


def _run(data: dict):
    micro_dp = data.pop("_micro")
    data["training"]["global_batch_size"] = micro_dp * data["training"]["micro_batch_size"]
    try:
        return simulate(data, trace=False)
    except ScenarioError:
        return None  # a layout the scenario rules forbid (heads, layers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_step_sits_between_its_bounds_and_its_parts_add_up(data: dict) -> None:
    r = _run(data)
    if r is None:
        return
    assert r.bounds.perfect_overlap_s <= r.step_time_s * (1 + 1e-9)
    assert r.step_time_s <= r.bounds.no_overlap_s * (1 + 1e-9)
    assert sum(p.time_s for p in r.breakdown) == pytest.approx(r.step_time_s, rel=1e-9)
    assert all(busy <= r.step_time_s * (1 + 1e-9) for busy in r.link_busy_s.values())
    assert r.exposed_comm_time_s <= r.comm_time_s * (1 + 1e-9) + 1e-12


def test_concurrent_collectives_share_the_link() -> None:
    # ZeRO-3 on a network-bound cluster: gathers and reduce-scatters in flight together each get half the
    # NICs, so the step cannot beat the link's own work (the old engine gave each the whole link: 0.93 s
    # against a 1.35 s bound on this scenario).
    r = simulate({"cluster": {"preset": "aws-p4d-24xlarge", "num_nodes": 4}, "model": {"preset": "llama2-7b"},
                  "parallelism": {"zero_stage": 3}, "training": {"seq_len": 2048, "micro_batch_size": 1}},
                 trace=False)
    assert r.step_time_s >= r.bounds.perfect_overlap_s
    assert r.step_time_s >= r.link_busy_s["inter"]
    assert r.link_busy_s["inter"] > 0.9 * r.comm_time_s * 0.5  # most of the traffic is on the NICs


def test_zero_stages_rank_sensibly_on_the_default_scenario() -> None:
    # Same GPUs, same batch: ZeRO-3 (torch FSDP) moves 1.5x DDP's bytes per micro-batch (two gathers and a
    # reduce-scatter against one all-reduce) and can no longer look faster than a ZeRO-1 that overlaps its
    # reduction (Megatron's distributed optimizer with --overlap-grad-reduce) by getting free links. torch's
    # ZeroRedundancyOptimizer, the default scenario's ZeRO-1, pays DDP's all-reduce plus broadcasts after the
    # step that nothing hides: with the same (fused) optimizer it is slower than DDP; with torch's foreach
    # AdamW (84 B per parameter on each of DDP's GPUs, 1/128 of that sharded) it is faster.
    def step(zero: int, impl: str = "fused", **ddp: object) -> float:
        return simulate({
            "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 16}, "model": {"preset": "llama2-7b"},
            "parallelism": {"zero_stage": zero},
            "training": {"micro_batch_size": 1, "global_batch_size": 512, "seq_len": 4096,
                         "recompute": "selective", "optimizer_impl": impl},
            "ddp": ddp}, trace=False).step_time_s

    ddp, torch_z1, z3 = step(0, bucket_cap_mb=25), step(1), step(3, bucket_cap_mb=25)
    megatron_z1 = step(1, implementation="megatron", overlap=True)
    assert z3 >= megatron_z1 * (1 - 1e-9)
    assert torch_z1 > ddp
    assert step(1, "foreach") < step(0, "foreach", bucket_cap_mb=25)
    assert simulate("simddp/default_scenario.yaml", trace=False).step_time_s == pytest.approx(step(1, "foreach"))


def test_overlapped_send_recv_stays_under_the_no_overlap_bound() -> None:
    # Found by the property above: with pp_p2p_overlap the sender goes on while its send shares the PCIe link
    # with its sequence-parallel collectives, so the data arrives later than a send alone would bring it
    # (10.61 ms against a bound of 10.54 ms before the bound counted that sharing).
    r = simulate({
        "cluster": {"preset": "pcie-a100-80gb", "num_nodes": 1, "comm_compute_interference": 0.0},
        "model": {"transformer": {"num_layers": 4, "hidden_size": 512, "num_heads": 16, "ffn_hidden_size": 4096,
                                  "vocab_size": 32000, "gated_mlp": False, "tied_embeddings": False}},
        "parallelism": {"tp": 2, "pp": 4, "sequence_parallel": True, "tp_comm_overlap": "none",
                        "pp_p2p_overlap": True},
        "training": {"micro_batch_size": 1, "seq_len": 2048, "global_batch_size": 2, "recompute": "none",
                     "cross_entropy": "fused", "attention": "flash", "optimizer_impl": "fused"},
        "ddp": {"implementation": "torch", "overlap": False}}, trace=False)
    assert r.bounds.perfect_overlap_s <= r.step_time_s <= r.bounds.no_overlap_s
    # 10.61 ms until 2026-11-23; 10.88 ms since the second micro-batch's gradient accumulation is timed; 10.28 ms
    # since a stage under sequence parallelism no longer all-gathers what it receives (2026-11-29)
    assert r.step_time_s == pytest.approx(0.010284, rel=1e-3)


def test_nothing_to_reduce_adds_nothing_to_the_no_overlap_bound() -> None:
    # With dp = 1 no gradient is reduced, so whether the reduction would overlap backward cannot move the
    # no-overlap bound: until 2026-11-24 an overlapping rank's serialised schedule still paid its drain's TP and
    # send time again, (1 + 2i) times, up front (GPT-3 175B tp8 pp8 v3 on 64 A100: 14.18 s for a 12.82 s step;
    # 13.43 s without it). The fast engine and the exact one must agree on it.
    data = {
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
        "model": {"transformer": {"num_layers": 8, "hidden_size": 1024, "num_heads": 16, "ffn_hidden_size": 4096,
                                  "vocab_size": 32000}},
        "parallelism": {"tp": 4, "pp": 4, "pipeline_schedule": "interleaved-1f1b", "virtual_stages": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "seq_len": 1024},
        "ddp": {"implementation": "megatron"}}
    overlapped = simulate({**data, "ddp": {"implementation": "megatron", "overlap": True}}, trace=False)
    after = simulate({**data, "ddp": {"implementation": "megatron", "overlap": False}}, trace=False)
    exact = simulate({**data, "ddp": {"implementation": "megatron", "overlap": True}}, trace=False, exact=True)
    assert overlapped.dp == 1
    assert overlapped.step_time_s == pytest.approx(after.step_time_s, rel=1e-12)
    assert overlapped.bounds.no_overlap_s == pytest.approx(after.bounds.no_overlap_s, rel=1e-12)
    assert exact.bounds.no_overlap_s == pytest.approx(overlapped.bounds.no_overlap_s, rel=1e-9)
    assert overlapped.step_time_s <= overlapped.bounds.no_overlap_s


def test_an_overlapped_reduction_costs_the_no_overlap_bound_per_operation() -> None:
    # A pipeline rank whose reduction overlaps its last backwards pays, in the no-overlap bound's schedule, what
    # each operation beside it can lose ((1 + i) times its kernels, twice its collectives: step.bound_steps),
    # not (1 + 2i) times its whole reduction up front: those charges added up along the drain, rank after rank.
    # The GPT-3 175B 3D example (dp 16, pp 8 v2, ZeRO-1): 26.21 s for a 19.27 s step until 2026-11-24, 20.65 s
    # since; 20.58 s for a 19.20 s step since its stages (sequence parallel) no longer all-gather what they receive,
    # and 20.61 s for 19.23 s since the last stage reduces and steps its copy of the tied output layer (2026-11-29).
    # The property test above keeps the bound above the step (2,000 more pipelines with dp > 1, overlap and
    # interference up to 1 checked when it changed; either term alone fails it).
    r = simulate(str(ROOT / "examples/gpt3-175b-3d-1024xA100.yaml"), trace=False)
    assert r.step_time_s <= r.bounds.no_overlap_s <= 1.08 * r.step_time_s
    assert r.bounds.no_overlap_s == pytest.approx(20.607, rel=1e-3)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_plans_tp_flag_is_the_walks(tp: int) -> None:
    # build_plan sets has_tp_collectives without a walk when tp = 1; the walk over every layer plan agrees.
    from simddp import as_scenario
    from simddp.sim.plan import LayerPlans, build_plan

    scenario = as_scenario({
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
        "model": {"transformer": {"num_layers": 4, "hidden_size": 1024, "num_heads": 16, "ffn_hidden_size": 4096,
                                  "vocab_size": 32000}},
        "parallelism": {"tp": tp, "pp": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "seq_len": 1024}})
    for rank in build_plan(scenario).ranks:
        assert rank.plans.has_tp_collectives == LayerPlans(rank.plans).has_tp_collectives == (tp > 1)


def test_a_pipeline_ranks_lower_bound_adds_its_own_optimizer_to_its_own_kernels() -> None:
    # Found by a probe (2026-11-29): ResNet-50 on pp 2. Stage 0 ends its kernels last (1.83 ms) with a short
    # optimizer; stage 1, holding layer4 and fc, ends earlier (1.22 ms) with a long one (0.64 ms). The perfect-overlap
    # bound added each rank's optimizer to the latest rank's kernels: 2.47 ms for a 2.05 ms step, which
    # `simddp simulate` refused as an internal error. Each rank's own end: max(1.83 + 0.07, 1.22 + 0.64) = 1.89 ms.
    data = {"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1}, "model": {"preset": "resnet50"},
            "parallelism": {"pp": 2}, "training": {"seq_len": 1}}
    for exact in (False, True):
        r = simulate(data, trace=False, exact=exact)
        assert r.bounds.perfect_overlap_s <= r.step_time_s <= r.bounds.no_overlap_s
        assert r.step_time_s == pytest.approx(2.0522e-3, rel=1e-3)
        assert r.bounds.perfect_overlap_s == pytest.approx(1.8929e-3, rel=1e-3)


@st.composite
def parameter_list_pipelines(draw: st.DrawFn) -> dict:
    # Uneven stages: a parameter-list model split by size puts unlike compute and optimizer work on each stage.
    sizes = draw(st.lists(st.integers(1_000, 20_000_000), min_size=4, max_size=12))
    pp = draw(st.sampled_from([2, 4]))
    return {"cluster": {"preset": draw(st.sampled_from(CLUSTERS)), "num_nodes": draw(st.sampled_from([1, 2])),
                        "comm_compute_interference": draw(st.sampled_from([0.0, 0.189]))},
            "model": {"parameters": [{"name": f"w{i}", "numel": n} for i, n in enumerate(sizes)],
                      "layers": [{"name": f"l{i}", "param_indices": [i],
                                  "fwd_flop_per_sample": draw(st.integers(1, 50)) * 1e9} for i in range(len(sizes))]},
            "parallelism": {"pp": pp, "pipeline_schedule": draw(st.sampled_from(["1f1b", "gpipe"]))},
            "training": {"seq_len": 1, "micro_batch_size": draw(st.sampled_from([1, 8])),
                         "global_batch_size": None, "optimizer_impl": draw(st.sampled_from(["foreach", "fused"]))},
            "_micro": draw(st.sampled_from([1, 2, 4, 8]))}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parameter_list_pipelines())
def test_uneven_pipelines_step_within_their_bounds(data: dict) -> None:
    micro = data.pop("_micro")
    nodes, pp = data["cluster"]["num_nodes"], data["parallelism"]["pp"]
    data["training"]["global_batch_size"] = micro * data["training"]["micro_batch_size"] * nodes * 8 // pp
    try:
        r = simulate(data, trace=False)
    except ScenarioError:
        return
    assert r.bounds.perfect_overlap_s <= r.step_time_s * (1 + 1e-9)
    assert r.step_time_s <= r.bounds.no_overlap_s * (1 + 1e-9)
