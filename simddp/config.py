"""Scenario models: what the user asks simddp about.

Every model is a frozen pydantic v2 model with ``extra="forbid"``; each field's description is the
help text of the CLI and the dashboard. Presets expand before validation, so a scenario that says
``cluster: {preset: dgx-h100-80gb, num_nodes: 16}`` validates into a complete :class:`Cluster` whose
other fields the user may still override key by key.

Hardware (cluster), workload (model, training) and execution (parallelism, ddp) are kept apart, as in
NVIDIA's Calculon. Units are in the field names and are converted once, in :mod:`simddp.units`.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from simddp import safeio
from simddp.errors import ScenarioError
from simddp.keys import closest_key, model_at, submodels, unknown_key_message
from simddp.presets import CLUSTER_PRESETS, MODEL_PRESETS
from simddp.units import DTYPE_BYTES, KiB, MiB, parse_rate, parse_size

#: Most GPUs in a scenario (num_nodes x gpus_per_node), and most ranks a calibration run or fit may say it was
#: measured on; also the largest `--num-gpus`. Defined here, where the schema bounds by it; simddp.limits, which
#: holds every other cap, exports it.
MAX_GPUS = 2**24
#: Largest ddp.bucket_cap_mb, MiB: 1 EiB, beyond any model's gradients (and what torch's int(mb * 2^20) holds).
MAX_BUCKET_CAP_MB = 2**40

Precision = Literal["fp32", "bf16-mixed", "fp16-mixed"]
Optimizer = Literal["adamw", "adam", "sgd", "sgd-momentum", "adafactor"]
Algorithm = Literal["auto", "ring", "tree", "nvls", "hierarchical"]
Implementation = Literal["torch", "deepspeed", "megatron"]


def _size(value: Any) -> Any:
    return parse_size(value) if isinstance(value, str) else value


def _rate(value: Any) -> Any:
    return parse_rate(value) if isinstance(value, str) else value


#: A size in bytes: a number of bytes, or a string with a unit ("80GiB", "256MB"; :func:`units.parse_size`).
Bytes = Annotated[int, BeforeValidator(_size)]
#: A rate in bytes/s: a number, or a string with a unit ("25GB/s", "400Gbit/s"; :func:`units.parse_rate`).
BytesPerS = Annotated[float, BeforeValidator(_rate)]


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return any(isinstance(a, bool) for a in args)
    if origin is typing.Union or origin is types.UnionType:
        return any(_admits_bool(a) for a in args)
    return False


def _expected(annotation: Any) -> str:
    """What a field that takes no boolean takes, in words: a number, text (``name=yes`` reads as true in YAML), or
    its choices."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    options = tuple(a for a in options if a is not type(None))
    if len(options) == 1 and options[0] is str:
        return "text (quote it: 'yes')"
    if len(options) == 1 and typing.get_origin(options[0]) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(options[0]))
    return "a number"


def _list_item_type(annotation: Any) -> Any:
    """The item type of ``list[X]`` (or ``list[X] | None``), else None."""
    if typing.get_origin(annotation) is list:
        return (typing.get_args(annotation) or (Any,))[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next((_list_item_type(a) for a in typing.get_args(annotation) if a is not type(None)), None)
    return None


class _Frozen(BaseModel):
    """Base of every input model: frozen, no unknown keys, finite floats, no true/false where a number goes,
    and names without terminal control characters (and, for ``name`` fields, on one line)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers_no_controls(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            value = safeio.strip_control(value)
            if info.field_name == "name" and ("\n" in value or "\r" in value or "\t" in value):
                # a name is one cell of a table, a CSV row and a trace label; torch's never holds these
                raise ValueError("a name is one line: no newlines or tabs")
            return value
        if isinstance(value, bool):
            annotation = _annotation(cls, info)
            if not _admits_bool(annotation):
                raise ValueError(f"expected {_expected(annotation)}, not a boolean")
        elif isinstance(value, int):
            if not -MAX_INPUT_INT <= value <= MAX_INPUT_INT and not _bounded(cls, info):
                _check_int(value, _annotation(cls, info))
        elif isinstance(value, list):
            if any(isinstance(v, bool) for v in value):
                item = _list_item_type(_annotation(cls, info))
                if item is not None and not _admits_bool(item):
                    raise ValueError("expected numbers, not booleans")
            big = [v for v in value if isinstance(v, int) and not -MAX_INPUT_INT <= v <= MAX_INPUT_INT]
            if big:
                _check_int(big[0], _list_item_type(_annotation(cls, info)) or Any)
        return value


#: The largest integer an integer key takes: 2^53, the largest whose float is exact. Sizes, counts and lengths
#: meet floats in the cost models (FLOP, bytes/s); a sequence length of 10^310 ended `simulate` with an internal
#: error ("int too large to convert to float", a probe), where a float 1e310 was refused. No size or count simddp
#: models comes near it (a 1T model has 10^12 parameters; 2^53 bytes is 8 PiB). A key that takes a float takes a
#: larger integer as the float it is (a peak of 2e16 FLOP/s written out in digits), up to what a float holds.
MAX_INPUT_INT = 2**53


def _check_int(value: int, annotation: Any) -> None:
    """Refuse an integer beyond :data:`MAX_INPUT_INT` for a key that takes an integer, and one no float holds for
    a key that takes a float."""
    if _admits_float(annotation) and abs(value) < 2**1023:
        return
    digits = len(str(abs(value))) if abs(value) < 10**4000 else "4,000+"
    limit = "what a float holds" if _admits_float(annotation) else f"the limit of 2^53 ({MAX_INPUT_INT:,})"
    raise ValueError(f"an integer of {digits} digits is over {limit}")


def _bounded(cls: type[BaseModel], info: ValidationInfo) -> bool:
    """Whether the field has an upper bound of its own (``le``/``lt``): its own message names it (a world size of
    at most 16,777,216), and pydantic checks a large integer against it without a float."""
    field = cls.model_fields.get(info.field_name or "")
    return field is not None and any(getattr(m, "le", None) is not None or getattr(m, "lt", None) is not None
                                     for m in field.metadata)


def _admits_float(annotation: Any) -> bool:
    if annotation is float:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, Annotated):
        return any(_admits_float(a) for a in typing.get_args(annotation))
    return False


def _annotation(cls: type[BaseModel], info: ValidationInfo) -> Any:
    """The declared type of the field being validated (looked up only for the values that need it)."""
    return cls.model_fields[info.field_name].annotation if info.field_name else Any


# --------------------------------------------------------------------------------------- hardware
class GPU(_Frozen):
    """One accelerator: spec-sheet peaks and memory, and the kernel-efficiency constants of its GEMMs,
    FlashAttention and memory-bound kernels (see :mod:`simddp.compute`; each preset cites its fit data)."""

    name: str = Field(description="Accelerator name, e.g. 'H100-SXM5-80GB'.")
    num_sms: int = Field(gt=0, description="Streaming multiprocessors (GEMM tiles, attention blocks spread on them).")
    peak_fp32_flop_per_s: float = Field(gt=0, description="Dense FP32 (non-tensor-core) peak, FLOP/s.")
    peak_tf32_flop_per_s: float = Field(gt=0, description="Dense TF32 tensor-core peak, FLOP/s.")
    peak_bf16_flop_per_s: float = Field(gt=0, description="Dense BF16 tensor-core peak, FLOP/s.")
    peak_fp16_flop_per_s: float = Field(gt=0, description="Dense FP16 tensor-core peak, FLOP/s.")
    hbm_bytes: Bytes = Field(gt=0, description="Device memory capacity, bytes.")
    hbm_bandwidth_bytes_per_s: BytesPerS = Field(gt=0, description="Device memory bandwidth (spec sheet), bytes/s.")
    memory_efficiency: float = Field(
        gt=0, le=1, description="Fraction of the memory bandwidth streaming kernels reach (STREAM add/triad)."
    )
    matmul_ceiling_fraction: float = Field(
        gt=0, le=1,
        description="Largest fraction of the dense peak a large GEMM sustains (GEMM benchmarks under sustained "
        "load); never an end-to-end MFU.",
    )
    gemm_k_overhead: float = Field(
        ge=0, description="Pipeline prologue/epilogue of a GEMM tile, in steps of K: a GEMM of depth K reaches "
        "K / (K + this) of the ceiling.",
    )
    gemm_tile_m: int = Field(default=64, gt=0, description="Rows of the smallest GEMM output tile (SM occupancy).")
    gemm_tile_n: int = Field(default=128, gt=0, description="Columns of the smallest GEMM output tile.")
    kernel_launch_s: float = Field(ge=0, description="Fixed cost of every kernel (launch, ramp, tail), seconds.")
    flash_fwd_fraction: float = Field(
        gt=0, le=1, description="Fraction of the dense peak a long FlashAttention forward reaches."
    )
    flash_bwd_fraction: float = Field(
        gt=0, le=1, description="Fraction of the dense peak a long FlashAttention backward reaches."
    )
    flash_key_overhead: float = Field(
        ge=0, description="Per-block cost of a FlashAttention kernel in keys: a block over n keys reaches "
        "n / (n + this) of its rate.",
    )
    fp32_matmul_uses_tf32: bool = Field(
        default=False,
        description="FP32 matmuls run on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32).",
    )

    def peak_flop_per_s(self, precision: str) -> float:
        """Dense peak for the matmul dtype a training precision uses."""
        if precision == "fp32":
            return self.peak_tf32_flop_per_s if self.fp32_matmul_uses_tf32 else self.peak_fp32_flop_per_s
        if precision == "fp16-mixed":
            return self.peak_fp16_flop_per_s
        return self.peak_bf16_flop_per_s

    @property
    def streaming_bandwidth_bytes_per_s(self) -> float:
        """Memory bandwidth a streaming kernel reaches."""
        return self.hbm_bandwidth_bytes_per_s * self.memory_efficiency


class Link(_Frozen):
    """An intra-node link tier in the alpha-beta model: per-hop latency and per-GPU bandwidth."""

    kind: Literal["nvlink", "pcie"] = Field(description="Link technology; selects NCCL's latency table row.")
    latency_s: float = Field(
        ge=0,
        description="Per-hop latency of the ring/Simple protocol (NCCL hwLat: NVLink 3.4 us, PCIe 5.7 us); the "
        "other protocols and algorithms keep NCCL's ratios to it, s.",
    )
    bandwidth_bytes_per_s: BytesPerS = Field(
        gt=0, description="Per-GPU unidirectional bandwidth into the fabric (spec sheet), bytes/s."
    )
    efficiency: float = Field(
        gt=0, le=1, description="Fraction of bandwidth NCCL's ring reaches at large messages (measured)."
    )
    nvls_algbw_bytes_per_s: BytesPerS | None = Field(
        default=None,
        gt=0,
        description="NVLink SHARP (NVLS) all-reduce algorithm bandwidth over all GPUs of a node, bytes/s; "
        "null = no NVLS.",
    )
    nvls_measured_gpus: int | None = Field(
        default=None, ge=1, le=MAX_GPUS,
        description="GPUs of the node nvls_algbw_bytes_per_s was measured over; null = every GPU of this node "
        "(cluster.gpus_per_node). The NVLink wire rate NVLS reaches is that algbw x (G+1)/G for these G GPUs, "
        "whatever the node's size here: the presets say 8, so a node cut to 4 GPUs keeps the same wire.",
    )
    nvls_latency_s: float = Field(
        default=23e-6, ge=0, description="NVLS latency at NCCL's default hop latency (NCCL hwLat NVLink/NVLS: "
        "23 us); scales with latency_s like every other algorithm, seconds."
    )

    @property
    def bus_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency


class Network(_Frozen):
    """The inter-node network: NICs per node, each with a line rate and a per-hop latency."""

    kind: Literal["infiniband", "roce", "efa", "ethernet"] = Field(description="Network technology.")
    nics_per_node: int = Field(gt=0, description="NICs per node used by NCCL (one per GPU on DGX).")
    nic_bandwidth_bytes_per_s: BytesPerS = Field(gt=0, description="Line rate of one NIC, bytes/s.")
    latency_s: float = Field(
        ge=0, description="Per-hop latency of NCCL's ring/Simple protocol (hwLat NET 14 us); the other protocols "
        "and algorithms keep NCCL's ratios to it, s."
    )
    efficiency: float = Field(gt=0, le=1, description="Fraction of line rate NCCL reaches (measured).")

    @property
    def node_bandwidth_bytes_per_s(self) -> float:
        """Achievable bandwidth out of one node over all its NICs."""
        return self.nics_per_node * self.nic_bandwidth_bytes_per_s * self.efficiency


class CollectiveFit(_Frozen):
    """A measured alpha-beta fit of one collective on one link tier, for message sizes in a range.

    Stored per ring step and as bus bandwidth so that it extrapolates to other world sizes with the
    ring step counts of :mod:`simddp.collectives` (time = steps x latency + data factor x size / busbw).
    """

    op: Literal["all-reduce", "reduce-scatter", "all-gather", "broadcast"] = Field(description="Collective.")
    tier: Literal["intra", "inter"] = Field(description="Link tier the measurement exercised.")
    min_bytes: Bytes = Field(ge=0, description="Smallest message size this segment covers, bytes.")
    max_bytes: Bytes = Field(gt=0, description="Largest message size this segment covers, bytes.")
    latency_per_step_s: float = Field(ge=0, description="Fitted latency per ring step, seconds.")
    bus_bandwidth_bytes_per_s: BytesPerS = Field(gt=0, description="Fitted bus bandwidth, bytes/s.")
    rel_residual: float = Field(default=0.0, ge=0, description="Relative RMS residual of the fit.")
    measured_ranks: int = Field(default=2, gt=1, le=MAX_GPUS, description="World size the fit was measured on.")
    ranks_per_node: int = Field(
        default=1, gt=0, le=MAX_GPUS, description="Ranks per node of the measured communicator (1 with the "
        "defaults: the whole node's NICs)."
    )
    gpus_per_node: int = Field(
        default=1, gt=0, le=MAX_GPUS, description="Ranks per node of the measured run: the communicator crossed "
        "nodes on "
        "ranks_per_node / gpus_per_node of each node's NICs; an inter-node fit scales to a group's own share."
    )

    @model_validator(mode="after")
    def _share_at_most_one(self) -> CollectiveFit:
        if self.min_bytes > self.max_bytes:
            raise ValueError(f"min_bytes({self.min_bytes}) must be <= max_bytes({self.max_bytes})")
        if self.ranks_per_node > self.gpus_per_node:
            raise ValueError(
                f"ranks_per_node({self.ranks_per_node}) must be <= gpus_per_node({self.gpus_per_node})"
            )
        return self


class GlooTransport(_Frozen):
    """torch.distributed's gloo backend moving GPU tensors: each collective copies the tensor to pinned host
    memory, runs gloo's ring over TCP on the CPU and copies the result back (``ProcessGroupGloo``'s CUDA
    work: ``AsyncAllreduceCUDAWork``); no NVLink, no GPUDirect, no SMs. Per ring step a fixed cost, then the
    bytes at one TCP stream's rate (capped by the group's share of the NICs across nodes)."""

    latency_s: float = Field(
        default=177e-6, ge=0,
        description="Cost of one ring step (a TCP message and gloo's CPU work), s. Default fit: a 1 KiB "
        "all-reduce of 2 processes on 2 hosts over TCP took 0.354 ms = 2 ring steps (pytorch/gloo#158); held "
        "out: 151 us per step on loopback in docs/calibration.md's CPU acceptance fit.",
    )
    bandwidth_bytes_per_s: BytesPerS = Field(
        default=1.07e9, gt=0,
        description="Bytes/s one gloo ring reaches per rank (a TCP stream driven by one CPU thread). Default "
        "fit: allreduce_ring_chunked of 20 MB between 2 hosts on 40 GbE, 1.07 GB/s (pytorch/gloo#248); held "
        "out: 1.3 GB/s bus bandwidth on loopback in docs/calibration.md's CPU acceptance fit.",
    )
    host_copy_bandwidth_bytes_per_s: BytesPerS = Field(
        default=25.6e9, gt=0,
        description="GPU <-> pinned host memory copy rate, bytes/s (each direction); default PCIe Gen4 x16 at "
        "0.8 of 32 GB/s, the factor SimAI's calbusbw.h uses for A100 PCIe.",
    )


class Cluster(_Frozen):
    """Nodes of identical GPUs joined by an intra-node fabric and an inter-node network."""

    preset: str | None = Field(default=None, description="Cluster preset the fields were filled from.")
    num_nodes: int = Field(gt=0, description="Number of nodes.")
    gpus_per_node: int = Field(gt=0, description="GPUs in each node.")
    gpu: GPU = Field(description="The accelerator.")
    intra_node: Link = Field(description="Link between GPUs of one node.")
    inter_node: Network = Field(description="Network between nodes.")
    host_overhead_s: float = Field(
        default=0.0, ge=0, description="Fixed per-step host overhead (data loading, launches), seconds."
    )
    comm_compute_interference: float = Field(
        default=0.189,
        ge=0,
        description="Compute slowdown while a collective of the same GPU is in flight (NCCL kernels take SMs and "
        "memory bandwidth): kernels run 1 + this times slower. Default: the mean slowdown of overlapped compute "
        "Agrawal et al. measured for GPT and Llama training on A100 and H100 (arXiv:2507.03114, 2025: 18.9%, max "
        "40%); a calibration measures its own.",
    )
    collective_fits: list[CollectiveFit] = Field(
        default_factory=list, description="Measured collective fits (calibration); they replace the link model."
    )
    gloo: GlooTransport = Field(
        default_factory=GlooTransport,
        description="The gloo backend's transport for GPU tensors (ddp.backend: gloo): host staging, TCP ring.",
    )
    host_op_dispatch_s: float = Field(
        default=8.3e-6, ge=0,
        description="Host time to issue one operator in eager PyTorch while holding Python's GIL, s. Only "
        "DataParallel pays it N times over (its replicas' threads take turns). Default: 8.3 us per "
        "torch.nn.functional.linear call with autograd recording, measured with torch 2.13 on the 2-core "
        "development machine, where two threads issuing ops ran 1.94x longer than one (serialised by the GIL).",
    )
    autograd_node_traversal_s: float = Field(
        default=0.79e-6, ge=0,
        description="Host time per autograd-graph node of DDP's search for unused parameters after each forward "
        "(ddp.find_unused_parameters), s. Default fit: the forward of calibration/models/small_transformer.py:tiny "
        "(116 nodes) under DDP with and without find_unused_parameters, 68-97 us apart (torch 2.13, CPU, this "
        "repository's development machine; docs/ddp_knobs.md).",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        return _expand(data, "preset", CLUSTER_PRESETS, "cluster.preset")

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


# --------------------------------------------------------------------------------------- workload
class ParameterSpec(_Frozen):
    """One parameter tensor, as ``model.named_parameters()`` yields it."""

    name: str = Field(description="Parameter name, e.g. 'layers.0.attn.q_proj.weight'.")
    numel: int = Field(gt=0, description="Number of elements.")
    dtype: str = Field(default="float32", description="torch dtype name of the parameter (and its gradient).")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        return known_dtype(value)


def known_dtype(value: str) -> str:
    """A torch dtype name without its ``torch.`` prefix, or a ValueError naming the ones simddp knows."""
    name = value.removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {value!r}; expected one of {sorted(DTYPE_BYTES)}")
    return name


class LayerSpec(_Frozen):
    """A module of a parameter-list model: which parameters it owns, its cost, optional measured times."""

    name: str = Field(description="Module name.")
    param_indices: list[int] = Field(default_factory=list, description="Indices into `parameters` it uses.")
    fwd_flop_per_sample: float | None = Field(
        default=None, ge=0, description="Forward FLOP per sample; null = 2 x params x seq_len."
    )
    activation_numel_per_sample: int | None = Field(
        default=None,
        ge=0,
        description="Activation elements saved for backward per sample (bytes follow the precision); null = 0.",
    )
    gemm_shape: list[Annotated[int, Field(gt=0)]] | None = Field(
        default=None, min_length=3, max_length=3,
        description="The forward as one GEMM: [rows per sample, columns, depth] (a convolution as an implicit "
        "GEMM: output pixels, output channels, input channels x kernel area); its input- and weight-gradient "
        "GEMMs follow. null = the layer's FLOP at the GPU's GEMM ceiling.",
    )
    elementwise_numel_per_sample: list[int] | None = Field(
        default=None, min_length=2, max_length=2,
        description="Activation elements per sample the layer's memory-bound kernels (normalisation, activation, "
        "pooling) read and write: [forward, backward]; bytes follow the precision.",
    )
    fwd_time_s: float | None = Field(default=None, ge=0, description="Measured forward time, s (calibration).")
    bwd_time_s: float | None = Field(default=None, ge=0, description="Measured backward time, s (calibration).")


class TransformerSpec(_Frozen):
    """A decoder/encoder transformer stack (GPT, BERT, Llama shapes)."""

    num_layers: int = Field(gt=0, description="Transformer blocks.")
    hidden_size: int = Field(gt=0, description="Model width h.")
    num_heads: int = Field(gt=0, description="Attention heads a.")
    ffn_hidden_size: int = Field(gt=0, description="MLP inner width.")
    vocab_size: int = Field(gt=0, description="Vocabulary size V.")
    num_kv_heads: int | None = Field(default=None, gt=0, description="Key/value heads (GQA); null = num_heads.")
    gated_mlp: bool = Field(default=False, description="SwiGLU MLP with gate, up and down projections.")
    norm: Literal["layernorm", "rmsnorm"] = Field(default="layernorm", description="Normalisation layer.")
    bias: bool = Field(default=True, description="Linear layers carry biases.")
    tied_embeddings: bool = Field(default=True, description="Output projection shares the input embedding.")
    position_embedding: Literal["learned", "rope"] = Field(default="learned", description="Position encoding.")
    max_position_embeddings: int = Field(default=2048, gt=0, description="Learned position table length.")
    num_token_types: int = Field(default=0, ge=0, description="Token-type embeddings (BERT: 2).")
    final_norm: bool = Field(default=True, description="A norm after the last block (pre-LN models; BERT: no).")

    @model_validator(mode="after")
    def _check_heads(self) -> TransformerSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size({self.hidden_size}) is not divisible by num_heads({self.num_heads})"
            )
        kv = self.kv_heads
        if self.num_heads % kv:
            raise ValueError(f"num_heads({self.num_heads}) is not divisible by num_kv_heads({kv})")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads


class ModelConfig(_Frozen):
    """The model: exactly one of a preset, a transformer shape, or an explicit parameter list."""

    preset: str | None = Field(default=None, description="Model preset name (see `simddp presets`).")
    transformer: TransformerSpec | None = Field(default=None, description="Transformer shape.")
    parameters: list[ParameterSpec] | None = Field(
        default=None, description="Parameters in definition order, as model.parameters() yields them."
    )
    grad_ready_order: list[int] | None = Field(
        default=None, description="Parameter indices in gradient-ready order; null = reverse definition order."
    )
    layers: list[LayerSpec] | None = Field(
        default=None, description="Modules in forward order (parameter-list models); null = one per parameter."
    )
    unused_parameters: list[int] | None = Field(
        default=None,
        description="Parameter-list models: indices of parameters the forward does not use (they get no gradient); "
        "DDP needs find_unused_parameters or static_graph for them. null = every parameter is used.",
    )
    num_autograd_nodes: int | None = Field(
        default=None,
        gt=0,
        description="Nodes of one forward's autograd graph (the calibration counts them); null = one per forward "
        "kernel plus one AccumulateGrad per parameter.",
    )
    compute_efficiency: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Parameter-list models: fraction of the GPU's GEMM ceiling their layers reach (convolutions "
        "reach less than transformer GEMMs); null = the ceiling.",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            given = [k for k in ("preset", "transformer", "parameters") if data.get(k) is not None]
            shape = _preset_dump_keys(data) if len(given) == 2 and given[0] == "preset" else None
            if shape:
                # A validated preset model dumped (model_dump, JSON) holds its expanded shape too: the same model
                # (keys of its own beside the name, num_autograd_nodes say, are kept).
                data = {k: v for k, v in data.items() if k not in shape}
                given = ["preset"]
            if len(given) != 1:
                raise ValueError(
                    "give exactly one of preset, transformer or parameters"
                    + (f" (got {', '.join(given)})" if given else "")
                )
        return _expand(data, "preset", MODEL_PRESETS, "model.preset")

    @field_validator("unused_parameters")
    @classmethod
    def _none_unused(cls, value: list[int] | None) -> list[int] | None:
        """An empty list says what null says (every parameter is used), and is stored as null: a transformer's
        model is a key of the engine's caches, and a list in it could not be hashed."""
        return value or None

    @model_validator(mode="after")
    def _check_indices(self) -> ModelConfig:
        if self.parameters is None:
            if self.grad_ready_order is not None or self.layers is not None or self.unused_parameters:
                raise ValueError("grad_ready_order, layers and unused_parameters need an explicit parameters list")
            return self
        n = len(self.parameters)
        if n == 0:
            raise ValueError("parameters is empty")
        if self.unused_parameters:
            bad = sorted({i for i in self.unused_parameters if not 0 <= i < n})
            if bad:
                raise ValueError(f"unused_parameters {bad[:10]} are outside 0..{n - 1}")
            if len(set(self.unused_parameters)) == n:
                raise ValueError(f"unused_parameters lists all {n} parameters: backward would produce no gradient")
        if self.grad_ready_order is not None and sorted(self.grad_ready_order) != list(range(n)):
            raise ValueError(f"grad_ready_order must be a permutation of 0..{n - 1} ({n} parameters)")
        if self.layers is not None:
            if not self.layers:
                raise ValueError("layers is empty; omit it for one layer per parameter")
            for layer in self.layers:
                bad = [i for i in layer.param_indices if not 0 <= i < n]
                if bad:
                    raise ValueError(f"layer {layer.name!r} names parameter indices {bad} outside 0..{n - 1}")
                if (layer.fwd_time_s is None) != (layer.bwd_time_s is None):
                    raise ValueError(f"layer {layer.name!r}: give both fwd_time_s and bwd_time_s, or neither")
            seen: dict[int, str] = {}
            for layer in self.layers:  # a parameter's gradient completes in one layer, once
                for i in layer.param_indices:
                    if i in seen:
                        raise ValueError(f"parameter {i} ({self.parameters[i].name}) is listed twice: in layer "
                                         f"{seen[i]!r} and in layer {layer.name!r}")
                    seen[i] = layer.name
            owned = set(seen)
            orphans = sorted(set(range(n)) - owned)
            if orphans:
                names = ", ".join(self.parameters[i].name for i in orphans[:3])
                raise ValueError(f"parameters {orphans[:10]} ({names}{', ...' if len(orphans) > 3 else ''}) "
                                 "belong to no layer")
        return self

    @property
    def name(self) -> str:
        return self.preset or ("transformer" if self.transformer else "custom")


# -------------------------------------------------------------------------------------- execution
class Parallelism(_Frozen):
    """How the GPUs are split: data, tensor and pipeline parallel degrees and ZeRO sharding."""

    dp: int | None = Field(default=None, gt=0, description="Data-parallel degree; null = GPUs / (tp x pp).")
    tp: int = Field(default=1, gt=0, description="Tensor-parallel degree (Megatron-style, inside a node).")
    pp: int = Field(default=1, gt=0, description="Pipeline-parallel stages.")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=0, description="ZeRO stage (0 = plain DDP; 3 = FSDP).")
    sequence_parallel: bool = Field(default=False, description="Megatron sequence parallelism (needs tp > 1).")
    pipeline_schedule: Literal["1f1b", "gpipe", "interleaved-1f1b"] = Field(
        default="1f1b", description="Pipeline schedule."
    )
    virtual_stages: int = Field(default=1, gt=0, description="Model chunks per stage (interleaved-1f1b).")
    tp_comm_overlap: Literal["none", "backward", "full"] = Field(
        default="backward",
        description="Tensor-parallel communication overlap: backward (Megatron-LM's default: the input-gradient "
        "all-reduce runs beside the weight-gradient GEMM), none (every TP collective blocks), or full "
        "(Megatron-Core --tp-comm-overlap: collectives pipelined with the GEMMs in forward and backward).",
    )
    pp_p2p_overlap: bool = Field(
        default=False,
        description="Pipeline send/recv runs beside compute (Megatron-Core --overlap-p2p-communication); false "
        "(Megatron's default: batched isend/irecv, then wait): a stage's compute waits until its send is done.",
    )

    @model_validator(mode="after")
    def _check(self) -> Parallelism:
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel(true) needs tp > 1 (got tp=1)")
        if self.virtual_stages > 1 and self.pp == 1:
            raise ValueError(f"virtual_stages({self.virtual_stages}) > 1 needs pp > 1 (got pp=1)")
        if self.virtual_stages > 1 and self.pipeline_schedule != "interleaved-1f1b":
            raise ValueError(
                f"virtual_stages({self.virtual_stages}) > 1 needs pipeline_schedule 'interleaved-1f1b'"
                f" (got {self.pipeline_schedule!r})"
            )
        return self


class Training(_Frozen):
    """Precision, optimizer and batch shape of one training step."""

    precision: Precision = Field(
        default="bf16-mixed",
        description="fp32, or mixed precision with 16-bit params/grads and fp32 master weights (ZeRO paper).",
    )
    optimizer: Optimizer = Field(default="adamw", description="Optimizer (sets optimizer-state bytes and step time).")
    micro_batch_size: int = Field(default=1, gt=0, description="Samples per GPU per forward/backward.")
    global_batch_size: int | None = Field(
        default=None, gt=0, description="Samples per optimizer step; null = micro_batch_size x dp."
    )
    seq_len: int = Field(default=2048, gt=0, description="Tokens per sample (1 for non-sequence models).")
    recompute: Literal["none", "selective", "selective-op", "full"] = Field(
        default="none",
        description="Activation recompute: selective re-runs the attention core (Megatron), selective-op is "
        "torchtitan's op-level checkpointing (keeps every other matmul output and the attention output, re-runs "
        "the rest of the block), full re-runs each block from its input.",
    )
    attention: Literal["flash", "unfused"] = Field(
        default="flash",
        description="Attention kernel: flash (FlashAttention: fused, scores never stored) or unfused (Megatron's "
        "QK^T, softmax, dropout, PV: the s x s scores are written and saved for backward).",
    )
    cross_entropy: Literal["fused", "unfused"] = Field(
        default="fused",
        description="Loss kernel: fused (Megatron's vocab-parallel cross-entropy: keeps the fp32 softmax, writes "
        "the gradient in place) or unfused (F.cross_entropy(logits.float()), as torchtitan and plain PyTorch "
        "run it: keeps fp32 log-probabilities; its backward holds two more fp32 logit-sized tensors at once).",
    )
    dropout: bool | None = Field(
        default=None,
        description="Dropout on attention probabilities and residual branches (kernels and saved masks); "
        "null = on for GPT/BERT-style models, off for Llama-style (gated MLP) models.",
    )
    optimizer_impl: Literal["fused", "foreach"] | None = Field(
        default=None,
        description="How the optimizer step runs: fused (one kernel per step: apex/DeepSpeed FusedAdam, Megatron, "
        "torch's fused=True) or foreach (torch.optim's default on GPUs: one multi-tensor kernel per elementwise "
        "operation, each a pass over the states); null = foreach with ddp.implementation torch, else fused.",
    )
    optimizer_time_s: float | None = Field(
        default=None,
        ge=0,
        description="Measured optimizer step over all of a GPU's parameters, s (calibration); "
        "null = memory-bound estimate from optimizer bytes.",
    )
    grad_clip_norm: float | None = Field(
        default=None,
        gt=0,
        description="Clip gradients to this global norm before the optimizer (torch.nn.utils.clip_grad_norm_, "
        "Megatron --clip-grad): a pass over the gradients for the norm, a scalar all-reduce over every group "
        "that shards them (tp, pp, and dp under ZeRO), and a pass that scales them; null = no clipping.",
    )


#: ZeRO stages each data-parallel implementation provides (see :mod:`simddp.zero`).
SUPPORTED_ZERO_STAGES: dict[str, tuple[int, ...]] = {"torch": (0, 1, 2, 3), "deepspeed": (0, 1, 2, 3),
                                                     "megatron": (0, 1)}


def default_overlap(implementation: str, zero_stage: int) -> bool:
    """Whether gradient reduction runs beside backward by default: torch DDP and FSDP always; DeepSpeed's
    ``overlap_comm`` only for ZeRO-3 (``overlap_comm_valid`` in deepspeed/runtime/zero/config.py); Megatron's
    ``overlap_grad_reduce`` is off (megatron/core/distributed/distributed_data_parallel_config.py)."""
    if implementation == "torch":
        return True
    return implementation == "deepspeed" and zero_stage == 3


def interleaved_all_warmup(implementation: str) -> bool:
    """Whether ``implementation``'s interleaved 1F1B runs every forward first where the micro-batches equal the
    stages: Megatron-LM's does (``all_warmup_microbatches`` in megatron/core/pipeline_parallel/schedules.py);
    torch.distributed.pipelining's ``ScheduleInterleaved1F1B`` does not. The simulated schedule
    (:func:`simddp.sim.plan.build_plan`) and the memory model's micro-batches in flight read it alike."""
    return implementation == "megatron"


def default_reduce_in_fp32(implementation: str, precision: str) -> bool:
    """Megatron-LM accumulates and reduces bf16 gradients in fp32 (``--bf16`` turns on
    ``accumulate_allreduce_grads_in_fp32``, megatron/training/arguments.py); torch and DeepSpeed reduce in
    the parameters' dtype."""
    return implementation == "megatron" and precision == "bf16-mixed"


class DDPConfig(_Frozen):
    """Data-parallel implementation and its options; a null option takes the named implementation's default."""

    implementation: Implementation = Field(
        default="torch",
        description="Who runs the ZeRO stage (simddp.zero): torch (0 DDP, 1 ZeroRedundancyOptimizer on DDP, 2 FSDP "
        "SHARD_GRAD_OP, 3 FSDP FULL_SHARD), deepspeed (its ZeRO stages 1-3; 0 = its own data parallel) or "
        "megatron (0 DDP, 1 distributed optimizer). It sets which collectives run, when, and which buffers exist.",
    )
    bucket_cap_mb: float | None = Field(
        default=None, gt=0, le=MAX_BUCKET_CAP_MB,
        description="Gradient bucket size in MiB; null = the implementation's: torch DDP 25 (1 MiB first, as torch "
        "reads bucket_cap_mb); DeepSpeed reduce_bucket_size 5e8 elements; Megatron max(4e7, 1e6 x dp) elements "
        "with overlap, one bucket without. An element count is MiB x 2^20 / gradient bytes.",
    )
    gradient_as_bucket_view: bool = Field(
        default=False, description="torch DDP: gradients are views into the buckets (no bucket copies)."
    )
    overlap: bool | None = Field(
        default=None,
        description="Reduce gradient buckets while backward runs; null = the implementation's default: torch "
        "always, DeepSpeed overlap_comm (false for ZeRO-0/1/2, true for ZeRO-3), Megatron --overlap-grad-reduce "
        "(false).",
    )
    algorithm: Algorithm = Field(default="auto", description="All-reduce algorithm; auto = NCCL tuner's choice.")
    overlap_param_gather: bool = Field(
        default=False,
        description="Megatron distributed optimizer (ZeRO-1, with overlap): all-gather the updated parameters "
        "bucket by bucket while the next step's forward runs (--overlap-param-gather); false (Megatron's "
        "default): after the optimizer step.",
    )
    reduce_in_fp32: bool | None = Field(
        default=None,
        description="Accumulate and reduce 16-bit gradients in fp32 (Megatron grad_reduce_in_fp32); null = the "
        "implementation's default: on for Megatron with bf16 (Megatron-LM forces it), off otherwise.",
    )
    gradient_accumulation_fusion: bool | None = Field(
        default=None,
        description="Megatron --gradient-accumulation-fusion: weight-gradient GEMMs add straight into the main_grad "
        "buffer (apex fused_weight_gradient_mlp_cuda), so no separate accumulation pass; false (the Megatron code "
        "of Narayanan 2021 and Korthikanti 2022, or --no-gradient-accumulation-fusion): a hook adds each gradient "
        "into main_grad every micro-batch. "
        "null = on for implementation megatron; torch and DeepSpeed accumulate in autograd (no fused path).",
    )
    stage3_prefetch_numel: int | None = Field(
        default=None, ge=0,
        description="DeepSpeed ZeRO-3 stage3_prefetch_bucket_size: parameter elements gathered ahead of use; "
        "null = 5e7.",
    )
    stage3_max_reuse_distance_numel: int | None = Field(
        default=None, ge=0,
        description="DeepSpeed ZeRO-3 stage3_max_reuse_distance: a module's parameters stay gathered if fewer "
        "elements are used before their next use; null = 1e9.",
    )
    stage3_persistence_threshold_numel: int | None = Field(
        default=None, ge=0,
        description="DeepSpeed ZeRO-3 stage3_param_persistence_threshold: parameters with fewer elements are "
        "never partitioned; null = 1e5.",
    )
    separate_reduce_scatter_group: bool = Field(
        default=False,
        description="ZeRO-3 / FSDP (and torch's ZeRO-2, FSDP SHARD_GRAD_OP) at pp 1: gradient reduce-scatters on a "
        "process group of their own (FSDP2's set_separate_reduce_scatter_group, Megatron-FSDP's "
        "--create-all-gather-group), so they run beside the parameter all-gathers, sharing the link, for one more "
        "NCCL communicator's buffers; false (every implementation's default): one process group, whose one NCCL "
        "stream runs its all-gathers and reduce-scatters one at a time, in issue order (pytorch/pytorch#65299).",
    )
    find_unused_parameters: bool = Field(
        default=False,
        description="torch DDP find_unused_parameters: after every forward that syncs, DDP walks the autograd graph "
        "from the outputs (host time per node, cluster.autograd_node_traversal_s) and marks the parameters it did "
        "not reach ready at the first gradient hook; after backward it all-reduces a map of used parameters; its "
        "buckets are never rebuilt in gradient-ready order (they stay in reverse definition order).",
    )
    static_graph: bool = Field(
        default=False,
        description="torch DDP static_graph: the graph is recorded in the first iteration, so later steps skip "
        "the unused-parameter search and its all-reduce, and buckets are rebuilt in ready order; unused parameters "
        "are still handled.",
    )
    wrapper: Literal["ddp", "dataparallel"] = Field(
        default="ddp",
        description="torch's data-parallel module (implementation torch, zero_stage 0): ddp "
        "(DistributedDataParallel: one process per GPU, overlapped bucketed all-reduce) or "
        "dataparallel (torch.nn.DataParallel: one process drives every GPU of one node: inputs scattered and the "
        "model replicated from GPU 0 every forward, outputs gathered to GPU 0, gradients reduced to GPU 0 after "
        "backward, the optimizer on GPU 0, forward launches serialised by the GIL).",
    )
    backend: Literal["nccl", "gloo"] = Field(
        default="nccl",
        description="Process-group backend of the gradient all-reduce: nccl, or gloo, which stages GPU tensors "
        "through host memory and runs its ring over TCP on the CPU (cluster.gloo).",
    )


class MemoryConfig(_Frozen):
    """Per-GPU memory overheads beyond model states and activations (see :mod:`simddp.memory`)."""

    cuda_context_bytes: Bytes = Field(
        default=512 * MiB,
        ge=0,
        description="CUDA context, loaded kernels and library workspaces, bytes; ~300-400 MiB at init with lazy "
        "module loading (pytorch/pytorch#107667, #109888), more once cuBLAS/NCCL kernels load.",
    )
    nccl_bytes_per_communicator: Bytes = Field(
        default=32 * 2 * (4 * MiB + 4_915_200 + 512 * KiB),
        ge=0,
        description="NCCL buffers of one communicator, bytes: 32 channels x 2 ring peers x (Simple NCCL_BUFFSIZE "
        "4 MiB + LL128 4.7 MiB + LL 512 KiB) = 588 MiB; measured 544-688 MiB per group (NVIDIA/nccl#964).",
    )
    fragmentation_fraction: float = Field(
        default=0.10,
        ge=0,
        lt=1,
        description="Caching-allocator fragmentation: reserved-but-unusable bytes as a fraction of transient "
        "allocations (activations, buffers); GMLake (ASPLOS'24) measured 15% on average, up to 33%.",
    )
    fsdp_prefetch_layers: int = Field(
        default=1,
        ge=0,
        description="ZeRO-3/FSDP units gathered ahead of the one computing (FSDP forward/backward prefetch: 1).",
    )


class VariabilityConfig(_Frozen):
    """Step-to-step and rank-to-rank variation of compute (``simddp tails``; :mod:`simddp.variability`).

    Each rank's compute in a step is the simulated one times a lognormal jitter of mean 1 (drawn per rank and
    step), times ``straggler_slowdown`` on ``num_stragglers`` ranks (the same ranks every step), times the cost
    of the sequences it drew. The defaults describe the deterministic step of ``simddp simulate``.
    """

    jitter_cv: float = Field(
        default=0.0, ge=0, le=2,
        description="Coefficient of variation (std / mean) of a rank's compute time per step, lognormal with mean "
        "1; `simddp calibrate fit` estimates it from a rank's measured step times.",
    )
    num_stragglers: int = Field(default=0, ge=0, description="Ranks that are persistently slower (a slow GPU).")
    straggler_slowdown: float = Field(
        default=1.0, ge=1, le=100, description="How much slower a straggler computes (1.5 = takes 1.5x as long)."
    )
    seq_len_distribution: Literal["fixed", "uniform", "lognormal"] = Field(
        default="fixed",
        description="Lengths of the documents the data loader yields: fixed (every sample is training.seq_len "
        "tokens), uniform (1..seq_len), or lognormal (mean mean_seq_len, CV seq_len_cv), cut at seq_len.",
    )
    mean_seq_len: int | None = Field(
        default=None, gt=0,
        description="Mean document length of the lognormal distribution, tokens; null = seq_len / 4."
    )
    seq_len_cv: float = Field(default=1.0, gt=0, le=10, description="CV of the lognormal document lengths.")
    sequence_handling: Literal["padding", "packing"] = Field(
        default="padding",
        description="padding: each micro-batch is padded to its longest document (the step costs max length); "
        "packing: documents fill rows of seq_len tokens with a document mask (dense layers cost a full row, "
        "attention the sum of squared document lengths).",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the numpy Generator (the same seed, the same draws).")

    @property
    def active(self) -> bool:
        """Whether any source of variation is switched on."""
        return (self.jitter_cv > 0 or (self.num_stragglers > 0 and self.straggler_slowdown > 1)
                or self.seq_len_distribution != "fixed")


class RunConfig(_Frozen):
    """The whole training run (``simddp run``; :mod:`simddp.run`): tokens, price, failures and checkpoints."""

    tokens: float | None = Field(
        default=None, gt=0, le=1e18,
        description="Tokens to train on; null = pass --tokens. At most 1e18, about 10^4 times the largest published "
        "pre-training runs (Llama 3: 15.6e12 tokens).",
    )
    gpu_hour_cost_usd: float = Field(
        default=12.29, ge=0, le=1e6,
        description="Price of one GPU-hour, USD. Default: AWS p5.48xlarge (8x H100) on-demand list price $98.32/h "
        "/ 8 (The Next Platform, 2023-07-27); reserved and smaller clouds charge a fraction of it.",
    )
    mtbf_hours: float = Field(
        default=50_700, gt=0, le=1e12,
        description="Mean time between failures that interrupt the job, per GPU (or per node, mtbf_scope), hours "
        "(at most 1e12: beyond it no failure happens in any run simddp answers for). "
        "Default: Llama 3 405B pre-training, 419 unexpected interruptions in 54 days on 16,384 H100s "
        "(Grattafiori et al. 2024, sec. 3.3.4): 54 x 24 x 16,384 / 419 GPU-hours.",
    )
    mtbf_scope: Literal["gpu", "node"] = Field(default="gpu", description="Whether mtbf_hours is per GPU or per node.")
    checkpoint_saving: Literal["rank0", "sharded"] = Field(
        default="rank0",
        description="rank0: one process gathers and writes the whole training state (torch's DDP tutorial); "
        "sharded: every rank writes its own part at once (torch.distributed.checkpoint, Megatron distributed).",
    )
    storage_write_bytes_per_s: BytesPerS = Field(
        default=273e9, gt=0,
        description="Aggregate write bandwidth of the checkpoint storage, bytes/s. Default: Megatron-LM's 1T "
        "checkpoint saves on Selene, 273 GB/s (Narayanan et al., SC'21, sec. 5.10).",
    )
    node_write_bytes_per_s: BytesPerS = Field(
        default=50e9, gt=0,
        description="Write bandwidth of one node to storage, bytes/s (one writer reaches at most this). Default: "
        "the DGX A100's two 200 Gb/s storage NICs.",
    )
    storage_read_bytes_per_s: BytesPerS = Field(
        default=1e12, gt=0,
        description="Aggregate read bandwidth when a restarted job loads the checkpoint, bytes/s. Default: the 1 TB/s "
        "peak read of Megatron-LM's initial load on Selene (Narayanan et al., SC'21, sec. 5.10).",
    )
    restart_overhead_s: float = Field(
        default=600.0, ge=0, le=1e9,
        description="From a failure to the restarted job computing again, besides loading the checkpoint: noticing "
        "it (a hung collective waits out torch's 10-minute NCCL timeout; a crash is seen at once), rescheduling, "
        "process groups and NCCL set-up, s. Default 600 s: the NCCL timeout, an assumption to replace by your own.",
    )
    checkpoint_interval_s: float | None = Field(
        default=None, gt=0,
        description="Training time between checkpoints, s; null = the interval that maximises goodput (Daly 2006).",
    )
    achieved_tflops_per_gpu: float | None = Field(
        default=None, gt=0,
        description="Feed a measured throughput instead of simulating the step: model FLOP/s per GPU counting "
        "recomputation (Narayanan et al., eq. 3), in TFLOP/s; null = the simulated step.",
    )


class Scenario(_Frozen):
    """One question: this model, on this cluster, with this layout and these options."""

    name: str = Field(
        default="",
        description="A label for reports; empty or null = derived from model, layout and cluster "
        "(e.g. 'llama2-7b-zero1-128xH100').",
    )
    cluster: Cluster = Field(description="Hardware.")
    model: ModelConfig = Field(description="The model to train.")
    parallelism: Parallelism = Field(default_factory=Parallelism, description="Parallel layout.")
    training: Training = Field(default_factory=Training, description="Training step shape.")
    ddp: DDPConfig = Field(default_factory=DDPConfig, description="DDP options.")
    memory: MemoryConfig = Field(default_factory=MemoryConfig, description="Memory-model overheads.")
    variability: VariabilityConfig = Field(
        default_factory=VariabilityConfig, description="Jitter, stragglers and sequence lengths (simddp tails)."
    )
    run: RunConfig = Field(default_factory=RunConfig, description="The whole training run (simddp run).")
    calibration: str | None = Field(default=None, description="Path to a calibration profile (JSON).")
    _name_derived: bool = PrivateAttr(default=False)

    @field_validator("name", mode="before")
    @classmethod
    def _null_name(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_serializer("name")
    def _dump_name(self, name: str) -> str | None:
        # A derived name is dumped as null, so that a variant built from the dump derives its own.
        return None if self._name_derived else name

    @model_validator(mode="after")
    def _derive_name(self) -> Scenario:
        if not self.name:
            object.__setattr__(self, "name", derived_name(self))  # frozen: set once, while validating
            self._name_derived = True
        return self

    @model_validator(mode="after")
    def _check_layout(self) -> Scenario:
        from simddp.limits import too_many_gpus

        par, gpus = self.parallelism, self.cluster.num_gpus
        nodes, per_node = self.cluster.num_nodes, self.cluster.gpus_per_node
        problem = too_many_gpus(nodes, per_node)
        if problem:  # first: the layout errors below would blame the batch or tp for it
            raise ValueError(problem)
        dp = self.dp
        if par.dp is not None and par.dp * par.tp * par.pp != gpus:
            raise ValueError(
                f"dp({par.dp}) * tp({par.tp}) * pp({par.pp}) = {par.dp * par.tp * par.pp} "
                f"does not match {gpus} GPUs ({nodes} nodes x {per_node}); leave parallelism.dp out "
                "(or null) to derive it"
            )
        if par.dp is None and gpus % (par.tp * par.pp):
            raise ValueError(
                f"tp({par.tp}) * pp({par.pp}) = {par.tp * par.pp} does not divide {gpus} GPUs "
                f"({nodes} nodes x {per_node})"
            )
        if par.tp > per_node or per_node % par.tp:
            raise ValueError(f"tp({par.tp}) must divide gpus_per_node({per_node}) to stay inside a node")
        tf = self.model.transformer
        if tf is not None:
            if tf.num_heads % par.tp:
                raise ValueError(f"tp({par.tp}) does not divide num_heads({tf.num_heads})")
            if tf.kv_heads % par.tp and par.tp % tf.kv_heads:
                raise ValueError(f"tp({par.tp}) and num_kv_heads({tf.kv_heads}) do not divide one another")
        num_layers = tf.num_layers if tf is not None else len(self.model.layers or self.model.parameters or [])
        if par.pp * par.virtual_stages > num_layers:
            raise ValueError(
                f"pp({par.pp}) * virtual_stages({par.virtual_stages}) exceeds the model's {num_layers} layers"
            )
        tr = self.training
        per_step = tr.micro_batch_size * dp
        micro = self.global_batch_size // per_step if self.global_batch_size % per_step == 0 else 0
        if par.pipeline_schedule == "interleaved-1f1b" and par.pp > 1 and micro % par.pp:
            raise ValueError(
                f"interleaved-1f1b needs the micro-batches per step ({micro} = global_batch_size"
                f"({self.global_batch_size}) / (micro_batch_size({tr.micro_batch_size}) * dp({dp}))) "
                f"to be a multiple of pp({par.pp})"
            )
        if tr.global_batch_size is not None and tr.global_batch_size % per_step:
            raise ValueError(
                f"global_batch_size({tr.global_batch_size}) is not a multiple of "
                f"micro_batch_size({tr.micro_batch_size}) * dp({dp}) = {per_step}"
            )
        return self

    @model_validator(mode="after")
    def _check_implementation(self) -> Scenario:
        ddp, par = self.ddp, self.parallelism
        impl, zero = ddp.implementation, par.zero_stage
        if zero not in SUPPORTED_ZERO_STAGES[impl]:
            raise ValueError(
                f"ddp.implementation 'megatron' provides zero_stage 0 (DDP) and 1 (distributed optimizer), not "
                f"zero_stage({zero}); Megatron-FSDP is not modelled: use implementation 'torch' (FSDP) or 'deepspeed'"
            )
        if impl == "deepspeed" and zero >= 2 and par.pp > 1:
            raise ValueError(
                f"ddp.implementation 'deepspeed' with zero_stage({zero}) and pp({par.pp}): DeepSpeed's pipeline "
                "engine refuses ZeRO-2 and ZeRO-3 (use zero_stage 0 or 1, or implementation 'torch')"
            )
        if ddp.gradient_accumulation_fusion and impl != "megatron":
            raise ValueError(
                f"ddp.gradient_accumulation_fusion(true) is Megatron's fused weight-gradient accumulation: it needs "
                f"implementation 'megatron' (got {impl!r}, whose gradients accumulate in autograd)"
            )
        if ddp.overlap_param_gather:
            overlap = ddp.overlap if ddp.overlap is not None else default_overlap(impl, zero)
            if impl != "megatron" or zero != 1 or not overlap:
                raise ValueError(
                    f"ddp.overlap_param_gather(true) is Megatron's --overlap-param-gather: it needs implementation "
                    f"'megatron', zero_stage 1 and overlap true (got implementation {impl!r}, zero_stage({zero}), "
                    f"overlap({overlap}))"
                )
        if ddp.separate_reduce_scatter_group and not (par.pp == 1 and (zero == 3 or (zero == 2 and impl == "torch"))):
            raise ValueError(
                f"ddp.separate_reduce_scatter_group(true) gives the reduce-scatters of units gathered around their "
                f"compute a process group of their own: it needs zero_stage 3, or 2 with implementation 'torch', and "
                f"pp 1 (got implementation {impl!r}, zero_stage({zero}), pp({par.pp}))"
            )
        return self

    @model_validator(mode="after")
    def _check_ddp_options(self) -> Scenario:
        ddp, par, cluster = self.ddp, self.parallelism, self.cluster
        if ddp.wrapper == "dataparallel":
            if cluster.num_nodes != 1:
                raise ValueError(f"ddp.wrapper dataparallel drives the GPUs of one node from one process "
                                 f"(got cluster.num_nodes({cluster.num_nodes}))")
            if par.tp != 1 or par.pp != 1 or par.zero_stage != 0:
                raise ValueError(f"ddp.wrapper dataparallel replicates the whole model: it needs tp(1), "
                                 f"pp(1) and zero_stage(0) (got tp({par.tp}), pp({par.pp}), "
                                 f"zero_stage({par.zero_stage}))")
        if (ddp.wrapper == "dataparallel" or ddp.backend == "gloo") and ddp.implementation != "torch":
            knob = "ddp.wrapper dataparallel" if ddp.wrapper == "dataparallel" else "ddp.backend gloo"
            raise ValueError(f"{knob} is torch's: it needs ddp.implementation 'torch' "
                             f"(got {ddp.implementation!r})")
        if ddp.backend == "gloo" and (par.tp != 1 or par.pp != 1 or par.zero_stage != 0):
            raise ValueError(f"ddp.backend gloo is modelled for DDP's all-reduce only: it needs tp(1), pp(1) and "
                             f"zero_stage(0) (got tp({par.tp}), pp({par.pp}), zero_stage({par.zero_stage}))")
        unused = self.model.unused_parameters
        if unused and not (ddp.find_unused_parameters or ddp.static_graph) and par.zero_stage <= 1 \
                and ddp.wrapper == "ddp" and ddp.implementation == "torch":  # ZeRO-1: ZeroRedundancyOptimizer on DDP
            raise ValueError(f"model.unused_parameters lists {len(set(unused))} parameter(s) that get no gradient: "
                             "torch DDP stops with 'Expected to have finished reduction in the prior iteration' "
                             "unless ddp.find_unused_parameters or ddp.static_graph is true")
        var = self.variability
        if var.num_stragglers > cluster.num_gpus:
            raise ValueError(f"variability.num_stragglers({var.num_stragglers}) exceeds the "
                             f"{cluster.num_gpus} GPUs")
        if var.mean_seq_len is not None and var.mean_seq_len > self.training.seq_len:
            raise ValueError(f"variability.mean_seq_len({var.mean_seq_len}) exceeds "
                             f"training.seq_len({self.training.seq_len})")
        return self

    @property
    def dp(self) -> int:
        return data_parallel_size(self.cluster, self.parallelism)

    @property
    def global_batch_size(self) -> int:
        tr = self.training
        return tr.global_batch_size or tr.micro_batch_size * self.dp

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per GPU per optimizer step (gradient accumulation steps)."""
        return self.global_batch_size // (self.training.micro_batch_size * self.dp)


def data_parallel_size(cluster: Cluster, par: Parallelism) -> int:
    """dp: as given, else the GPUs over tp x pp (``Scenario.dp``; sweeps ask it of sections alone)."""
    return par.dp if par.dp is not None else cluster.num_gpus // (par.tp * par.pp)


def derived_name(scenario: Scenario) -> str:
    """'llama2-7b-zero1-128xH100', 'gpt3-175b-tp8-sp-pp8v2-zero1-1024xA100': model, layout, GPUs."""
    par, model = scenario.parallelism, scenario.model
    tf = model.transformer
    if model.preset:
        parts = [model.preset]
    elif tf is not None:
        parts = [f"transformer-{tf.num_layers}L-{tf.hidden_size}h"]
    else:
        parts = [f"custom-{len(model.parameters or [])}params"]
    if par.tp > 1:
        parts.append(f"tp{par.tp}" + ("-sp" if par.sequence_parallel else ""))
    if par.pp > 1:
        parts.append(f"pp{par.pp}" + (f"v{par.virtual_stages}" if par.virtual_stages > 1 else ""))
    parts.append(f"zero{par.zero_stage}" if par.zero_stage else "ddp")
    parts.append(f"{scenario.cluster.num_gpus}x{scenario.cluster.gpu.name.split('-')[0]}")
    return "-".join(parts)


# ----------------------------------------------------------------------------------- loading
def _preset_dump_keys(data: dict[str, Any]) -> set[str] | None:
    """The keys a preset model fills in, where a model dict naming a preset beside its shape holds exactly the
    preset's values for them (a validated preset model's dump); None otherwise (a shape of its own is refused
    beside a name, as ever)."""
    name = data.get("preset")
    if not isinstance(name, str) or name not in MODEL_PRESETS:
        return None
    keys = set(MODEL_PRESETS[name].build())
    try:
        mine = ModelConfig.model_validate({k: v for k, v in data.items() if k in keys})
        own = ModelConfig.model_validate({"preset": name})
    except ValidationError:
        return None
    return keys if mine.model_dump(include=keys) == own.model_dump(include=keys) else None


def _expand(data: Any, key: str, presets: dict[str, Any], field: str) -> Any:
    """Fill a dict from the named preset, the user's own keys overriding the preset's (deep merge)."""
    if not isinstance(data, dict) or data.get(key) is None:
        return data
    name = data[key]
    if not isinstance(name, str):
        raise ValueError(f"{key} must be a preset name, not a {type(name).__name__}; "
                         f"valid: {', '.join(sorted(presets))}")
    if name not in presets:
        guess = closest_key(str(name), list(presets))
        hint = f" (did you mean {guess!r}?)" if guess else ""
        raise ValueError(f"unknown preset {safeio.short_repr(name)}{hint}; valid: {', '.join(sorted(presets))}")
    return deep_merge(presets[name].build(), data)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``override`` merged in; nested dicts merge key by key."""
    out = dict(base)
    for k, v in override.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def set_value(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of ``data`` with ``value`` at the dotted path (missing dicts on the way are created)."""
    out = copy.deepcopy(data)
    put_value(out, dotted, value)
    return out


def _whole_list(where: str, verb: str = "set") -> str:
    return f"{where} is a list, {verb} whole ({where}=[...]); its items cannot be {verb} one by one"


def _holds_list(keys: list[str]) -> bool:
    """Whether the scenario key at ``keys`` is a list (model.parameters, model.layers), by the schema."""
    parent = model_at(Scenario, tuple(keys[:-1]))
    field = parent.model_fields.get(keys[-1]) if parent is not None else None
    return field is not None and _list_item_type(field.annotation) is not None


def list_item_problem(dotted: str, verb: str = "set", last: bool = True) -> str | None:
    """What is wrong with a dotted path that has a number for a key (``model.parameters.0.numel``), or None: a list
    (model.parameters, model.layers) is set whole, its items have no dotted paths; elsewhere a number is no
    scenario key. ``last``: whether a number as the path's last key counts too."""
    keys = dotted.split(".")
    at = next((i for i, k in enumerate(keys if last else keys[:-1]) if k.isdigit()), None)
    if at is None:
        return None
    where = ".".join(keys[:at])
    if not at:
        return f"{keys[0]} is not a scenario key (scenario keys are names; `simddp schema` lists them)"
    if not _holds_list(keys[:at]):  # a probe: "model.transformer is a list" said of a mapping
        return f"{keys[at]} is not a key of {where} (scenario keys are names; `simddp schema` lists them)"
    return _whole_list(where, verb)


def put_value(data: dict[str, Any], dotted: str, value: Any) -> None:
    """:func:`set_value` in place: ``data`` itself gets ``value`` at the dotted path."""
    keys = dotted.split(".")
    if not all(keys):
        raise ScenarioError(f"{safeio.short_repr(dotted)}: empty key in path")
    if len(keys) > safeio.MAX_DEPTH:
        raise ScenarioError(f"{safeio.short_repr(dotted)}: more than {safeio.MAX_DEPTH} keys in the path")
    problem = list_item_problem(dotted, last=False)
    if problem:
        raise ScenarioError(f"{safeio.short_repr(dotted)}: {problem}")
    node = data
    for i, k in enumerate(keys[:-1]):
        if isinstance(node.get(k), list):
            raise ScenarioError(f"{safeio.short_repr(dotted)}: {_whole_list('.'.join(keys[: i + 1]))}")
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[keys[-1]] = value


def set_path(data: dict[str, Any], dotted: str, raw_value: str) -> dict[str, Any]:
    """Apply a ``--set a.b.c=value`` override; the value is parsed as YAML (numbers, booleans, null)."""
    try:
        value = safeio.parse_yaml(raw_value, f"--set {safeio.short_repr(dotted)}")
    except safeio.MalformedInput:
        value = raw_value
    if "#" in raw_value and (value is None or isinstance(value, str)):
        # YAML reads ' #' on as a comment: `--set "name=run #1"` named the run 'run', and "#1 run" set null (a
        # probe). On a command line the text is what was meant.
        value = raw_value.strip()
    try:
        return set_value(data, dotted, value)
    except ScenarioError as err:
        raise ScenarioError(f"--set {err}") from None


def format_validation_error(err: ValidationError) -> str:
    """One line naming the field, the value and the problem, for each error.

    An unknown key names the closest valid key and lists the keys valid at its level.
    """
    root = _CONFIG_MODELS.get(err.title)
    parts = []
    for e in err.errors():
        path = [p for p in e["loc"] if not str(p).startswith("function-")]
        loc = ".".join(str(p) for p in path)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = unknown_key_message(root, path) if root is not None else "unknown key"
        elif e["type"] == "missing":
            msg = "missing required key"
        elif "input" in e and not isinstance(e["input"], dict | list):
            msg = f"{msg} (got {safeio.short_repr(e['input'])})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return safeio.one_line(safeio.join_capped(parts))


def _models_under(model: type[BaseModel], found: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    if model.__name__ not in found:
        found[model.__name__] = model
        for field in model.model_fields.values():
            for sub in submodels(field.annotation):
                _models_under(sub, found)
    return found


#: Every config model by class name (a ValidationError's ``title``), for the unknown-key suggestions.
_CONFIG_MODELS = _models_under(Scenario, {})


def validate_scenario(data: dict[str, Any], validated: Mapping[str, BaseModel] | None = None) -> Scenario:
    """Validate a complete scenario dict; raises :class:`ScenarioError` with a one-line message.

    ``calibration`` is kept as a path only: filling keys from the profile it names is the job of
    :func:`simddp.scenario_io.scenario_from_dict`, a layer above (config never imports the profile).
    ``validated``: sections of ``data`` already validated from dicts equal to its own (a sweep's base), taken
    as they are; the checks across sections still run.
    """
    if not isinstance(data, dict):
        raise ScenarioError(f"a scenario must be a mapping, got {type(data).__name__}")
    safeio.check_shape(data)
    try:
        scenario = Scenario.model_validate({**data, **validated} if validated else data)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(err)) from None
    except RecursionError:  # check_shape bounds the nesting; a preset or profile cannot add much
        raise safeio.too_deep("scenario") from None
    from simddp.limits import check_scenario_size

    check_scenario_size(scenario)
    return scenario


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON file into a dict, with one-line errors for missing, malformed, special or
    oversized files (the caps of :mod:`simddp.safeio`)."""
    return safeio.read_mapping(path)
