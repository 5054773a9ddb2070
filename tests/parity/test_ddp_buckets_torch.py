"""Parity of :func:`simddp.bucketing.ddp_buckets` with the buckets real torch DDP rebuilds.

Each case trains a real model under ``DistributedDataParallel`` (gloo, world size 1, CPU, in-process)
for three iterations, records the gradient-ready order of the first backward with
``register_post_accumulate_grad_hook``, and compares torch's rebuilt buckets
(``_get_ddp_logging_data()["rebuilt_bucket_sizes"]`` / ``["rebuilt_per_bucket_param_indices"]``) with
simddp's. A second group checks the leftover-bucket order for many dtypes against torch's own
``dist._compute_bucket_assignment_by_size``, which is the function ``Reducer::rebuild_buckets`` calls.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from simddp.bucketing import bucket_size_limits, ddp_buckets, ddp_initial_buckets
from simddp.config import ParameterSpec
from simddp.units import DTYPE_BYTES

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

nn = torch.nn
DistributedDataParallel = torch.nn.parallel.DistributedDataParallel


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-rank gloo group on a FileStore (no network port needed)."""
    if dist.is_initialized():  # someone else's group: use it, leave it alone
        yield
        return
    store = dist.FileStore(str(tmp_path_factory.mktemp("ddp") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------- models
class FrozenMLP(nn.Module):
    """Layers of varied widths, one of them frozen (DDP leaves it out of its parameter list)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(64, 300),
            nn.ReLU(),
            nn.Linear(300, 1000),
            nn.GELU(),
            nn.Linear(1000, 200, bias=False),
            nn.Linear(200, 700),
            nn.Tanh(),
            nn.Linear(700, 37),
            nn.Linear(37, 10),
        )
        self.layers[4].requires_grad_(False)

    def forward(self, x):
        return self.layers(x)


def mlp():
    return FrozenMLP(), lambda: torch.randn(4, 64)


def transformer():
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1000, 128)
            layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
            self.head = nn.Linear(128, 1000)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    return Encoder(), lambda: torch.randint(0, 1000, (2, 16))


def resnet():
    class Block(nn.Module):
        def __init__(self, ch):
            super().__init__()
            self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(ch)
            self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(ch)

        def forward(self, x):
            return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))

    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        Block(32),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        Block(64),
        nn.Conv2d(64, 128, 3, stride=2, padding=1),
        Block(128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )
    return model, lambda: torch.randn(2, 3, 16, 16)


def mixed_dtype():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(64, 512)
            self.f64 = nn.Linear(512, 512).double()
            self.bf16 = nn.Linear(512, 700).to(torch.bfloat16)
            self.mid = nn.Linear(700, 300)
            self.f64b = nn.Linear(300, 128).double()
            self.out = nn.Linear(128, 10)

        def forward(self, x):
            x = self.f64(self.inp(x).double())
            x = self.mid(self.bf16(x.to(torch.bfloat16)).float())
            return self.out(self.f64b(x.double()).float())

    return Mixed(), lambda: torch.randn(4, 64)


def out_of_order():
    """Modules defined in another order than used, two parallel branches, and a tied weight."""

    class Tangled(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(256, 2000)
            self.branch_b = nn.Sequential(nn.Linear(256, 600), nn.ReLU(), nn.Linear(600, 256))
            self.late = nn.Linear(256, 256)
            self.branch_a = nn.Linear(256, 256)
            self.trunk = nn.Sequential(nn.Linear(256, 800), nn.ReLU(), nn.Linear(800, 256))
            self.embed = nn.Embedding(2000, 256)
            self.embed.weight = self.head.weight  # tied: DDP keeps one copy, ready after both uses

        def forward(self, tokens):
            x = self.trunk(self.embed(tokens))
            x = self.late(self.branch_a(x) + self.branch_b(x))
            return self.head(x)

    return Tangled(), lambda: torch.randint(0, 2000, (2, 8))


MODELS: dict[str, Callable] = {
    "mlp": mlp,
    "transformer": transformer,
    "resnet": resnet,
    "mixed_dtype": mixed_dtype,
    "out_of_order": out_of_order,
}
CAPS = [None, 0.3, 0.5, 1, 5, 25]


# ------------------------------------------------------------------------------------- harness
def reducer_parameters(model: nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters DDP's Reducer indexes: requiring grad, shared ones once, in module order."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def run_ddp(model: nn.Module, make_input, bucket_cap_mb):
    """Three DDP iterations; returns (ready order of iteration 1, rebuilt sizes, rebuilt indices)."""
    params = [p for _, p in reducer_parameters(model)]
    position = {id(p): i for i, p in enumerate(params)}
    ready: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p: ready.append(position[id(p)])) for p in params]
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    assert [id(p) for p in ddp._build_params_for_reducer()[0]] == [id(p) for p in params]
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    for step in range(3):
        opt.zero_grad()
        out = ddp(make_input())
        out.float().square().mean().backward()
        opt.step()
        if step == 0:
            for h in handles:
                h.remove()
    data = ddp._get_ddp_logging_data()
    assert data["has_rebuilt_buckets"] == 1
    # Logger::set_runtime_stats_and_log joins buckets with ", " and indices within a bucket with " ".
    sizes = [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]
    indices = [[int(i) for i in b.split()] for b in data["rebuilt_per_bucket_param_indices"].split(", ")]
    return ready, sizes, indices


def specs(model: nn.Module) -> list[ParameterSpec]:
    return [
        ParameterSpec(name=name, numel=p.numel(), dtype=str(p.dtype).removeprefix("torch."))
        for name, p in reducer_parameters(model)
    ]


@pytest.mark.parametrize("bucket_cap_mb", CAPS, ids=lambda c: f"cap={c}")
@pytest.mark.parametrize("model_name", list(MODELS))
def test_rebuilt_buckets_match_torch(process_group, model_name, bucket_cap_mb):
    torch.manual_seed(0)
    model, make_input = MODELS[model_name]()
    params = specs(model)
    ready, torch_sizes, torch_indices = run_ddp(model, make_input, bucket_cap_mb)
    assert sorted(ready) == list(range(len(params)))

    buckets = ddp_buckets(params, ready_order=ready, bucket_cap_mb=bucket_cap_mb)
    assert [b.param_indices for b in buckets] == torch_indices
    assert [b.size_bytes for b in buckets] == torch_sizes


def test_cases_exercise_what_they_claim():
    """Guard the parity matrix: several buckets, reordered readiness, several dtypes."""
    torch.manual_seed(0)
    counts = {}
    for name, build in MODELS.items():
        model, _ = build()
        params = specs(model)
        counts[name] = len(ddp_buckets(params, bucket_cap_mb=0.5))
    assert all(n >= 3 for n in counts.values()), counts
    assert len({p.dtype for p in specs(mixed_dtype()[0])}) == 3
    assert len(specs(mlp()[0])) < len(list(mlp()[0].parameters()))  # the frozen layer is left out


def test_out_of_order_model_is_not_ready_in_reverse_definition_order(process_group):
    torch.manual_seed(0)
    model, make_input = out_of_order()
    ready, _, _ = run_ddp(model, make_input, 1)
    assert ready != list(range(len(ready) - 1, -1, -1))


# ------------------------------------------------- compute_bucket_assignment_by_size, many dtypes
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPE_BYTES}


@pytest.mark.parametrize("seed", range(60))
def test_assignment_matches_torch_for_random_dtype_mixes(seed):
    """Leftover order across dtypes (libstdc++ unordered_map iteration) and per-dtype limits."""
    rng = random.Random(seed)
    num_dtypes = rng.randint(1, len(TORCH_DTYPES))
    dtypes = rng.sample(list(TORCH_DTYPES), num_dtypes)
    num = rng.randint(1, 40)
    params = [ParameterSpec(name=f"p{i}", numel=rng.randint(1, 3000), dtype=rng.choice(dtypes)) for i in range(num)]
    order = list(range(num))
    rng.shuffle(order)
    cap_mb = rng.choice([0.001, 0.004, 0.01, 0.03])
    tensors = [torch.empty(params[i].numel, dtype=TORCH_DTYPES[params[i].dtype]) for i in order]
    limits = list(bucket_size_limits(cap_mb))
    torch_indices, torch_limits = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * num, order)

    buckets = ddp_buckets(params, ready_order=order, bucket_cap_mb=cap_mb)
    assert [b.param_indices for b in buckets] == torch_indices
    assert [b.cap_bytes for b in buckets] == torch_limits


@pytest.mark.parametrize(
    "dtype_order",
    [
        ["bool", "float32", "float8_e4m3fn"],  # bool and float8_e4m3fn share a libstdc++ hash slot
        ["float8_e4m3fn", "int8", "bool", "float64"],
        ["float32", "bfloat16", "float16", "float64"],
    ],
)
def test_leftover_order_matches_torch_on_slot_collisions(dtype_order):
    params = [ParameterSpec(name=d, numel=4, dtype=d) for d in dtype_order]
    tensors = [torch.empty(4, dtype=TORCH_DTYPES[d]) for d in dtype_order]
    order = list(range(len(params)))
    limits = list(bucket_size_limits(None))
    torch_indices, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(params), order)
    assert [b.param_indices for b in ddp_buckets(params, ready_order=order)] == torch_indices


@pytest.mark.parametrize("bucket_cap_mb", [None, 0.3, 1, 5], ids=lambda c: f"cap={c}")
@pytest.mark.parametrize("model_name", ["mlp", "transformer", "mixed_dtype"])
def test_find_unused_parameters_keeps_the_initial_buckets(process_group, model_name, bucket_cap_mb):
    """With find_unused_parameters (no static_graph) torch never rebuilds: the Reducer keeps the buckets of
    definition order, reversed (simddp.bucketing.ddp_initial_buckets)."""
    torch.manual_seed(0)
    model, make_input = MODELS[model_name]()
    params = specs(model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=True)
    for _ in range(3):
        ddp(make_input()).float().square().mean().backward()
    data = ddp._get_ddp_logging_data()
    assert data["has_rebuilt_buckets"] == 0
    torch_sizes = [int(s) for s in data["bucket_sizes"].split(", ")]
    assert [b.size_bytes for b in ddp_initial_buckets(params, bucket_cap_mb)] == torch_sizes
