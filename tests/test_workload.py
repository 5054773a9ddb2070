"""Workload: preset parameter counts against published/HF numbers, FLOP accounting, tp sharding."""

from __future__ import annotations

import itertools

import pytest
from scenarios import base_scenario

from simddp.config import ModelConfig, Scenario, deep_merge
from simddp.scenario_io import scenario_from_dict
from simddp.workload import build_workload, total_params

# Parameter counts from the Hugging Face reference implementations (model.num_parameters()).
HF_PARAMS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "bert-large": 334_092_288,  # BertModel 335,141,888 minus the 1,049,600-parameter pooler
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
}


@pytest.mark.parametrize(("preset", "count"), HF_PARAMS.items())
def test_transformer_preset_parameter_counts(preset: str, count: int) -> None:
    spec = ModelConfig.model_validate({"preset": preset}).transformer
    assert spec is not None
    assert total_params(spec) == count


def test_gpt3_is_175b() -> None:
    spec = ModelConfig.model_validate({"preset": "gpt3-175b"}).transformer
    assert spec is not None
    assert total_params(spec) == pytest.approx(175e9, rel=0.01)  # Brown et al. 2020: 175.0B


def test_resnet50_matches_torchvision() -> None:
    m = ModelConfig.model_validate({"preset": "resnet50"})
    assert m.parameters is not None and m.layers is not None
    assert sum(p.numel for p in m.parameters) == 25_557_032  # torchvision resnet50
    assert len(m.parameters) == 161
    macs = sum(la.fwd_flop_per_sample or 0 for la in m.layers) / 2
    assert macs == pytest.approx(4.09e9, rel=0.01)  # torchvision: 4.09 GMAC at 224x224
    assert m.parameters[0].name == "conv1.weight" and m.parameters[-1].name == "fc.bias"


def test_megatron_flop_formula() -> None:
    # Narayanan et al. 2021, eq. 3: F = 72 B s L h^2 (1 + s/(6h) + V/(12 L h)) for fwd+bwd, no recompute.
    data = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
            "model": {"preset": "gpt3-175b"}, "training": {"micro_batch_size": 1, "seq_len": 2048},
            "parallelism": {"tp": 8}}
    w = build_workload(scenario_from_dict(data))
    B, s, L, h, V = 1, 2048, 96, 12288, 50257
    megatron = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert w.model_flop_per_sample == pytest.approx(megatron, rel=0.01)


def test_tp_shards_weights_but_not_norms() -> None:
    one = build_workload(scenario_from_dict(base_scenario()))
    two = build_workload(scenario_from_dict(deep_merge(base_scenario(), {"parallelism": {"tp": 2}})))
    norms = sum(p.numel for p in one.parameters if ".ln_" in p.name or "ln_f" in p.name)
    sharded_biases = 12 * 768  # row-parallel biases (attn.c_proj, mlp.c_proj) stay whole
    expected = (one.num_params - norms - 2 * sharded_biases - 1024 * 768) / 2 + norms + 2 * sharded_biases + 1024 * 768
    assert two.num_params == pytest.approx(expected, rel=1e-3)


def test_ready_order_is_reverse_execution_order() -> None:
    w = build_workload(scenario_from_dict(deep_merge(base_scenario(), {"model": {"preset": "llama2-7b"}})))
    names = [w.parameters[i].name for i in w.grad_ready_order]
    assert names[0] == "lm_head.weight"
    assert names[1] == "model.norm.weight"
    assert names[2] == "model.layers.31.mlp.down_proj.weight"
    assert names[-1] == "model.embed_tokens.weight"
    assert sorted(w.grad_ready_order) == list(range(len(w.parameters)))


def test_pipeline_stages_split_blocks_evenly() -> None:
    w = build_workload(scenario_from_dict(deep_merge(base_scenario(), {"parallelism": {"pp": 4}})))
    stages = [{la.stage for la in w.layers if la.block == i} for i in range(12)]
    assert [s.pop() for s in stages] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert w.layers[0].stage == 0 and w.layers[-1].stage == 3


def test_uneven_stages_keep_every_rank_within_one_block() -> None:
    """Where the blocks do not divide by pp x v, torchtitan's split: the first chunk holds the floor of L / (pp v),
    the next ones one more while extra blocks last, the last one what remains; so each chunk holds the floor or the
    ceiling and no rank more than one block above another. Llama 3 405B's 126 layers on 16 stages: 7 on the first
    and last, 8 on the others (Dubey et al. 2024, sec. 3.3.2). Block i on stage i pp v // L gave, interleaved 7
    ways, ranks 0 and 8 14 blocks each and the others 7 (a probe of the planner)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from simddp.workload import block_stage_starts

    def sizes(layers: int, pp: int, v: int) -> tuple[list[int], list[int]]:
        starts = block_stage_starts(layers, pp, v)
        chunks = [b - a for a, b in itertools.pairwise(starts)]
        return chunks, [sum(chunks[k * pp + r] for k in range(v)) for r in range(pp)]

    assert sizes(126, 16, 1)[1] == [7] + [8] * 14 + [7]
    chunks, ranks = sizes(126, 16, 7)
    assert set(chunks) == {1, 2} and ranks == [7] + [8] * 14 + [7]
    assert sizes(32, 3, 1)[1] == [10, 11, 11]
    assert sizes(126, 8, 1)[1] == [15, 16, 16, 16, 16, 16, 16, 15]  # torchtitan's 405B on pp 8
    assert sizes(126, 8, 2)[0] == [7] + [8] * 14 + [7]  # ... interleaved, 2 chunks a rank
    assert block_stage_starts(96, 8, 3) == [4 * s for s in range(25)]  # even: Megatron's split

    @settings(max_examples=300, deadline=None)
    @given(st.integers(1, 200), st.integers(1, 16), st.integers(1, 8))
    def check(layers: int, pp: int, v: int) -> None:
        starts = block_stage_starts(layers, pp, v)
        assert starts[0] == 0 and starts[-1] == layers and len(starts) == pp * v + 1
        assert all(a <= b for a, b in itertools.pairwise(starts))
        if layers >= pp * v:
            chunks, ranks = sizes(layers, pp, v)
            assert max(chunks) - min(chunks) <= 1 and max(ranks) - min(ranks) <= 1
        else:  # fewer blocks than stages: block i on stage i pp v // L
            assert all(starts[s] == -(-s * layers // (pp * v)) for s in range(pp * v + 1))

    check()
    w = build_workload(_small_pipeline(13, 4, 2))  # the workload puts its blocks where the starts say
    starts = block_stage_starts(13, 4, 2)
    for la in w.layers:
        if la.block is not None:
            assert starts[la.stage] <= la.block < starts[la.stage + 1]


@pytest.mark.parametrize("overrides", [
    {},
    {"model": {"preset": "llama2-7b"}, "parallelism": {"tp": 2, "sequence_parallel": True}},
    {"model": {"preset": "gpt3-175b"}, "cluster": {"num_nodes": 4},
     "training": {"micro_batch_size": 1, "global_batch_size": 8, "seq_len": 2048},
     "parallelism": {"tp": 8, "pp": 4, "virtual_stages": 3, "pipeline_schedule": "interleaved-1f1b"}},
    {"model": {"preset": "bert-large"}},
    {"model": {"preset": "resnet50"}},
])
def test_layers_sharing_kernel_tuples_own_parameters_of_the_same_shapes(overrides: dict) -> None:
    """simddp.sim.plan times each distinct kernel-tuple identity once, gradient accumulation included, so
    layers that share kernel tuples must own parameters of equal sizes and dtypes (identical blocks do)."""
    scenario = scenario_from_dict(deep_merge(base_scenario(), overrides))
    w = build_workload(scenario)
    shapes: dict[tuple[int, ...], list[tuple[int, str]]] = {}
    for layer in w.layers:
        if not (layer.fwd or layer.dgrad or layer.wgrad):
            continue  # the plan keys kernel-less layers by their parameters' shapes
        key = (id(layer.fwd), id(layer.dgrad), id(layer.wgrad), id(layer.collectives))
        own = [(w.parameters[g].numel, w.parameters[g].dtype) for g in layer.param_indices]
        assert shapes.setdefault(key, own) == own, layer.name
    if scenario.model.transformer is not None:
        assert len(shapes) < len(w.layers)  # the sharing this relies on is there


@pytest.mark.parametrize("overrides", [
    {},
    {"model": {"preset": "llama2-7b"}, "parallelism": {"tp": 2, "sequence_parallel": True},
     "training": {"recompute": "selective"}},
    {"model": {"preset": "gpt3-175b"}, "cluster": {"num_nodes": 4},
     "training": {"micro_batch_size": 1, "global_batch_size": 8, "seq_len": 2048, "recompute": "full"},
     "parallelism": {"tp": 8}},
    {"model": {"preset": "bert-large"}, "training": {"recompute": "selective-op"}},
    {"model": {"preset": "gpt3-175b"}, "cluster": {"num_nodes": 4},
     "training": {"micro_batch_size": 1, "global_batch_size": 8, "seq_len": 2048},
     "parallelism": {"tp": 8, "pp": 4, "virtual_stages": 3, "pipeline_schedule": "interleaved-1f1b"}},
    {"model": {"preset": "llama2-7b"}, "cluster": {"num_nodes": 5}, "training": {"global_batch_size": 320},
     "parallelism": {"pp": 5}},  # 32 blocks over 5 stages: 6 or 7 each
])
def test_block_copies_are_block_0s_kind_and_plan(overrides: dict) -> None:
    """Workload.blocks says where the copies of block 0 are: each copy's layer is block 0's kind (the tuples
    it is planned by), so the plan gives every whole block on a rank the first block's layer plans without
    looking each up, the same plans a look-up per layer gives."""
    from simddp.sim.plan import layer_plans, rank_layer_plans
    from simddp.workload import LAYER_KIND

    scenario = scenario_from_dict(deep_merge(base_scenario(), overrides))
    w = build_workload(scenario)
    assert w.blocks is not None
    start, per, count = w.blocks
    assert count == scenario.model.transformer.num_layers and start + per * count < len(w.layers)
    for i, layer in enumerate(w.layers[start:start + per * count]):
        template = w.layers[start + i % per]
        assert layer.block == i // per and template.block == 0
        assert all(a is b or (a == b and not isinstance(a, tuple))
                   for a, b in zip(LAYER_KIND(layer), LAYER_KIND(template), strict=True)), layer.name
    assert w.layers[start - 1].block is None and w.layers[start + per * count].block is None
    pp = scenario.parallelism.pp
    seen: dict = {}
    each = layer_plans(scenario, tuple(w.layers), w.parameters, seen)  # one look-up per layer
    assert layer_plans(scenario, w.layers, w.parameters, seen) == each  # from block 0
    for r in range(pp):
        assert rank_layer_plans(scenario, w, r, pp, seen) == layer_plans(scenario, w.rank_layers(r, pp),
                                                                         w.parameters, seen)
    assert len({id(p) for p in each}) < per + 8  # the copies share block 0's plans either way


# Scenario keys outside simddp.workload.workload_key, each with a value other than the bases': a workload shared
# by scenarios differing in them must be the workload each would build.
_OUTSIDE_THE_KEY = {
    "cluster.num_nodes": "half", "cluster.preset": "dgx-h200-141gb", "training.global_batch_size": "double",
    "training.recompute": "full", "training.optimizer": "sgd", "parallelism.zero_stage": 1,
    "ddp.bucket_cap_mb": 5, "ddp.implementation": "megatron", "memory.fragmentation_fraction": 0.2,
    "training.grad_clip_norm": 1.0,
}


@pytest.mark.parametrize("path", ["simddp/default_scenario.yaml", "examples/gpt3-175b-3d-1024xA100.yaml"])
@pytest.mark.parametrize(("key", "value"), _OUTSIDE_THE_KEY.items())
def test_a_shared_workload_is_the_one_each_scenario_builds(path: str, key: str, value: object) -> None:
    from simddp import load_scenario
    from simddp.config import ScenarioError, set_value
    from simddp.sweeps import as_scenario_dict
    from simddp.workload import fresh_workload, workload_key

    base = load_scenario(path)
    if value == "half":  # a smaller cluster, with the batch that keeps the base's micro-batches
        value = base.cluster.num_nodes // 2
        data = set_value(as_scenario_dict(base), "training.global_batch_size", base.global_batch_size // 2)
    else:
        data = as_scenario_dict(base)
    if value == "double":
        value = 2 * base.global_batch_size
    try:
        variant = scenario_from_dict(set_value(data, key, value))
    except ScenarioError as err:
        pytest.fail(f"{key}={value!r} should be a valid variant of {path}: {err}")
    assert workload_key(variant) == workload_key(base)
    assert build_workload(variant) is build_workload(base)
    assert fresh_workload(variant) == fresh_workload(base)


@pytest.mark.parametrize(("key", "value"), [
    ("training.seq_len", 2048), ("training.micro_batch_size", 2), ("training.precision", "fp16-mixed"),
    ("training.attention", "unfused"), ("training.dropout", False), ("training.cross_entropy", "unfused"),
    ("parallelism.tp", 2), ("parallelism.sequence_parallel", True), ("parallelism.pp", 2),
    ("model.preset", "gpt2-medium"),
])
def test_each_workload_key_changes_the_workload(key: str, value: object) -> None:
    """Every field of the key matters: changing it alone builds another workload (so none is there for nothing)."""
    from simddp.config import set_value
    from simddp.workload import fresh_workload, workload_key

    base = base_scenario(training={"micro_batch_size": 4, "seq_len": 1024, "global_batch_size": 64})
    first = scenario_from_dict(base)
    data = set_value(base, key, value)
    if key == "parallelism.sequence_parallel":
        data = set_value(data, "parallelism.tp", 2)
        first = scenario_from_dict(set_value(base, "parallelism.tp", 2))
    variant = scenario_from_dict(data)
    assert workload_key(variant) != workload_key(first)
    assert fresh_workload(variant) != fresh_workload(first)
    assert build_workload(variant) is not build_workload(first)


def _structure(w: object) -> tuple[object, ...]:
    """What a workload's ``shared`` memo is derived from: parameters, ready order, each layer's ownership."""
    return (w.parameters, w.grad_ready_order,  # type: ignore[attr-defined]
            tuple((la.param_indices, la.stage, la.block) for la in w.layers))  # type: ignore[attr-defined]


_STRUCTURE_BASE = {"training": {"micro_batch_size": 4, "seq_len": 1024, "global_batch_size": 64},
                   "parallelism": {"tp": 2}}


@pytest.mark.parametrize(("key", "value"), [
    ("training.seq_len", 2048), ("training.micro_batch_size", 2), ("training.attention", "unfused"),
    ("training.dropout", False), ("training.cross_entropy", "unfused"), ("parallelism.sequence_parallel", True),
])
def test_workloads_of_one_structure_key_share_an_equal_structure(key: str, value: object) -> None:
    """The workload_key fields outside structure_key change kernels, never the parameters or which layer owns
    them: workloads differing in them share one ``shared`` memo, and its values are those of a fresh build."""
    from simddp.config import set_value
    from simddp.sim.plan import rank_gradients
    from simddp.workload import fresh_workload, structure_key, workload_key

    first = scenario_from_dict(base_scenario(**_STRUCTURE_BASE))
    variant = scenario_from_dict(set_value(base_scenario(**_STRUCTURE_BASE), key, value))
    assert workload_key(variant) != workload_key(first)
    assert structure_key(variant) == structure_key(first)
    assert _structure(fresh_workload(variant)) == _structure(fresh_workload(first))
    shared, alone = build_workload(variant), fresh_workload(variant)
    assert shared.shared is build_workload(first).shared
    assert rank_gradients(variant, shared) == rank_gradients(variant, alone)


@pytest.mark.parametrize(("key", "value"), [
    ("training.precision", "fp32"), ("parallelism.tp", 4), ("parallelism.pp", 2), ("model.preset", "gpt2-medium"),
])
def test_each_structure_key_changes_the_structure(key: str, value: object) -> None:
    from simddp.config import set_value
    from simddp.workload import fresh_workload, structure_key

    first = scenario_from_dict(base_scenario(**_STRUCTURE_BASE))
    variant = scenario_from_dict(set_value(base_scenario(**_STRUCTURE_BASE), key, value))
    assert structure_key(variant) != structure_key(first)
    assert _structure(fresh_workload(variant)) != _structure(fresh_workload(first))
    assert build_workload(variant).shared is not build_workload(first).shared


def test_virtual_stages_change_the_structure() -> None:
    from simddp.workload import fresh_workload, structure_key

    par = {"tp": 1, "pp": 2, "pipeline_schedule": "interleaved-1f1b"}
    two = scenario_from_dict(base_scenario(parallelism={**par, "virtual_stages": 2},
                                           training={"global_batch_size": 64}))
    four = scenario_from_dict(base_scenario(parallelism={**par, "virtual_stages": 4},
                                            training={"global_batch_size": 64}))
    assert structure_key(two) != structure_key(four)
    assert _structure(fresh_workload(two)) != _structure(fresh_workload(four))


def _small_pipeline(layers: int, pp: int, v: int) -> Scenario | None:
    """A small transformer of ``layers`` blocks over ``pp`` stages of ``v`` chunks each (1F1B, or interleaved
    with v > 1), or None where no such scenario is valid."""
    from simddp.errors import ScenarioError

    data = deep_merge(base_scenario(), {
        "cluster": {"num_nodes": pp},
        "model": {"preset": None, "transformer": {
            "num_layers": layers, "hidden_size": 256, "num_heads": 4, "ffn_hidden_size": 1024,
            "vocab_size": 1000, "max_position_embeddings": 1024}},
        "training": {"micro_batch_size": 1, "global_batch_size": 24 * pp},
        "parallelism": {"pp": pp, "virtual_stages": v, "pipeline_schedule": "interleaved-1f1b" if v > 1 else "1f1b"}})
    try:
        return scenario_from_dict(data)
    except (ScenarioError, ValueError):
        return None


def test_rank_twins_from_the_layout_are_the_walks() -> None:
    """A transformer workload knows its pipeline ranks' twins from how it lays blocks out
    (``workload._block_twins``); the walk over every rank's layers and parameters (Workload.rank_twins on a
    workload without that answer) must give the same, with equal and unequal stages, interleaved or not."""
    from dataclasses import replace

    checked, unequal, kinds = 0, 0, set()
    for layers in (12, 13, 15, 16, 17, 19, 20, 24, 30):
        for pp in (2, 3, 4, 5, 6, 7, 8):
            for v in (1, 2, 3):
                scenario = _small_pipeline(layers, pp, v)
                if scenario is None:
                    continue
                w = build_workload(scenario)
                walked = replace(w, memo={}).rank_twins(pp)
                assert ("rank twins", pp) in w.memo or layers < pp * v  # answered from the layout
                assert w.rank_twins(pp) == walked, (layers, pp, v)
                checked += 1
                unequal += layers % (pp * v) != 0
                kinds.add(len({first for first, _ in walked}))
    assert checked >= 150 and unequal >= 100  # the grid's cases, most with stages of unequal sizes
    assert max(kinds) >= 4  # some with middle ranks of more than one kind


def test_rank_layers_from_the_layout_are_the_walks() -> None:
    """Each pipeline rank's layers and each virtual stage's positions among them come from the blocks' first
    layers where the workload says where its blocks are (Workload._stage_runs); a walk over every layer must
    give the same, with equal and unequal stages, interleaved or not, and with the layout left out."""
    from dataclasses import replace

    checked = 0
    for layers in (1, 2, 7, 12, 13, 16, 19):
        for pp in (1, 2, 3, 4, 8):
            for v in (1, 2, 3):
                scenario = _small_pipeline(layers, pp, v)
                if scenario is None:
                    continue
                w = build_workload(scenario)
                assert w.blocks is not None
                ranks: list[list[object]] = [[] for _ in range(pp)]
                positions: list[dict[int, list[int]]] = [{} for _ in range(pp)]
                for layer in w.layers:  # the walk over every layer
                    r = layer.stage % pp
                    positions[r].setdefault(layer.stage, []).append(len(ranks[r]))
                    ranks[r].append(layer)
                for workload in (replace(w, memo={}), replace(w, memo={}, blocks=None)):
                    for r in range(pp):
                        assert workload.rank_layers(r, pp) == tuple(ranks[r]), (layers, pp, v, r)
                        assert all(a is b for a, b in zip(workload.rank_layers(r, pp), ranks[r], strict=True))
                        assert workload.rank_stage_positions(r, pp) == positions[r], (layers, pp, v, r)
                checked += 1
    assert checked >= 40


@pytest.mark.parametrize(("layers", "pp", "v"), [(12, 4, 1), (13, 4, 1), (16, 4, 2), (19, 3, 2), (7, 2, 3)])
def test_block_layers_read_as_the_tuple_of_every_layer(layers: int, pp: int, v: int) -> None:
    """A pipeline workload's layers (BlockLayers: block i made when first read) read as the tuple of every layer
    made at once: each index and slice, the stages without making a layer, equality;
    and reading one position makes only its block."""
    import random

    from simddp.workload import BlockLayers, fresh_workload

    scenario = _small_pipeline(layers, pp, v)
    assert scenario is not None
    lazy = fresh_workload(scenario).layers
    assert isinstance(lazy, BlockLayers)
    every = fresh_workload(scenario).layers.materialize()
    n = len(every)
    assert len(lazy) == n
    start, per, _ = fresh_workload(scenario).blocks or (0, 0, 0)
    # The stages without making a layer: where they can change (each head and tail layer, each block's first), and
    # each block's, which every layer of the block has.
    probes = lazy.stage_probes()
    assert [i for i, _ in probes] == [*range(start), *range(start, start + per * layers, per),
                                      *range(start + per * layers, n)]
    assert probes == [(i, every[i].stage) for i, _ in probes]
    assert lazy.block_stages == tuple(every[start + b * per].stage for b in range(layers))
    assert all(la.stage == lazy.block_stages[la.block] for la in every if la.block is not None)
    assert sum(made is not None for made in lazy._made) == 1  # block 0 (the template) only, until read
    lazy[start + per * (layers - 1)]  # a position in the last block
    assert sum(made is not None for made in lazy._made) == min(2, layers)
    rnd = random.Random(layers * 100 + pp * 10 + v)
    for _ in range(200):
        lo, hi = sorted(rnd.randrange(-2, n + 3) for _ in range(2))
        assert lazy[lo:hi] == every[lo:hi], (lo, hi)
        i = rnd.randrange(-n, n)
        assert lazy[i] == every[i]
    assert lazy[::3] == every[::3] and tuple(lazy) == every and lazy == every and hash(lazy) == hash(every)
    assert lazy != list(every)  # as a tuple compares
    with pytest.raises(IndexError):
        lazy[n]
    with pytest.raises(IndexError):
        lazy[-n - 1]
    # Against the parameters, made apart (workload._transformer_params): a block's layers own parameters of that
    # block's module names, every parameter once.
    parameters = fresh_workload(scenario).parameters
    owned = [g for layer in lazy for g in layer.param_indices]
    assert sorted(owned) == list(range(len(parameters)))
    for layer in lazy:
        if layer.block is not None:
            prefix = f"transformer.h.{layer.block}."
            assert layer.name.startswith(prefix)
            assert all(parameters[g].name.startswith(prefix) for g in layer.param_indices), layer.name


@pytest.mark.parametrize(("layers", "pp", "v", "tied"), [(12, 4, 1, True), (13, 4, 1, False), (7, 2, 3, True),
                                                         (1, 1, 1, False)])
def test_block_params_read_as_the_tuple_of_every_parameter(layers: int, pp: int, v: int, tied: bool) -> None:
    """A transformer's parameters (BlockParams: block i's renamed copies of block 0's, made when first read) read
    as the tuple of every parameter, however they are read: by index (negative too), slice, iteration, equality,
    hashing, pickling; reading makes only the blocks read, their sizes none; and against the layers, block i's
    parameters are named for block i and sized as block 0's."""
    import pickle
    import random

    from simddp.workload import BlockParams, fresh_workload

    scenario = _small_pipeline(layers, pp, v)
    assert scenario is not None
    scenario = scenario.model_copy(update={"model": scenario.model.model_copy(update={
        "transformer": scenario.model.transformer.model_copy(update={"tied_embeddings": tied})})})
    lazy = fresh_workload(scenario).parameters
    assert isinstance(lazy, BlockParams)
    every = tuple(fresh_workload(scenario).parameters)  # iteration, block by block
    n = len(every)
    assert len(lazy) == n and len(lazy._unmade) == layers - 1
    start, per, _ = fresh_workload(scenario).blocks or (0, 0, 0)
    lazy[start + per * (layers - 1) + 1]  # a parameter of the last block: that block made, no other
    assert len(lazy._unmade) == max(layers - 2, 0)
    rnd = random.Random(layers * 10 + pp)
    made = set(lazy._unmade)
    sizes = lazy.sizes()  # every parameter's (numel, dtype), without making a block
    assert sizes == [(p.numel, p.dtype) for p in every] and lazy._unmade == made
    assert fresh_workload(scenario).param_sizes() == sizes
    for _ in range(100):
        i = rnd.randrange(-n, n)
        assert lazy[i] == every[i]
        lo, hi = sorted(rnd.randrange(-2, n + 3) for _ in range(2))
        assert lazy[lo:hi] == every[lo:hi]
    with pytest.raises(IndexError):
        lazy[n]
    with pytest.raises(IndexError):
        lazy[-n - 1]
    assert lazy == every and hash(lazy) == hash(every) and tuple(lazy) == every
    assert lazy != list(every)  # as a tuple compares
    assert pickle.loads(pickle.dumps(fresh_workload(scenario).parameters)) == every
    names = [p.name for p in every]
    assert len(set(names)) == n  # every parameter once
    layers_made = fresh_workload(scenario).layers
    first = {g: every[g] for la in layers_made if la.block == 0 for g in la.param_indices}
    for la in layers_made:
        if la.block is not None:
            assert all(every[g].name.startswith(f"transformer.h.{la.block}.") for g in la.param_indices), la.name
            shift = la.block * len(first)  # a block's parameters: block 0's, shifted by whole blocks
            assert [every[g][1:] for g in la.param_indices] == [first[g - shift][1:] for g in la.param_indices]


@pytest.mark.parametrize(("layers", "pp", "v", "tied"), [(12, 4, 1, True), (13, 4, 1, False), (7, 2, 3, True),
                                                         (1, 1, 1, False), (5, 1, 1, True)])
def test_block_ready_order_is_the_reverse_of_the_made_layers(layers: int, pp: int, v: int, tied: bool) -> None:
    """A transformer's gradient-ready order (BlockReady: the blocks' parts made only when read whole) is the
    layers' parameters in reverse execution order, each at its first appearance (the tied weight at the output
    layer), however it is read (index, slice, iteration, equality, hashing, pickling, repr); and a pipeline rank's
    parameters, or any subset (a block read in part), sort by it as by the whole order's positions; their local
    positions (BlockReady.positions) and their size counts (Workload.size_counts) are as read id by id."""
    import pickle
    import random
    from collections import Counter

    from simddp.workload import BlockReady, fresh_workload

    scenario = _small_pipeline(layers, pp, v)
    assert scenario is not None
    scenario = scenario.model_copy(update={"model": scenario.model.model_copy(update={
        "transformer": scenario.model.transformer.model_copy(update={"tied_embeddings": tied})})})
    w = fresh_workload(scenario)
    lazy = w.grad_ready_order
    assert isinstance(lazy, BlockReady)
    expected = tuple(dict.fromkeys(g for la in reversed(tuple(w.layers)) for g in reversed(la.param_indices)))
    assert sorted(expected) == list(range(len(w.parameters)))
    assert len(lazy) == len(expected)
    assert lazy.sorted_ids(range(len(expected))) == list(expected)  # before anything makes the whole order
    rnd = random.Random(layers * 10 + pp)
    position = {g: k for k, g in enumerate(expected)}
    def local(ids: list[int]) -> list[int]:
        """The positions in ``ids`` (ascending) of its entries in ready order (positions())."""
        place = {g: k for k, g in enumerate(ids)}
        return [place[g] for g in sorted(ids, key=position.__getitem__)]

    def counts(ids: list[int]) -> tuple[int, tuple]:
        """The elements of ``ids`` and their count per (numel, dtype), parameter by parameter."""
        made = [w.parameters[g] for g in ids]
        return sum(p.numel for p in made), tuple(Counter((p.numel, p.dtype) for p in made).items())

    for r in range(pp):  # each rank's own parameters, as the plan sorts them
        ids = fresh_workload(scenario).rank_param_ids(r, pp)
        assert lazy.sorted_ids(ids) == sorted(ids, key=position.__getitem__)
        assert lazy.positions(ids) == local(ids)
        assert w.size_counts(ids) == counts(ids)  # whole blocks: counted from block 0
    for _ in range(30):  # any subset, blocks in part among them
        ids = rnd.sample(range(len(expected)), rnd.randrange(len(expected) + 1))
        assert lazy.sorted_ids(ids) == sorted(ids, key=position.__getitem__)
        assert lazy.positions(sorted(ids)) == local(sorted(ids))
        assert w.size_counts(sorted(ids)) == counts(sorted(ids)) and w.size_counts(ids) == counts(ids)
    n = len(expected)
    for _ in range(50):
        i = rnd.randrange(-n, n)
        assert lazy[i] == expected[i]
        lo, hi = sorted(rnd.randrange(-2, n + 3) for _ in range(2))
        assert lazy[lo:hi] == expected[lo:hi]
    assert lazy == expected and hash(lazy) == hash(expected) and tuple(lazy) == expected
    assert lazy != list(expected) and repr(lazy) == repr(expected)
    assert pickle.loads(pickle.dumps(lazy)) == expected
    assert not BlockReady([0], [1, 2], 2, [0]).is_permutation(5)  # an index twice
    assert not BlockReady([6], [1, 2], 2, [0]).is_permutation(6)  # one out of range
    assert not BlockReady([3], [1, 2], 2, [0]).is_permutation(6)  # one inside the blocks
    assert BlockReady([5], [2, 1], 2, [0]).is_permutation(6)


def test_a_step_makes_no_block_until_its_layers_are_read() -> None:
    """The fast path reads a transformer's parameters and layer plans from block 0 and the blocks' layout, and
    plans a pipeline's twin ranks from their first rank's plan: GPT-3's 96 blocks on pp 8 with 3 chunks, and the
    7B model's 32 on one stage, make none but block 0, of layers or parameters. Asking a rank's layers
    (RankLayers) makes them then, equal to the walk's; a trace (spans named after layers) makes every block, with
    the same step."""
    from simddp import engine_caches
    from simddp.sim.plan import build_plan
    from simddp.sim.step import simulate_step
    from simddp.workload import BlockLayers

    gpt3 = scenario_from_dict(deep_merge(base_scenario(), {
        "model": {"preset": "gpt3-175b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8},
        "parallelism": {"tp": 8, "pp": 8, "pipeline_schedule": "interleaved-1f1b", "virtual_stages": 3},
        "training": {"micro_batch_size": 1, "global_batch_size": 64, "seq_len": 2048}}))
    llama = scenario_from_dict(deep_merge(base_scenario(), {"model": {"preset": "llama2-7b"}}))
    for scenario, blocks in ((gpt3, 96), (llama, 32)):
        engine_caches.clear()
        w = build_workload(scenario)  # built anew, and the one simulate_step finds
        lazy = w.layers
        assert isinstance(lazy, BlockLayers) and len(lazy._made) == blocks
        fast = simulate_step(scenario, trace=False)
        assert [i for i, made in enumerate(lazy._made) if made is not None] == [0]
        # Parameters (BlockParams): none but block 0 either; the step reads their sizes (Workload.param_sizes).
        assert set(range(blocks)) - w.parameters._unmade == {0}
        pp = scenario.parallelism.pp
        rank = build_plan(scenario, w).ranks[pp // 2]
        assert len(rank.layers) == w.rank_layer_count(pp // 2, pp)  # its length, without making it
        assert [i for i, made in enumerate(lazy._made) if made is not None] == [0]
        assert tuple(rank.layers) == tuple(la for la in tuple(lazy) if la.stage % pp == pp // 2)
        traced = simulate_step(scenario, trace=True)
        assert None not in lazy._made
        assert traced.step_time_s == pytest.approx(fast.step_time_s, rel=1e-9)


@pytest.mark.parametrize(("layers", "pp", "v"), [(1, 1, 1), (12, 1, 1), (12, 4, 1), (13, 4, 1), (16, 4, 2),
                                                 (19, 3, 2), (7, 2, 3)])
def test_what_the_plan_reads_without_making_blocks_is_the_made_layers(layers: int, pp: int, v: int) -> None:
    """What the plan reads of a transformer's layers without making its blocks equals what the layers made at
    once give: each layer's parameters (BlockLayers.param_indices, of any run too; per rank,
    Workload.rank_layer_params), the
    layers as pieces of whole blocks (BlockLayers.run_pieces, Workload.rank_pieces) and the layer plans made
    from those; for one stage (pp 1) too, whose rank holds the workload's layers themselves."""
    import random
    from dataclasses import replace

    from simddp.sim.plan import layer_plans, rank_layer_plans
    from simddp.workload import BlockLayers, RankLayers, fresh_workload
    from simddp.zero import zero_rule

    scenario = _small_pipeline(layers, pp, v)
    assert scenario is not None
    w = fresh_workload(scenario)
    lazy = w.layers
    assert isinstance(lazy, BlockLayers)
    every = fresh_workload(scenario).layers.materialize()
    n, per = len(every), len(lazy.first_block)

    def check(pieces: list, expected: tuple) -> None:
        """The pieces stand for ``expected``: its layers, or whole blocks (``per`` layers of one block each)."""
        pos = 0
        for piece in pieces:
            if isinstance(piece, int):
                blocks = expected[pos:pos + piece * per]
                ids = list(dict.fromkeys(la.block for la in blocks))
                assert piece > 0 and None not in ids and len(ids) == piece
                assert [la.block for la in blocks] == [b for b in ids for _ in range(per)]
                pos += piece * per
            else:
                assert tuple(piece) == expected[pos:pos + len(piece)]
                pos += len(piece)
        assert pos == len(expected)

    assert lazy.param_indices() == [la.param_indices for la in every]
    check(lazy.run_pieces(0, n), every)
    rule = zero_rule(scenario)

    def unnamed(plans: list) -> list:
        """Plans without their timing's name: identical layers share one plan, named after the first planned."""
        return [replace(p, timing=replace(p.timing, name="")) for p in plans]

    assert layer_plans(scenario, lazy, w.parameters, {}, rule) == layer_plans(scenario, every, w.parameters, {}, rule)
    assert sum(made is not None for made in lazy._made) == 1  # block 0 only: none of this made a block
    for r in range(pp):
        theirs = tuple(la for la in every if la.stage % pp == r)
        assert w.rank_layer_params(r, pp) == [la.param_indices for la in theirs], r
        assert w.rank_param_ids(r, pp) == sorted({g for la in theirs for g in la.param_indices})
        pieces = w.rank_pieces(r, pp)
        assert pieces is not None
        check(pieces, theirs)
        assert unnamed(rank_layer_plans(scenario, w, r, pp, {}, rule)) == unnamed(
            layer_plans(scenario, theirs, w.parameters, {}, rule))
        held = w.held_layers(r, pp)
        assert (held is lazy) if pp == 1 else isinstance(held, RankLayers)
    assert sum(made is not None for made in lazy._made) == 1
    rnd = random.Random(layers * 100 + pp * 10 + v)
    for _ in range(100):  # any run of positions, parts of blocks included
        lo, hi = sorted(rnd.randrange(0, n + 1) for _ in range(2))
        check(lazy.run_pieces(lo, hi), every[lo:hi])
        # a run's parameters, from its own blocks only (a 1F1B rank's), parts of blocks and the head and tail too
        assert lazy.param_indices(lo, hi) == [la.param_indices for la in every[lo:hi]], (lo, hi)
    for i in range(n):  # every block made one read at a time: reads then go to one tuple of every layer
        assert lazy[i] == every[i]
    assert lazy._all == every


@pytest.mark.parametrize(("layers", "pp", "v"), [(12, 1, 1), (12, 4, 1), (13, 4, 2), (24, 4, 3)])
def test_each_layers_buckets_by_slices_are_the_lookups(layers: int, pp: int, v: int) -> None:
    """The plan's buckets of each layer's parameters (sim.plan._bucket_of_layer): where the layers own the rank's
    parameters one after another, slices of the buckets by parameter; they equal looking each parameter up, as
    does the lookup it falls back to where the layers do not (here: the layers in reverse) or may not (a model
    whose blocks' layers own theirs out of order, as the 7B default's, BlockLayers.owns_in_order).

    A 7B block's norm comes first in the forward and after the attention's weights among its parameters."""
    from simddp.sim.plan import _bucket_of_layer, rank_gradients
    from simddp.workload import BlockLayers

    scenario = _small_pipeline(layers, pp, v)
    assert scenario is not None
    w = build_workload(scenario)
    assert isinstance(w.layers, BlockLayers)
    for r in range(pp):
        grads = rank_gradients(scenario, w, r)
        owned = w.rank_layer_params(r, pp)
        bucket = {grads.global_ids[p]: b.index for b in grads.buckets for p in b.param_indices}
        expected = [[bucket[g] for g in own] for own in owned]
        assert len(grads.buckets) > 1 and any(len(e) > 1 for e in expected)
        assert w.layers.owns_in_order  # GPT-2-style blocks
        for in_order in (True, False):
            assert _bucket_of_layer(grads, owned, set(), in_order) == expected
            assert _bucket_of_layer(grads, owned[::-1], set(), in_order) == expected[::-1]  # not in order: looked up
            some = {grads.global_ids[0]}
            assert _bucket_of_layer(grads, owned, some, in_order) == [[bucket[g] for g in own if g not in some]
                                                                       for own in owned]


def test_blocks_that_own_their_parameters_out_of_order_are_known() -> None:
    """The 7B default's blocks own their parameters out of order (BlockLayers.owns_in_order), GPT-3's in order."""
    from simddp.workload import BlockLayers

    for preset, in_order in (("llama2-7b", False), ("gpt3-175b", True)):
        w = build_workload(scenario_from_dict(deep_merge(base_scenario(), {"model": {"preset": preset}})))
        assert isinstance(w.layers, BlockLayers)
        flat = [g for la in w.layers for g in la.param_indices]
        assert w.layers.owns_in_order is in_order is (flat == sorted(flat))
