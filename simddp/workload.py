"""Per-layer workload: parameters, the kernels of forward / input-grad / weight-grad, and TP collectives.

A transformer block becomes the kernels Megatron-LM runs for it on one tensor-parallel rank (Shoeybi et al.
2019; Narayanan et al., SC'21; Korthikanti et al. 2022): the GEMMs, each with its (M, N, K) from
micro-batch b, sequence s, hidden h, heads a, tp t and sequence parallelism; the attention core (one fused
FlashAttention kernel, or the unfused QK^T / scale-mask-softmax / dropout / PV of Megatron's
``CoreAttention``); and the memory-bound kernels (norms, activation, dropout, residual add, rotary
embedding), each with the bytes it reads and writes. A GEMM of an (m x k) input with a (k x n) weight is
2mkn FLOP forward; its input gradient (dgrad) is the (m x n) @ (n x k) GEMM and its weight gradient
(wgrad) the (k x m) @ (m x n) GEMM, 2mkn each. This module only describes work; :mod:`simddp.compute`
turns kernels into time for a GPU.

Tensor parallelism (column-parallel QKV and MLP input, row-parallel attention output and MLP output,
vocab-parallel embedding and output layer) divides the sharded GEMM dimensions by t and adds the
collectives of Megatron's "f" and "g" operators: the row-parallel output is all-reduced in forward and the
column-parallel input gradient in backward; with sequence parallelism these become reduce-scatter and
all-gather of the same bytes, the norms and dropouts work on s/t of the tokens, and backward all-gathers
the layer input again for the weight gradient (Korthikanti et al. 2022, sec. 4.2.2).

Model FLOP (for MFU) follow Narayanan et al. eq. 3's accounting (attention scores over the full s x s,
no recompute); kernels do the work they really do (a causal FlashAttention skips the masked half).

Parameter names and their order follow the Hugging Face implementations (GPT-2, BERT, Llama), so DDP
buckets match what torch would build; layers are named after the module that owns their parameters
(``model.layers.0.self_attn.qkv_proj`` owns ``model.layers.0.self_attn.{q,k,v}_proj.weight``), the one
naming scheme of traces, bucket tables and the dashboard.

Models given as a parameter list use their layer FLOP when given, else the dense estimate of
2 x params x tokens per pass (Kaplan et al. 2020), split equally into forward, dgrad and wgrad.
"""

from __future__ import annotations

import functools
import itertools
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter, lt
from typing import Any, Literal, NamedTuple, TypeVar, overload

from simddp.config import Scenario, TransformerSpec
from simddp.engine_caches import KeyedCache
from simddp.units import dtype_bytes

_D = TypeVar("_D")

#: Parameter dtype of transformer presets for each training precision (mixed precision keeps 16-bit
#: working weights and gradients beside fp32 master weights, as in the ZeRO paper's accounting).
PRECISION_PARAM_DTYPE = {"fp32": "float32", "bf16-mixed": "bfloat16", "fp16-mixed": "float16"}
PRECISION_ACT_BYTES = {"fp32": 4, "bf16-mixed": 2, "fp16-mixed": 2}

KernelOp = Literal["gemm", "flash-fwd", "flash-bwd", "memory", "dense"]
Recompute = Literal["none", "core", "block"]

#: Query rows of one FlashAttention thread block (FlashAttention-2, Dao 2023: 128 x 64 or 128 x 128 tiles).
FLASH_BLOCK_ROWS = 128
#: FlashAttention-2 backward does five matmuls against the forward's two: 2.5x the forward FLOP (Dao 2023).
FLASH_BWD_FLOP_RATIO = 2.5
_MASK_BYTES = 1  # a dropout mask is one byte per element (torch's native_dropout: bool)
_FP32 = 4


class Param(NamedTuple):
    """A parameter as the engine sees it: name, elements, torch dtype name (a light ``ParameterSpec``; a tuple,
    built 1,500 times per evaluation of a 1T model)."""

    name: str
    numel: int
    dtype: str = "float32"


class ParamSize(NamedTuple):
    """A parameter as data-parallel reduction, the optimizer and the memory model size it: elements and torch
    dtype name, without its name (:meth:`Workload.param_sizes`; the workload's ``parameters`` have the names).
    Equal to the tuple ``(numel, dtype)``."""

    numel: int
    dtype: str


_P = TypeVar("_P", Param, ParamSize)


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel: a GEMM (shape), a fused attention kernel (FLOP, parallel tiles) or a memory-bound op.

    ``bytes`` is what the kernel reads and writes in device memory (for a GEMM, its operands once). A fused
    attention kernel runs ``tiles`` query blocks, each over ``k`` keys on average.
    ``dense`` is a kernel of a parameter-list model whose shape is unknown: FLOP and bytes only.
    """

    name: str
    op: KernelOp
    flop: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    tiles: int = 0


@dataclass(frozen=True)
class Collective:
    """A tensor-parallel collective (nccl-tests size: the whole buffer), and where it sits in the layer.

    ``where``: ``fwd-pre`` blocks the forward until the input is gathered (SP all-gather); ``fwd-post``
    follows the forward (row-parallel all-reduce / reduce-scatter); ``bwd-pre`` gathers the output gradient
    before the input-grad (SP); ``dgrad-post`` reduces the input gradient (column-parallel "f"), which
    Megatron overlaps with the weight-grad GEMM; ``wgrad-pre`` re-gathers the layer input for the weight
    gradient (SP), overlapped with the input-grad GEMM.
    """

    op: Literal["all-reduce", "all-gather", "reduce-scatter"]
    size_bytes: int
    where: Literal["fwd-pre", "fwd-post", "bwd-pre", "dgrad-post", "wgrad-pre"]


@dataclass(frozen=True)
class Layer:
    """One module's work for a micro-batch on one GPU.

    ``param_indices`` are the parameters whose gradient is complete once this layer's backward ends
    (a tied weight belongs to the layer that runs last in backward).
    """

    name: str
    param_indices: tuple[int, ...]
    fwd: tuple[Kernel, ...] = ()
    dgrad: tuple[Kernel, ...] = ()
    wgrad: tuple[Kernel, ...] = ()
    collectives: tuple[Collective, ...] = ()
    activation_bytes: int = 0  # saved for backward (parameter-list models; transformers use simddp.memory)
    block: int | None = None  # transformer block index (None: embedding, output layer, loss, other models)
    recompute: Recompute = "none"  # recomputed under recompute "full" (block) or "selective" too (core)
    sac_recompute: float = 1.0  # share of a block layer's forward re-run under "selective-op" (op-level SAC)
    stage: int = 0  # virtual pipeline stage (rank = stage % pp)
    model_flop: float = 0.0  # forward FLOP in Megatron's accounting (MFU); backward counts 2x
    fwd_time_s: float | None = None  # measured (calibration) overrides the kernels
    bwd_time_s: float | None = None

    @property
    def fwd_flop(self) -> float:
        return sum(k.flop for k in self.fwd)

    @property
    def dgrad_flop(self) -> float:
        return sum(k.flop for k in self.dgrad)

    @property
    def wgrad_flop(self) -> float:
        return sum(k.flop for k in self.wgrad)

    @property
    def is_block(self) -> bool:
        return self.block is not None


class BlockParams(Sequence[Param]):
    """A transformer's parameters in definition order: ``head`` (before the blocks), ``count`` blocks, then
    ``tail``; block ``i``'s are block 0's (``first``: name after the block prefix, elements, dtype) renamed
    ``block_name.format(i=i)`` + that name, made when one of them is first read. A step reads none: what it
    reads of the parameters is their sizes (:meth:`sizes`, every block's block 0's; the names are the exports'),
    where GPT-3 tp8 pp8 v3 made 36 of its 96 blocks' named parameters per evaluation. Read as a tuple of those
    parameters (indexing, slices, iteration, equality, hashing, pickling); iteration makes every block, and
    :func:`indexable` gives whole-model walks a plain list."""

    __slots__ = ("_block_name", "_count", "_first", "_flat", "_per", "_start", "_unmade")

    def __init__(self, head: Sequence[Param], first: Sequence[tuple[str, int, str]], block_name: str, count: int,
                 first_params: Sequence[Param], tail: Sequence[Param]) -> None:
        self._first, self._block_name, self._count = list(first), block_name, count
        self._start, self._per = len(head), len(self._first)
        # Every parameter's place: block 0's made (first_params), the other blocks' None until made.
        self._flat: list[Param | None] = [*head, *first_params, *[None] * (self._per * (count - 1)), *tail]
        self._unmade = set(range(1, count))

    def _fill(self, blocks: Iterable[int]) -> None:
        """Make ``blocks`` (those not made yet)."""
        make, flat, start, per = tuple.__new__, self._flat, self._start, self._per
        for i in self._unmade.intersection(blocks):
            renamed = self._block_name.format(i=i)
            flat[start + i * per:start + (i + 1) * per] = [make(Param, (renamed + rest, numel, dtype))
                                                         for rest, numel, dtype in self._first]
            self._unmade.discard(i)

    def whole_blocks(self, ids: Sequence[int]) -> tuple[int, int, slice] | None:
        """Where ``ids`` (a list of distinct ids, ascending) hold blocks whole: the span ``[a, b)`` of ``ids`` that
        are blocks' ids, and block 0's ids as a slice (each block's parameters are block 0's shifted); None where
        ``ids`` do not ascend or hold a block in part."""
        lo, per = self._start, self._per
        if not per or not isinstance(ids, list) or ids != sorted(ids):  # sorted: in C
            return None
        a, b = bisect_left(ids, lo), bisect_left(ids, lo + per * self._count)
        # Each run of ``per`` ids from a block's first id that ends at that block's last id is the block (the ids
        # are distinct and ascend).
        if (b - a) % per or not all((ids[k] - lo) % per == 0 and ids[k + per - 1] == ids[k] + per - 1
                                    for k in range(a, b, per)):
            return None
        return a, b, slice(lo, lo + per)

    def sizes(self) -> list[ParamSize]:
        """Each parameter's :class:`ParamSize`, in order: every block's are block 0's objects (no block made)."""
        flat, start, per = self._flat, self._start, self._per
        made = [*flat[:start + per], *flat[start + self._count * per:]]  # the head, block 0 and the tail
        size = [ParamSize(p.numel, p.dtype) for p in made]  # type: ignore[union-attr]  # those are made
        return size[:start] + size[start:start + per] * self._count + size[start + per:]

    def _all(self) -> list[Param]:
        if self._unmade:
            self._fill(list(self._unmade))
        return self._flat  # type: ignore[return-value]  # every place filled

    def __len__(self) -> int:
        return len(self._flat)

    @overload
    def __getitem__(self, i: int) -> Param: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Param, ...]: ...

    def __getitem__(self, i: int | slice) -> Param | tuple[Param, ...]:
        if isinstance(i, slice):
            return tuple(self._all()[i])
        got = self._flat[i]
        if got is None:
            self._fill(((i % len(self._flat) - self._start) // self._per,))
            got = self._flat[i]
        return got  # type: ignore[return-value]

    def __iter__(self) -> Iterator[Param]:
        if not self._unmade:
            return iter(self._flat)  # type: ignore[arg-type]  # every place filled
        return self._blockwise()

    def _blockwise(self) -> Iterator[Param]:
        """The parameters in order, each block made as the iteration reaches it (a search that stops early, for
        the word embedding, makes none)."""
        flat, start, per = self._flat, self._start, self._per
        yield from flat[:start]  # type: ignore[misc]
        for i in range(self._count):
            if i in self._unmade:
                self._fill((i,))
            yield from flat[start + i * per:start + (i + 1) * per]  # type: ignore[misc]
        yield from flat[start + self._count * per:]  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        """Equal to a tuple (or BlockParams) of the same parameters, as the tuple of its parameters would be (as
        :meth:`BlockLayers.__eq__`)."""
        if isinstance(other, BlockParams):
            other = tuple(other._all())
        if not isinstance(other, tuple):
            return NotImplemented
        return tuple(self._all()) == other

    def __hash__(self) -> int:
        return hash(tuple(self._all()))

    def __repr__(self) -> str:
        return repr(tuple(self._all()))

    def __reduce__(self) -> tuple[Any, ...]:
        return tuple, (tuple(self._all()),)


class BlockReady(Sequence[int]):
    """A transformer's gradient-ready order, read as a tuple of parameter indices: ``head`` (the layers after
    the blocks, last first), then the ``count`` blocks from the last to the first, block ``i``'s being block 0's
    order ``block`` shifted by ``i`` blocks of ``len(block)`` parameters, then ``rest`` (the embedding's). It is
    made whole only when read whole (iteration, indexing, equality, hashing, pickling); :meth:`sorted_ids` sorts
    a pipeline rank's parameters by it from its blocks (1T tp8 pp64: 3 ranks' 24-26 of 1,540 parameters)."""

    __slots__ = ("_block", "_count", "_head", "_rest", "_start", "_tuple")

    def __init__(self, head: Sequence[int], block: Sequence[int], count: int, rest: Sequence[int]) -> None:
        self._head, self._block, self._count, self._rest = list(head), list(block), count, list(rest)
        self._start = min(self._block, default=0)  # block 0's first parameter (its parameters are consecutive)
        self._tuple: tuple[int, ...] | None = None

    def is_permutation(self, n: int) -> bool:
        """Whether the order holds each of ``0 .. n - 1`` once: block 0's parameters consecutive, and the head's
        and the rest's distinct and outside the blocks'."""
        lo, per = self._start, len(self._block)
        hi = lo + per * self._count
        outside = self._head + self._rest
        return (sorted(self._block) == list(range(lo, lo + per)) and len(set(outside)) == len(outside)
                and len(outside) + hi - lo == n and all(0 <= g < n and not lo <= g < hi for g in outside))

    def sorted_ids(self, ids: Iterable[int]) -> list[int]:
        """``ids`` (parameter indices, each once) in this order: their head part, their blocks from the last,
        each in block 0's order shifted, then their rest part; without making the whole order."""
        ids = sorted(ids)
        return list(map(ids.__getitem__, self.positions(ids)))

    def positions(self, ids: Sequence[int]) -> list[int]:
        """The positions in ``ids`` (ascending, each once) of :meth:`sorted_ids`'s entries: a pipeline rank's
        parameters in this order as indices into its own, a whole block's read as block 0's order shifted (to
        its place among ``ids``) rather than looked up id by id."""
        lo, per = self._start, len(self._block)
        a, b = bisect_left(ids, lo), bisect_left(ids, lo + per * self._count)
        where = {g: k for k, g in enumerate(ids[:a])}  # the ids outside the blocks (a few) and their places
        where.update(zip(ids[b:], range(b, len(ids)), strict=True))
        out = [where[g] for g in self._head if g in where]
        runs: list[tuple[int, int, bool]] = []  # (block, where its first id is in ids, whole)
        k = a
        while k < b:
            i = (ids[k] - lo) // per
            first = lo + i * per
            whole = ids[k] == first and k + per <= b and ids[k + per - 1] == first + per - 1
            runs.append((i, k, whole))
            k = k + per if whole else bisect_left(ids, first + per, k, b)
        for i, k, whole in reversed(runs):
            if whole:  # block i's entry g + i per sits at k + (g - lo) for each g of block 0's order
                out += map((k - lo).__add__, self._block)
            else:
                end = bisect_left(ids, lo + (i + 1) * per, k, b)
                place = dict(zip(ids[k:end], range(k, end), strict=True))
                out += [place[g] for g in map((i * per).__add__, self._block) if g in place]
        out += [where[g] for g in self._rest if g in where]
        return out

    def _all(self) -> tuple[int, ...]:
        if self._tuple is None:
            per, top = len(self._block), self._count - 1
            # Block i's entries, last block first: one range per entry of block 0's (its g + i per, i falling),
            # interleaved by zip, in C rather than one comprehension per block.
            columns = [range(g + top * per, g - 1, -per) for g in self._block]
            self._tuple = (*self._head, *itertools.chain.from_iterable(zip(*columns, strict=True)), *self._rest)
        return self._tuple

    def __len__(self) -> int:
        return len(self._head) + len(self._block) * self._count + len(self._rest)

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...

    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        return self._all()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        """Equal to a tuple (or BlockReady) of the same indices, as the tuple of its indices would be."""
        if isinstance(other, BlockReady):
            other = other._all()
        if not isinstance(other, tuple):
            return NotImplemented
        return self._all() == other

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())

    def __reduce__(self) -> tuple[Any, ...]:
        return tuple, (self._all(),)


def indexable(parameters: Sequence[Param]) -> Sequence[Param]:
    """``parameters`` for many reads by index, each in C: a :class:`BlockParams`' list of every parameter (its
    blocks made), anything else as it is. For whole-model walks (FSDP's units read every parameter)."""
    return parameters._all() if isinstance(parameters, BlockParams) else parameters


class BlockLayers(Sequence[Layer]):
    """A transformer's layers in forward order: ``head`` (the embedding), ``count`` copies of one block, then
    ``tail`` (final norm, output layer, loss), each block's layers made when one of them is first read.

    Block ``i`` is block 0 (``first``, ``per`` layers) renamed (``block_name.format(i=i)`` for the prefix
    ``first_prefix``), with index ``i``, stage ``stage_of[i]`` and its parameters shifted by ``i`` blocks of
    ``params_per_block`` (:func:`_transformer_params` lays them out so). The fast path reads what it needs of
    them without making a block (:meth:`param_indices`, :meth:`run_pieces`, :attr:`block_stages`,
    :meth:`stage_probes`); traces, exports and FSDP's units read the layers themselves. Read as a tuple of those
    layers (indexing, slices, iteration, equality); once every block is made (all at once when iterated), reads
    go to one tuple.
    """

    __slots__ = ("_all", "_block_name", "_count", "_first", "_head", "_made", "_per", "_ppb", "_stage_of", "_tail",
                 "_templates", "_unmade")

    def __init__(self, head: Sequence[Layer], first: Sequence[Layer], first_prefix: str, block_name: str,
                 params_per_block: int, stage_of: Sequence[int], tail: Sequence[Layer]) -> None:
        self._head, self._first, self._tail = tuple(head), list(first), tuple(tail)
        self._block_name, self._stage_of, self._ppb = block_name, tuple(stage_of), params_per_block
        self._per, self._count = len(self._first), len(self._stage_of)
        # (fields, name after the block prefix) of block 0's layers: a copy is its fields, copied whole, with
        # four changed. The template is a plain dict built once ({**...}): copying one is a block copy, and
        # unlike a copy of the instance's own (key-sharing) dict its copies keep attribute reads fast (3.6x
        # slower on such copies, measured on CPython 3.11).
        cut = len(first_prefix)
        self._templates = [({**la.__dict__}, la.name[cut:]) for la in self._first]
        self._made: list[list[Layer] | None] = [None] * self._count
        if self._count:
            self._made[0] = self._first
        self._unmade = max(self._count - 1, 0)  # blocks not made yet
        self._all: tuple[Layer, ...] | None = None  # every layer, once every block is made (read as a tuple's)
        if not self._unmade:
            self._full()

    def _block(self, i: int) -> list[Layer]:
        made = self._made[i]
        if made is None:
            shift = i * self._ppb
            made = self._made[i] = self._make(i, [tuple(map(shift.__add__, fields["param_indices"]))
                                                  if fields["param_indices"] else None
                                                  for fields, _ in self._templates])
            self._unmade -= 1
            if not self._unmade:
                self._full()
        return made

    def _make(self, i: int, owned: Sequence[tuple[int, ...] | None]) -> list[Layer]:
        """Block ``i``'s layers, owning ``owned`` (per layer: its parameter indices, None for none)."""
        renamed, stage = self._block_name.format(i=i), self._stage_of[i]
        make, set_fields = object.__new__, object.__setattr__
        made = []
        for (fields, rest), ids in zip(self._templates, owned, strict=True):
            copied = fields.copy()
            copied["name"], copied["block"], copied["stage"] = renamed + rest, i, stage
            if ids is not None:
                copied["param_indices"] = ids
            layer = make(Layer)
            set_fields(layer, "__dict__", copied)
            made.append(layer)
        return made

    def _columns(self, first: int = 0, end: int | None = None) -> list[list[tuple[int, ...]] | None]:
        """Per layer of block 0: the parameter indices of that layer in blocks ``first`` to ``end`` (every
        block by default; None where it owns none), for those blocks at once (zip builds the tuples, ``g + i ppb``
        for each ``g`` the layer owns in block 0), in C rather than one ``map`` per copy."""
        ppb = self._ppb
        lo, hi = first * ppb, (self._count if end is None else end) * ppb
        return [list(zip(*[range(g + lo, g + hi, ppb) for g in la.param_indices], strict=True))
                if la.param_indices else None for la in self._first]

    def materialize(self) -> tuple[Layer, ...]:
        """Every layer, as a tuple (every block made, the blocks not made yet all at once)."""
        if self._unmade:
            columns = self._columns()
            for i in range(1, self._count):
                if self._made[i] is None:
                    self._made[i] = self._make(i, [None if ids is None else ids[i] for ids in columns])
            self._unmade = 0
        return self._full()

    def _full(self) -> tuple[Layer, ...]:
        """Every layer as a tuple, once every block is made (then reads go to it)."""
        if self._all is None:
            self._all = (*self._head, *itertools.chain.from_iterable(self._made), *self._tail)  # type: ignore[arg-type]
        return self._all

    def param_indices(self, lo: int = 0, hi: int | None = None) -> list[tuple[int, ...]]:
        """Each layer's ``param_indices``, in order, without making a layer: what a rank holding layers ``lo``
        to ``hi`` (every layer by default) reads of them (its parameters, its layers' buckets). Only the blocks
        those layers are in are read: a pipeline rank's few of a 1T model's 128."""
        h, per = len(self._head), self._per
        body = per * self._count
        hi = len(self) if hi is None else hi
        out = [la.param_indices for la in self._head[lo:hi]] if lo < h else []
        a, b = max(lo - h, 0), min(hi - h, body)  # the layers' positions among the blocks'
        if a < b:
            first, end = a // per, -(-b // per)  # the blocks they are in
            rows = [[la.param_indices] * (end - first) if ids is None else ids  # per layer of a block: each block's
                    for ids, la in zip(self._columns(first, end), self._first, strict=True)]
            made = itertools.chain.from_iterable(zip(*rows, strict=True))  # block by block
            skip = a - first * per
            out += made if skip == 0 and b - a == (end - first) * per else itertools.islice(made, skip, skip + b - a)
        if hi > h + body:
            out += [la.param_indices for la in self._tail[max(lo - h - body, 0):hi - h - body]]
        return out

    def __len__(self) -> int:
        return len(self._head) + self._per * self._count + len(self._tail)

    def _where(self, i: int) -> tuple[int, int]:
        """Position ``i`` (0 <= i < len) as (block, index in it); block -1 is the head, ``count`` the tail."""
        h = len(self._head)
        if i < h:
            return -1, i
        i -= h
        if i < self._per * self._count:
            return divmod(i, self._per)
        return self._count, i - self._per * self._count

    def _item(self, i: int) -> Layer:
        block, k = self._where(i)
        if block < 0:
            return self._head[k]
        if block == self._count:
            return self._tail[k]
        return self._block(block)[k]

    @overload
    def __getitem__(self, i: int) -> Layer: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Layer, ...]: ...

    def __getitem__(self, i: int | slice) -> Layer | tuple[Layer, ...]:
        if self._all is not None:
            return self._all[i]
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                return tuple(self._item(k) for k in range(lo, hi, step))
            return self._slice(lo, hi)
        return self._item(self._position(i))

    def _slice(self, lo: int, hi: int) -> tuple[Layer, ...]:
        """Positions ``lo`` to ``hi``: the head's, whole blocks, the tail's."""
        h, per = len(self._head), self._per
        end = h + per * self._count
        out = list(self._head[lo:min(hi, h)])
        if hi > h and lo < end:
            a, b = max(lo, h) - h, min(hi, end) - h  # in the blocks' positions
            first, last = a // per, (b - 1) // per
            for i in range(first, last + 1):
                layers = self._block(i)
                out += layers if a <= i * per and (i + 1) * per <= b else layers[max(a - i * per, 0):b - i * per]
        if hi > end:
            out += self._tail[max(lo - end, 0):hi - end]
        return tuple(out)

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.materialize())  # an iteration reads every block

    def run_pieces(self, lo: int, hi: int) -> list[Sequence[Layer] | int]:
        """Positions ``lo`` to ``hi`` as pieces, in order: layers (of the head, the tail, or part of a block),
        or a number ``n`` for ``n`` whole blocks (not made)."""
        h, per = len(self._head), self._per
        end = h + per * self._count
        out: list[Sequence[Layer] | int] = []
        if lo < h:
            out.append(self._head[lo:min(hi, h)])
        a, b = max(lo, h) - h, min(hi, end) - h  # in the blocks' positions
        if a < b:
            whole_lo, whole_hi = -(-a // per), b // per  # the whole blocks among them
            if whole_lo >= whole_hi:
                out.append(self._slice(a + h, b + h))
            else:
                if a < whole_lo * per:
                    out.append(self._slice(a + h, whole_lo * per + h))
                out.append(whole_hi - whole_lo)
                if whole_hi * per < b:
                    out.append(self._slice(whole_hi * per + h, b + h))
        if hi > end:
            out.append(self._tail[max(lo - end, 0):hi - end])
        return [piece for piece in out if piece]

    @property
    def owns_in_order(self) -> bool:
        """Whether the head's, block 0's and the tail's layers, each part in order, own parameters that ascend
        (then so do any whole blocks' in order: each is block 0's shifted by ``params_per_block``). GPT-2-style
        blocks do; the 7B default's do not (its block's norm comes before its attention's weights in the forward,
        after them in the parameters)."""
        return all(all(map(lt, ids, ids[1:])) for ids in (
            [g for la in part for g in la.param_indices] for part in (self._head, self._first, self._tail)))

    @property
    def first_block(self) -> tuple[Layer, ...]:
        """Block 0's layers: every block is them renamed, reindexed and restaged, with shifted parameters (the
        whole blocks of :meth:`run_pieces`)."""
        return tuple(self._first)

    @property
    def block_stages(self) -> tuple[int, ...]:
        """Each block's stage, block 0 first."""
        return self._stage_of

    def stage_probes(self) -> list[tuple[int, int]]:
        """(position, stage) of every head layer, each block's first layer and every tail layer, in order: where
        the stage can change (a block's layers share one), read without making a layer."""
        h, per = len(self._head), self._per
        end = h + per * self._count
        return ([(i, la.stage) for i, la in enumerate(self._head)]
                + [(h + b * per, stage) for b, stage in enumerate(self._stage_of)]
                + [(end + k, la.stage) for k, la in enumerate(self._tail)])

    def _position(self, i: int) -> int:
        """``i`` as a position from 0, a negative one counted from the end, as a tuple's index is."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("layer index out of range")
        return i

    def __eq__(self, other: object) -> bool:
        """Equal to a tuple (or BlockLayers) of the same layers, as the tuple of its layers would be."""
        if not isinstance(other, tuple | BlockLayers):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"BlockLayers({len(self)} layers, {self._count} blocks)"


class RankLayers(Sequence[Layer]):
    """:meth:`Workload.rank_layers` made when first read (:meth:`Workload.held_layers`): a pipeline rank's plan
    reads its parameters and layer plans from block 0 (twin ranks' from their first rank's plan), so the fast
    engine reads none of its layers unless asked for a trace (whose spans are named after them)."""

    __slots__ = ("_args", "_layers")

    def __init__(self, workload: Workload, rank: int, pp: int) -> None:
        self._args: tuple[Workload, int, int] | None = (workload, rank, pp)
        self._layers: Sequence[Layer] = ()

    def _get(self) -> Sequence[Layer]:
        if self._args is not None:
            workload, rank, pp = self._args
            self._layers, self._args = workload.rank_layers(rank, pp), None
        return self._layers

    def __len__(self) -> int:
        if self._args is not None:
            workload, rank, pp = self._args
            return workload.rank_layer_count(rank, pp)
        return len(self._layers)

    def __getitem__(self, i: Any) -> Any:
        return self._get()[i]

    def __iter__(self) -> Iterator[Layer]:
        return iter(self._get())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, tuple | RankLayers):
            return NotImplemented
        return self._get() == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._get()) if self._args is None else f"RankLayers(rank {self._args[1]} of {self._args[2]})"


@dataclass(frozen=True)
class Workload:
    """Parameters (in definition order), gradient-ready order and layers (in forward order) of one GPU."""

    parameters: Sequence[Param]  # a tuple, or a transformer's BlockParams (read as one)
    grad_ready_order: Sequence[int]  # a tuple, or a transformer's BlockReady (read as one)
    layers: Sequence[Layer]  # a tuple, or a transformer's BlockLayers
    tokens_per_micro_batch: int
    samples_per_micro_batch: int
    model_flop_per_sample: float  # whole model, fwd + bwd, no recompute, all tp ranks (for MFU)
    num_stages: int = 1  # virtual pipeline stages: pp x virtual_stages
    boundary_activation_bytes: int = 0  # sent between pipeline stages per micro-batch (per tp rank)
    boundary_gather_bytes: int = 0  # all-gathered over tp by the receiving stage (Megatron scatter/gather)
    notes: list[str] = field(default_factory=list)
    #: ``(start, per_block, count)`` where ``layers`` holds ``count`` copies of one block from ``start`` on,
    #: ``per_block`` layers each, every copy's layer the same kind (:data:`LAYER_KIND`) as block 0's
    #: (transformers; None where nothing says so).
    blocks: tuple[int, int, int] | None = field(default=None, compare=False)
    #: Values derived from this workload and the inputs named in their keys (stage parameter lists, bucket
    #: assignments, layer plans per GPU and precision, ...), computed once; build_workload shares a workload
    #: between the scenarios of one workload_key, and with it these.
    memo: dict[tuple[object, ...], Any] = field(default_factory=dict, compare=False, repr=False)
    #: Values derived from the parameters and the layers' structure alone (which parameters each layer owns,
    #: its stage and block, the ready order) and the inputs in their keys: gradient buckets, each pipeline
    #: rank's gradients, stage parameter sizes and model states. Transformer workloads of one
    #: :func:`structure_key` (a sweep over micro-batch or sequence length) share this dict; kernels and layer
    #: objects, which differ between them, never go in it.
    shared: dict[tuple[object, ...], Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_params(self) -> int:
        return sum(p.numel for p in self.param_sizes())

    def param_sizes(self) -> list[ParamSize]:
        """Each parameter's :class:`ParamSize`, in definition order, once per workload structure: what the
        gradients, buckets, optimizer and memory model read of the parameters, without making a transformer's
        blocks' named parameters (:meth:`BlockParams.sizes`). Shared: callers must not change the list."""
        sizes = self.shared.get(("param sizes",))
        if sizes is None:
            params = self.parameters
            sizes = self.shared[("param sizes",)] = (
                params.sizes() if isinstance(params, BlockParams) else [ParamSize(p.numel, p.dtype) for p in params])
        return sizes  # type: ignore[no-any-return]

    def stage_size_counts(self, rank: int, pp: int) -> tuple[int, tuple[tuple[ParamSize, int], ...]]:
        """:meth:`size_counts` of pipeline rank ``rank``'s parameters (:meth:`rank_param_ids`), once per workload
        structure: the memory model's model states and the plan's ZeRO-1 partition read it. Shared."""
        key = ("stage sizes", rank, pp)
        got = self.shared.get(key)
        if got is None:
            got = self.shared[key] = self.size_counts(self.rank_param_ids(rank, pp))
        return got  # type: ignore[no-any-return]

    def size_counts(self, ids: Sequence[int]) -> tuple[int, tuple[tuple[ParamSize, int], ...]]:
        """The elements of parameters ``ids`` and how many of them have each size (:class:`ParamSize`, the
        ``(numel, dtype)`` pair), in order of first appearance: what the memory model's model states read of a
        stage. Where ``ids`` ascend and hold a transformer's blocks whole (a stage's do), each block's sizes are
        block 0's, counted once and times the blocks, not parameter by parameter."""
        sizes, params = self.param_sizes(), self.parameters
        # A plain dict, not a Counter: its update and constructor run in Python, per call (0.8% of GPT-3's step).
        counted: dict[ParamSize, int] = {}
        get = counted.get

        def count(found: Iterable[ParamSize], times: int = 1) -> None:
            for size in found:
                counted[size] = get(size, 0) + times

        whole = params.whole_blocks(ids) if isinstance(params, BlockParams) else None
        if whole is None:
            count(map(sizes.__getitem__, ids))
        else:
            a, b, block = whole
            n = (b - a) // (block.stop - block.start)  # whole blocks
            count(map(sizes.__getitem__, ids[:a]))
            if n:  # block 0's in order: first appearances fall as the ids' would
                count(sizes[block], n)
            count(map(sizes.__getitem__, ids[b:]))
        return sum(s.numel * k for s, k in counted.items()), tuple(counted.items())

    def stage_layers(self, stage: int) -> tuple[Layer, ...]:
        """Layers of one virtual stage, in forward order."""
        return tuple(layer for layer in self.layers if layer.stage == stage)

    def ready_position(self) -> dict[int, int]:
        """Each parameter's position in the gradient-ready order, computed once per workload structure."""
        position = self.shared.get(("ready position",))
        if position is None:
            order = self.grad_ready_order
            position = self.shared[("ready position",)] = dict(zip(order, range(len(order)), strict=True))
        return position  # type: ignore[no-any-return]

    def ready_sorted(self, ids: Sequence[int]) -> list[int]:
        """``ids`` in gradient-ready order (the order filtered to them), without a walk over every parameter of
        the model per pipeline rank (:meth:`ready_position`)."""
        if isinstance(self.grad_ready_order, BlockReady):  # a transformer's: from the rank's blocks
            return self.grad_ready_order.sorted_ids(ids)
        position = self.ready_position()
        return sorted((g for g in ids if g in position), key=position.__getitem__)

    def _ready_positions(self, ids: Sequence[int]) -> list[int]:
        """The positions in ``ids`` of :meth:`ready_sorted`'s entries (a rank's local ready order); a
        transformer's from its blocks (:meth:`BlockReady.positions`) where ``ids`` ascend, as a rank's do."""
        ready = self.grad_ready_order
        if isinstance(ready, BlockReady) and isinstance(ids, list) and ids == sorted(ids):  # sorted: in C
            return ready.positions(ids)
        local = {g: k for k, g in enumerate(ids)}
        return [local[g] for g in self.ready_sorted(ids)]

    def rank_param_ids(self, rank: int, pp: int) -> list[int]:
        """Global indices of the parameters pipeline rank ``rank``'s layers own, ascending: once per workload
        structure (the plan's rank gradients and the memory model's stage parameters start from them).
        Shared: callers must not change the list."""
        key = ("rank params", rank, pp)
        ids = self.shared.get(key)
        if ids is None:
            ids = self.shared[key] = sorted(set(itertools.chain.from_iterable(self.rank_layer_params(rank, pp))))
        return ids  # type: ignore[no-any-return]

    def rank_layer_params(self, rank: int, pp: int) -> list[tuple[int, ...]]:
        """Each of :meth:`rank_layers`' ``param_indices``, in order; a transformer's without making its blocks'
        layers (:meth:`BlockLayers.param_indices`, once per workload structure). Shared: callers must not change
        the list."""
        layers = self.layers
        if not isinstance(layers, BlockLayers):
            return [la.param_indices for la in self.rank_layers(rank, pp)]
        runs = self._rank_walk(pp)[0][rank]
        if len(runs) == 1 and runs != [(0, len(layers))]:  # one run (no interleaving): from its own blocks only
            key: tuple[Any, ...] = ("layer params", rank, pp)
            owned = self.shared.get(key)
            if owned is None:  # a 1T pipeline rank reads 2 of 128 blocks
                owned = self.shared[key] = layers.param_indices(*runs[0])
            return owned  # type: ignore[no-any-return]
        # Every layer's, once (an interleaved rank's runs span most blocks: building them all at once, in C, costs
        # less than a call per run), then the rank's runs.
        owned = self.shared.get(("layer params",))
        if owned is None:
            owned = self.shared[("layer params",)] = layers.param_indices()
        return owned if runs == [(0, len(owned))] else [*itertools.chain.from_iterable(owned[lo:hi] for lo, hi in runs)]

    def held_layers(self, rank: int, pp: int) -> Sequence[Layer]:
        """:meth:`rank_layers`, made when read where they are a transformer's blocks (what a rank's plan and
        buffers hold: the fast path reads their parameters and plans without them, :meth:`rank_layer_params`
        and :meth:`rank_pieces`)."""
        if isinstance(self.layers, BlockLayers) and self._rank_walk(pp)[0][rank] != [(0, len(self.layers))]:
            return RankLayers(self, rank, pp)
        return self.rank_layers(rank, pp)

    def rank_pieces(self, rank: int, pp: int) -> list[Sequence[Layer] | int] | None:
        """:meth:`rank_layers` as pieces, in order: layers, or a number ``n`` for ``n`` whole blocks (copies of
        block 0, :attr:`BlockLayers.first_block`), read without making them; None where the layers are not a
        transformer's :class:`BlockLayers`."""
        layers = self.layers
        if not isinstance(layers, BlockLayers):
            return None
        return [piece for lo, hi in self._rank_walk(pp)[0][rank] for piece in layers.run_pieces(lo, hi)]

    def reduced_gradients(self, ids: Sequence[int], reduce_in_fp32: bool) -> tuple[list[ParamSize], list[int]]:
        """The sizes of parameters ``ids`` (:class:`ParamSize`) as data-parallel reduction sees their gradients
        (:func:`grad_reduce_spec`), and their positions in ``ids`` in gradient-ready order (those the order
        lists). Once per workload structure, ids and dtype rule: the plan's rank gradients and the memory model's
        buffers ask alike. Shared: callers must not change the lists."""
        key = ("reduced gradients", reduce_in_fp32, tuple(ids))
        got = self.shared.get(key)
        if got is None:
            sizes = self.param_sizes()
            if len(ids) == len(sizes) and key[2] == tuple(range(len(ids))):
                # Every parameter, in order (a rank without pipeline parallelism): positions are the parameters'
                # own indices, and the ready order, a permutation of them, is already in ready order.
                specs, order = list(sizes), list(self.grad_ready_order)
            else:
                specs, order = list(map(sizes.__getitem__, ids)), self._ready_positions(ids)
            if reduce_in_fp32:  # without it every grad_reduce_spec is the size itself; a few distinct sizes
                reduced: dict[ParamSize, ParamSize] = {}
                specs = [reduced.get(p) or reduced.setdefault(p, grad_reduce_spec(p, True)) for p in specs]
            got = self.shared[key] = (specs, order)
        return got  # type: ignore[no-any-return]

    def rank_layers(self, rank: int, pp: int) -> Sequence[Layer]:
        """Layers held by pipeline rank ``rank`` (all its virtual stages), in forward order: made once per
        workload and pp, when first asked (a transformer's :class:`BlockLayers` makes only those blocks), or
        the workload's own layers where the rank holds them all."""
        key = ("rank layers", pp, rank)
        got = self.memo.get(key)
        if got is None:
            layers, runs = self.layers, self._rank_walk(pp)[0][rank]
            if runs == [(0, len(layers))]:
                got = layers  # every layer (one rank, one stage)
            else:
                got = tuple(itertools.chain.from_iterable(layers[lo:hi] for lo, hi in runs))
            self.memo[key] = got
        return got  # type: ignore[no-any-return]

    def rank_layer_count(self, rank: int, pp: int) -> int:
        """``len(rank_layers(rank, pp))``, without making the layers."""
        return sum(hi - lo for lo, hi in self._rank_walk(pp)[0][rank])

    def rank_stage_positions(self, rank: int, pp: int) -> dict[int, list[int]]:
        """Each virtual stage's positions in :meth:`rank_layers`, in forward order (the engines walk a rank's
        layers stage by stage). Shared: callers must not change the lists."""
        return self._rank_walk(pp)[1][rank]

    def _rank_walk(self, pp: int) -> tuple[list[list[tuple[int, int]]], list[dict[int, list[int]]]]:
        """Per rank, the runs of the model's layers it holds ((first, end) in layer order), and each of its
        virtual stages' positions among them; from the stage runs alone, no layer read."""
        key = ("rank runs", pp)
        if key not in self.memo and pp == 1 and self.num_stages == 1:  # one rank, one stage: every layer
            self.memo[key] = ([[(0, len(self.layers))]], [{0: list(range(len(self.layers)))}])
        if key not in self.memo:  # every rank's in one walk (a 1T model has 64 ranks and ~1,300 layers)
            runs: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
            positions: list[dict[int, list[int]]] = [{} for _ in range(pp)]
            held = [0] * pp
            for stage, lo, hi in self._stage_runs():
                r = stage % pp
                positions[r].setdefault(stage, []).extend(range(held[r], held[r] + hi - lo))
                held[r] += hi - lo
                runs[r].append((lo, hi))
            self.memo[key] = (runs, positions)
        return self.memo[key]  # type: ignore[no-any-return]

    def _stage_runs(self) -> list[tuple[int, int, int]]:
        """The layers as runs of consecutive layers of one virtual stage: (stage, first, end) in layer order.
        A transformer's block's layers share a stage: its first layer's stands for the block, read without
        making the block (a 1T model's 128 of ~1,300 layers)."""
        layers = self.layers
        probes: Iterable[tuple[int, int]]  # (position, stage) of the layers whose stage is read
        if isinstance(layers, BlockLayers):
            probes = layers.stage_probes()
        else:
            probes = ((i, la.stage) for i, la in enumerate(layers))
        heads: list[tuple[int, int]] = []  # (stage, position) where the layers from position on have that stage
        for lo, stage in probes:
            if not heads or heads[-1][0] != stage:
                heads.append((stage, lo))
        ends = [lo for _, lo in heads[1:]] + [len(layers)]
        return [(stage, lo, hi) for (stage, lo), hi in zip(heads, ends, strict=True)]

    def rank_twins(self, pp: int) -> list[tuple[int, int]]:
        """For each pipeline rank, the first rank that plans and sizes alike and how far its parameter indices
        are shifted from that rank's: ``(r, 0)`` for a rank that is the first of its kind (always the first
        and the last rank, which hold the embedding and the output layer).

        Two ranks are alike when they have one shape: layer by layer, equal kernel and collective tuples
        (identical blocks share them, so they compare by identity at once), recompute and measured times, the virtual
        stage's chunk, the block relative to the rank's first block, and the parameter indices relative to
        the rank's first one; and when their parameters, so shifted, have the same sizes and gradient-ready
        order. A pipeline's middle ranks are. Worked out once per workload and pp.
        """
        key = ("rank twins", pp)
        if key not in self.memo:
            # Candidates (rank, anchor, ids, shape), compared in turn: shapes are lists whose kernel tuples
            # compare by identity first (identical blocks share them), never hashed.
            firsts: list[tuple[int, int, list[int], tuple[list[Any], ...]]] = []
            twins = []
            for r in range(pp):
                if r in (0, pp - 1):
                    twins.append((r, 0))
                    continue
                layers = self.rank_layers(r, pp)
                owned = [la.param_indices for la in layers]
                ids = [g for own in owned for g in own]
                anchor = ids[0] if ids else 0
                block = next((la.block for la in layers if la.block is not None), 0)
                shape = (list(map(LAYER_KIND, layers)), [la.stage - r for la in layers],
                         [None if la.block is None else la.block - block for la in layers],
                         list(map(len, owned)), [g - anchor for g in ids])
                first, delta = r, 0
                for other, other_anchor, other_ids, other_shape in firsts:
                    if other_shape == shape:
                        first, delta = other, anchor - other_anchor
                        if not self._shifted_alike(other_ids, delta):
                            first, delta = r, 0  # one shape, but other parameter sizes or order: its own kind
                        break
                else:
                    firsts.append((r, anchor, ids, shape))
                twins.append((first, delta))
            self.memo[key] = twins
        return self.memo[key]  # type: ignore[no-any-return]

    def _shifted_alike(self, ids: list[int], delta: int) -> bool:
        """Whether the parameters ``ids`` shifted by ``delta`` have their sizes and gradient-ready order."""
        sizes = self.shared.get(("parameter sizes",))
        if sizes is None:
            sizes = self.shared[("parameter sizes",)] = [p[1:] for p in self.parameters]
        shifted = [g + delta for g in ids]
        if list(map(sizes.__getitem__, shifted)) != list(map(sizes.__getitem__, ids)):
            return False
        position = self.ready_position().__getitem__  # every parameter has one: the order is a permutation
        before, after = list(map(position, ids)), list(map(position, shifted))
        # One order when sorting by either's positions permutes the parameters alike.
        return sorted(range(len(ids)), key=before.__getitem__) == sorted(range(len(ids)), key=after.__getitem__)


#: What makes two layers alike, besides where they sit and what they own: twin ranks' layers
#: (:meth:`Workload.rank_twins`) and the layers one layer plan times (:func:`simddp.sim.plan.layer_plans`).
LAYER_KIND = attrgetter("fwd", "dgrad", "wgrad", "collectives", "recompute", "fwd_time_s", "bwd_time_s")

#: Floating dtypes narrower than fp32, whose gradients ``reduce_in_fp32`` all-reduces in fp32.
NARROW_FLOAT_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def grad_reduce_spec(p: _P, reduce_in_fp32: bool) -> _P:
    """The parameter (or its size) as data-parallel reduction sees its gradient (Megatron
    ``grad_reduce_in_fp32``)."""
    if reduce_in_fp32 and p.dtype in NARROW_FLOAT_DTYPES:
        return p._replace(dtype="float32")
    return p


def uses_dropout(scenario: Scenario) -> bool:
    """Dropout is on: ``training.dropout``, or by default for GPT/BERT-style models (not Llama-style ones)."""
    tf = scenario.model.transformer
    if scenario.training.dropout is not None:
        return scenario.training.dropout
    return tf is not None and not tf.gated_mlp


def total_params(spec: TransformerSpec) -> int:
    """Parameter count of a transformer (no tensor parallelism)."""
    return sum(p.numel for p in _transformer_params(spec, 1, "float32")[0])


#: Transformer workloads by what they are built from (:func:`workload_key`): the configurations of a sweep
#: or a plan that differ only in the cluster, the batch, the bucket cap, ZeRO or recompute share one workload,
#: and with it what its ``memo`` keeps (stage parameters, bucket assignments).
_WORKLOADS = KeyedCache(maxsize=256)
#: The ``shared`` memo of transformer workloads, by :func:`structure_key`.
_STRUCTURES = KeyedCache(maxsize=256)


def workload_key(scenario: Scenario) -> tuple[Any, ...]:
    """Every input :func:`_transformer_workload` reads (``tests/test_workload.py`` checks that scenarios
    with one key build equal workloads): the model, and the training and parallelism fields below."""
    tr, par = scenario.training, scenario.parallelism
    return (scenario.model, tr.precision, tr.micro_batch_size, tr.seq_len, tr.cross_entropy, tr.attention,
            tr.dropout, par.tp, par.pp, par.virtual_stages, par.sequence_parallel)


def structure_key(scenario: Scenario) -> tuple[Any, ...]:
    """Every input of a transformer workload's parameters and layer structure (what each layer owns, its stage
    and block, the ready order): the model, the parameter dtype and the layout. ``tests/test_workload.py``
    checks that the other inputs of :func:`workload_key` leave the structure as it is."""
    par = scenario.parallelism
    return scenario.model, scenario.training.precision, par.tp, par.pp, par.virtual_stages


def build_workload(scenario: Scenario) -> Workload:
    """The per-GPU workload of ``scenario`` (its tp shard; every pipeline stage, tagged by ``stage``).

    A transformer's is built once per :func:`workload_key`; the workload is immutable but for its ``memo``,
    whose values are keyed by every other input they read, so sharing it is exact.
    """
    spec = scenario.model.transformer
    if spec is not None:
        def build() -> Workload:
            return _transformer_workload(scenario, spec, _STRUCTURES.get(structure_key(scenario), dict))

        return _WORKLOADS.get(workload_key(scenario), build)
    return _parameter_list_workload(scenario)


def fresh_workload(scenario: Scenario) -> Workload:
    """:func:`build_workload` built anew, never from its caches (its ``shared`` memo is its own)."""
    spec = scenario.model.transformer
    if spec is not None:
        return _transformer_workload(scenario, spec)
    return _parameter_list_workload(scenario)


@functools.lru_cache(maxsize=4096)
def collective(op: str, size_bytes: int, where: str) -> Collective:
    """A TP collective spec (memoized: identical blocks share the object)."""
    return Collective(op, size_bytes, where)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=4096)
def memory_kernel(name: str, num_bytes: float) -> Kernel:
    return Kernel(name, "memory", bytes=num_bytes)


@functools.lru_cache(maxsize=4096)
def gemm_kernel(name: str, m: int, n: int, k: int, elem_bytes: int, batch: int = 1) -> Kernel:
    """A (batch of) (m x k) @ (k x n) GEMM; its operands and result cross device memory once."""
    return Kernel(name, "gemm", flop=2.0 * batch * m * n * k, bytes=float(batch * (m * k + k * n + m * n) * elem_bytes),
                  m=m, n=n, k=k, batch=batch)


# ----------------------------------------------------------------------------------- parameter lists
def _parameter_list_workload(scenario: Scenario) -> Workload:
    tr = scenario.training
    params = tuple(Param(p.name, p.numel, p.dtype) for p in scenario.model.parameters or ())
    n = len(params)
    ready = tuple(scenario.model.grad_ready_order or range(n - 1, -1, -1))
    specs = scenario.model.layers
    act_bytes = PRECISION_ACT_BYTES[tr.precision]
    tokens = tr.micro_batch_size * tr.seq_len
    layers: list[Layer] = []

    def dense(name: str, flop: float, num_bytes: float) -> tuple[Kernel, ...]:
        return (Kernel(name, "dense", flop=flop, bytes=num_bytes),)

    if specs is None:
        # One layer per parameter; backward follows the ready order, so forward runs in its reverse.
        for idx in reversed(ready):
            p = params[idx]
            flop = 2.0 * p.numel * tokens
            wbytes = p.numel * dtype_bytes(p.dtype)
            layers.append(Layer(p.name, (idx,), dense("fwd", flop, wbytes), dense("dgrad", flop, wbytes),
                                dense("wgrad", flop, wbytes), model_flop=flop))
    else:
        b = tr.micro_batch_size
        elem = act_bytes
        for spec in specs:
            numel = sum(params[i].numel for i in spec.param_indices)
            wbytes = sum(params[i].numel * dtype_bytes(params[i].dtype) for i in spec.param_indices)
            per_sample = spec.fwd_flop_per_sample
            fwd = per_sample * b if per_sample is not None else 2.0 * numel * tokens
            act = (spec.activation_numel_per_sample or 0) * b * act_bytes
            has_params = bool(spec.param_indices)
            if spec.gemm_shape is not None:
                rows, cols, depth = spec.gemm_shape
                m = rows * b
                fk: tuple[Kernel, ...] = (gemm_kernel("fwd", m, cols, depth, elem),)
                dk: tuple[Kernel, ...] = (gemm_kernel("dgrad", m, depth, cols, elem),)
                wk: tuple[Kernel, ...] = (gemm_kernel("wgrad", depth, cols, m, elem),) if has_params else ()
                fwd = fk[0].flop
            else:
                fk, dk = dense("fwd", fwd, wbytes + act), dense("dgrad", fwd, wbytes + act)
                wk = dense("wgrad", fwd, wbytes + act) if has_params else ()
            if spec.elementwise_numel_per_sample is not None:
                mem_fwd, mem_bwd = spec.elementwise_numel_per_sample
                fk += (memory_kernel("elementwise", mem_fwd * b * act_bytes),)
                dk += (memory_kernel("elementwise-bwd", mem_bwd * b * act_bytes),)
            layers.append(Layer(
                spec.name, tuple(spec.param_indices), fwd=fk, dgrad=dk, wgrad=wk,
                activation_bytes=act, model_flop=fwd,
                fwd_time_s=spec.fwd_time_s, bwd_time_s=spec.bwd_time_s,
            ))
    num_stages = scenario.parallelism.pp * scenario.parallelism.virtual_stages
    layers = _assign_stages(layers, num_stages)
    flop_per_sample = 3 * sum(la.model_flop for la in layers) / tr.micro_batch_size
    return Workload(
        parameters=params,
        grad_ready_order=ready,
        layers=tuple(layers),
        tokens_per_micro_batch=tokens,
        samples_per_micro_batch=tr.micro_batch_size,
        model_flop_per_sample=flop_per_sample,
        num_stages=num_stages,
    )


def _assign_stages(layers: list[Layer], pp: int) -> list[Layer]:
    """Split layers into ``pp`` contiguous stages with about equal forward FLOP (greedy): a layer goes to the stage
    the FLOP before it point to, at most one past the previous layer's, and no stage is left empty (a first layer
    with most of the FLOP is a stage of its own, the next layers one stage each until they must share)."""
    if pp == 1:
        return layers
    total = sum(la.model_flop for la in layers) or 1.0
    out, acc, stage = [], 0.0, 0
    for i, la in enumerate(layers):
        remaining_layers = len(layers) - i
        # acc / total * pp rounds 60/88 x 22 to 14.999999999999998: equal layers split unevenly; the product
        # first, and a layer within 1e-9 of a stage's share starts it
        stage = min(pp - 1, int(acc * pp / total + 1e-9), stage + 1 if i else 0)  # never skip a stage
        stage = max(stage, pp - remaining_layers)  # never leave a later stage empty
        out.append(copy_with(la, stage=stage))
        acc += la.model_flop
    return out


# ------------------------------------------------------------------------------------ transformers
@dataclass(frozen=True)
class _Names:
    """Module names of one architecture family (Hugging Face), for layers and their parameters."""

    embed: str
    block: str
    norm1: str
    qkv: str
    core: str
    out: str
    norm2: str
    mlp_in: str
    mlp_out: str
    final_norm: str


_LLAMA = _Names("model.embed_tokens", "model.layers.{i}", "input_layernorm", "self_attn.qkv_proj", "self_attn.core",
                "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_up_proj", "mlp.down_proj", "model.norm")
_GPT = _Names("transformer.wte", "transformer.h.{i}", "ln_1", "attn.c_attn", "attn.core", "attn.c_proj", "ln_2",
              "mlp.c_fc", "mlp.c_proj", "transformer.ln_f")


def _names(spec: TransformerSpec) -> _Names:
    return _LLAMA if spec.gated_mlp else _GPT


def _transformer_params(
    spec: TransformerSpec, tp: int, dtype: str, output_copy: bool = False
) -> tuple[BlockParams, dict[str, list[int]]]:
    """Per-GPU parameters in Hugging Face definition order (blocks after the first made when read), and the
    indices each module (layer name) owns, for the modules outside the blocks and those of block 0 (block i's
    are block 0's shifted by i blocks). ``output_copy``: a tied output layer has a weight of its own, the copy
    the last pipeline stage holds (Megatron's ``output_layer.weight``, kept equal to the embedding by the
    embedding group's all-reduce): in that stage's gradients, buckets and optimizer step."""
    h, ffn, v = spec.hidden_size, spec.ffn_hidden_size, spec.vocab_size
    kv_shard = max(1, spec.kv_heads // tp) * (h // spec.num_heads)  # GQA with tp > kv_heads replicates
    q_shard = h // tp
    names = _names(spec)
    params: list[Param] = []
    groups: dict[str, list[int]] = {}
    later = 0  # parameters before the next one added that are not in params (blocks 1 on: BlockParams)

    def add(module: str, name: str, numel: int) -> None:
        groups.setdefault(module, []).append(len(params) + later)
        params.append(Param(name, numel, dtype))

    def norm(module: str, prefix: str) -> None:
        add(module, f"{prefix}.weight", h)
        if spec.norm == "layernorm":
            add(module, f"{prefix}.bias", h)

    llama = spec.gated_mlp
    add(names.embed, f"{names.embed}.weight", v // tp * h)
    if not llama:
        if spec.position_embedding == "learned":
            add(names.embed, "transformer.wpe.weight", spec.max_position_embeddings * h)
        if spec.num_token_types:
            add(names.embed, "transformer.token_type_embeddings.weight", spec.num_token_types * h)
            norm(names.embed, "transformer.embeddings.LayerNorm")

    def block(i: int) -> None:
        """Add the parameters of transformer block ``i``."""
        p = names.block.format(i=i)
        mod = {key: f"{p}.{getattr(names, key)}" for key in ("norm1", "qkv", "out", "norm2", "mlp_in", "mlp_out")}
        if llama:
            add(mod["qkv"], f"{p}.self_attn.q_proj.weight", q_shard * h)
            add(mod["qkv"], f"{p}.self_attn.k_proj.weight", kv_shard * h)
            add(mod["qkv"], f"{p}.self_attn.v_proj.weight", kv_shard * h)
            if spec.bias:
                for name, n in (("q_proj", q_shard), ("k_proj", kv_shard), ("v_proj", kv_shard)):
                    add(mod["qkv"], f"{p}.self_attn.{name}.bias", n)
            add(mod["out"], f"{mod['out']}.weight", h * q_shard)
            add(mod["mlp_in"], f"{p}.mlp.gate_proj.weight", ffn // tp * h)
            add(mod["mlp_in"], f"{p}.mlp.up_proj.weight", ffn // tp * h)
            add(mod["mlp_out"], f"{mod['mlp_out']}.weight", h * ffn // tp)
            norm(mod["norm1"], mod["norm1"])
            norm(mod["norm2"], mod["norm2"])
        else:
            norm(mod["norm1"], mod["norm1"])
            add(mod["qkv"], f"{mod['qkv']}.weight", h * (q_shard + 2 * kv_shard))
            if spec.bias:
                add(mod["qkv"], f"{mod['qkv']}.bias", q_shard + 2 * kv_shard)
            add(mod["out"], f"{mod['out']}.weight", q_shard * h)
            if spec.bias:
                add(mod["out"], f"{mod['out']}.bias", h)
            norm(mod["norm2"], mod["norm2"])
            add(mod["mlp_in"], f"{mod['mlp_in']}.weight", h * ffn // tp)
            if spec.bias:
                add(mod["mlp_in"], f"{mod['mlp_in']}.bias", ffn // tp)
            add(mod["mlp_out"], f"{mod['mlp_out']}.weight", ffn // tp * h)
            if spec.bias:
                add(mod["mlp_out"], f"{mod['mlp_out']}.bias", h)

    # Blocks are identical but for their names: add the first; the others are its parameters renamed, made
    # when read (BlockParams).
    start = len(params)
    if spec.num_layers:
        block(0)
    prefix = names.block.format(i=0)
    cut = len(prefix)
    # (name after the block prefix, elements, dtype) of block 0's parameters.
    first = [(q.name[cut:], q.numel, q.dtype) for q in params[start:]]
    end = len(params)
    later = max(spec.num_layers - 1, 0) * len(first)
    if spec.final_norm:
        norm(names.final_norm, names.final_norm)
    if not spec.tied_embeddings or output_copy:
        add("lm_head", "lm_head.weight", v // tp * h)
    return BlockParams(params[:start], first, names.block, spec.num_layers, params[start:end], params[end:]), groups


def _transformer_workload(scenario: Scenario, spec: TransformerSpec,
                          structure_memo: dict[tuple[object, ...], Any] | None = None) -> Workload:
    tr, par = scenario.training, scenario.parallelism
    tp, sp = par.tp, par.sequence_parallel
    dtype = PRECISION_PARAM_DTYPE[tr.precision]
    a = PRECISION_ACT_BYTES[tr.precision]
    # With pp > 1 a tied output layer lives on the last stage, the embedding on the first: each its own weight.
    output_copy = spec.tied_embeddings and par.pp > 1
    params, groups = _transformer_params(spec, tp, dtype, output_copy)
    names = _names(spec)
    h, ffn, v, s, b = spec.hidden_size, spec.ffn_hidden_size, spec.vocab_size, tr.seq_len, tr.micro_batch_size
    t = b * s  # tokens of the micro-batch
    t_sp = t // tp if sp else t  # tokens a GPU holds outside the tensor-parallel regions
    heads = spec.num_heads // tp
    head_dim = h // spec.num_heads
    kv_heads = max(1, spec.kv_heads // tp)
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    gated = spec.gated_mlp
    ffn_local = ffn // tp
    dropout = uses_dropout(scenario)
    act = t * h * a  # one full [s, b, h] activation: the TP collectives' buffer
    tp_on = tp > 1

    def owned(module: str) -> tuple[int, ...]:
        return tuple(groups.get(module, []))

    pool: dict[tuple[int, ...], tuple[Any, ...]] = {}

    def shared(items: tuple[Any, ...]) -> tuple[Any, ...]:
        """One tuple object for equal kernel lists (their items are memoized): identical blocks share them."""
        return pool.setdefault(tuple(map(id, items)), items)

    def linear(name: str, module: str, k: int, n: int, block: int | None, kind: str, model_n: int,
               sac: float = 1.0) -> Layer:
        """A (t x k) @ (k x n) linear on this rank; ``kind``: column, row, or vocab (parallel style).

        ``model_n`` is the width it multiplies h by in the whole model (for model FLOP: 2 t h model_n);
        ``sac`` the share of it op-level selective checkpointing re-runs (:func:`op_sac_recompute`).
        """
        colls: list[Collective] = []
        if tp_on and kind in ("column", "vocab"):
            if sp:
                colls += [collective("all-gather", act, "fwd-pre"), collective("all-gather", act, "wgrad-pre"),
                          collective("reduce-scatter", act, "dgrad-post")]
            else:
                colls.append(collective("all-reduce", act, "dgrad-post"))
        if tp_on and kind == "row":
            if sp:
                colls += [collective("reduce-scatter", act, "fwd-post"), collective("all-gather", act, "bwd-pre")]
            else:
                colls.append(collective("all-reduce", act, "fwd-post"))
        wgrad: tuple[Kernel, ...] = ()
        if owned(module) or kind == "vocab":
            wgrad = (gemm_kernel("wgrad", k, n, t, a),)
            if spec.bias and kind != "vocab":  # Megatron: grad_bias = grad_output.sum(dim=0), a pass over dy
                wgrad += (memory_kernel("bias-grad", t * n * a),)
        return Layer(
            name, owned(module),
            fwd=shared((gemm_kernel("fwd", t, n, k, a),)),
            dgrad=shared((gemm_kernel("dgrad", t, k, n, a),)),
            wgrad=shared(wgrad),
            collectives=shared(tuple(colls)), block=block, recompute="block" if block is not None else "none",
            model_flop=2.0 * t * h * model_n / tp,
        )

    def elementwise(name: str, module: str | None, fwd_tensors: float, bwd_tensors: float, width: int,
                    tokens: int, block: int | None) -> Layer:
        """A memory-bound op over ``tokens`` x ``width`` activations: tensors read + written, fwd and bwd."""
        numel = tokens * width
        return Layer(
            name, owned(module) if module else (),
            fwd=shared((memory_kernel("fwd", fwd_tensors * numel * a),)),
            dgrad=shared((memory_kernel("dgrad", bwd_tensors * numel * a),) if bwd_tensors else ()),
            block=block, recompute="block" if block is not None else "none",
        )

    # Dropout (Megatron's fused bias-dropout-add): the mask is a byte per element, half a 16-bit tensor.
    mask = _MASK_BYTES / a if dropout else 0.0
    # Fused LayerNorm/RMSNorm (apex, Transformer Engine): forward reads x and writes y; backward makes two
    # passes, one reading x and dy for the weight gradient's partial sums, one reading them again to write dx.
    norm_fwd, norm_bwd = 2.0, 5.0
    residual_fwd = 3.0 + mask  # read branch and residual, write sum (and the dropout mask)
    residual_bwd = 2.0 + mask if dropout else 0.0  # dropout's backward; the add's gradient is a pass-through

    def block_layers(i: int) -> list[Layer]:
        """The layers of transformer block ``i``."""
        p = names.block.format(i=i)
        block: list[Layer] = []
        block.append(elementwise(f"{p}.{names.norm1}", f"{p}.{names.norm1}", norm_fwd, norm_bwd, h, t_sp, i))
        block.append(linear(f"{p}.{names.qkv}", f"{p}.{names.qkv}", h, q_width + 2 * kv_width, i, "column",
                            h + 2 * (h // spec.num_heads * spec.kv_heads),
                            sac=kv_width / (q_width + 2 * kv_width) if gated else 0.0))
        if spec.position_embedding == "rope":
            block.append(elementwise(f"{p}.self_attn.rotary", None, 2.0, 2.0, q_width + kv_width, t, i))
        core = _attention_core(f"{p}.{names.core}", scenario, b, s, heads, kv_heads, head_dim, dropout, a, i)
        block.append(replace(core, fwd=shared(core.fwd), dgrad=shared(core.dgrad)))
        block.append(linear(f"{p}.{names.out}", f"{p}.{names.out}", q_width, h, i, "row", h))
        block.append(elementwise(f"{p}.residual_attn", None, residual_fwd, residual_bwd, h, t_sp, i))
        block.append(elementwise(f"{p}.{names.norm2}", f"{p}.{names.norm2}", norm_fwd, norm_bwd, h, t_sp, i))
        block.append(linear(f"{p}.{names.mlp_in}", f"{p}.{names.mlp_in}", h, ffn_local * (2 if gated else 1), i,
                            "column", ffn * (2 if gated else 1), sac=0.5 if gated else 0.0))
        # SwiGLU reads gate and up, writes their product; backward reads both and dy, writes two gradients.
        act_fwd, act_bwd = (3.0, 5.0) if gated else (2.0, 3.0)
        act_name = f"{p}.mlp.act_fn" if gated else f"{p}.mlp.act"
        block.append(elementwise(act_name, None, act_fwd, act_bwd, ffn_local, t, i))
        block.append(linear(f"{p}.{names.mlp_out}", f"{p}.{names.mlp_out}", ffn_local, h, i, "row", ffn,
                            sac=0.0 if gated else 1.0))
        block.append(elementwise(f"{p}.residual_mlp", None, residual_fwd, residual_bwd, h, t_sp, i))
        return block

    emb_colls: tuple[Collective, ...] = ()
    if tp_on:  # vocab-parallel embedding: each rank looks up its vocabulary shard, partial sums reduced
        emb_colls = (Collective("reduce-scatter" if sp else "all-reduce", act, "fwd-post"),)
    embedding = (Layer(
        names.embed, owned(names.embed),
        fwd=(memory_kernel("lookup", (2.0 + mask) * t * h * a),),
        wgrad=(memory_kernel("scatter-add", t * h * (a + _FP32)),),
        collectives=emb_colls,
    ),)  # the layers before the blocks

    # Blocks are identical but for their names, parameters, index and pipeline stage: block 0 is built, the
    # others are made from it when first read (BlockLayers: the fast path reads their parameters, stages and
    # plans from block 0, and makes none). Block i's parameters are block 0's shifted by i blocks
    # (_transformer_params lays them out so); blocks go to stages as evenly as they divide (block_stage_starts),
    # the embedding to the first stage, the rest to the last.
    num_stages = par.pp * par.virtual_stages
    starts = block_stage_starts(spec.num_layers, par.pp, par.virtual_stages)
    stage_of = [s for s in range(num_stages) for _ in range(starts[s], starts[s + 1])]
    first = block_layers(0) if spec.num_layers else []  # on stage 0 (block_stage_starts puts it there)
    prefix = names.block.format(i=0)
    per_block = sum(len(ids) for module, ids in groups.items() if module.startswith(prefix + "."))
    last_stage = num_stages - 1
    tail: list[Layer] = []
    if spec.final_norm:
        tail.append(elementwise(names.final_norm, names.final_norm, norm_fwd, norm_bwd, h, t_sp, None))
    head_module = "lm_head" if not spec.tied_embeddings or output_copy else names.embed
    head = linear("lm_head", head_module, h, v // tp, None, "vocab", v)
    if spec.tied_embeddings and not output_copy:
        head = replace(head, param_indices=())  # the tied weight's gradient completes at the embedding
    tail.append(head)
    # Megatron's vocab-parallel cross-entropy on fp32 logits: convert (read 16-bit, write fp32), then max,
    # subtract, exp, sum and normalise in place (about five fp32 passes); backward writes the gradient
    # (fp32 read and write) and converts it to 16 bits. Three small all-reduces over tp (max, target logit,
    # sum of exponentials) of one fp32 per token each.
    logits = t * v // tp
    loss_colls = tuple(Collective("all-reduce", t * _FP32, "fwd-post") for _ in range(3)) if tp_on else ()
    fwd_bytes, bwd_bytes = a + _FP32 + 5 * _FP32, 3 * _FP32 + a
    if tr.cross_entropy == "unfused":
        # F.cross_entropy(logits.float()): the cast (read 16-bit, write fp32), log_softmax (max, sum of
        # exponentials, write: four fp32 passes); backward: nll_loss_backward writes a dense fp32 gradient,
        # log_softmax_backward reads it and the log-probabilities and writes another, the cast back to 16 bits.
        fwd_bytes, bwd_bytes = a + _FP32 + 4 * _FP32, _FP32 + 3 * _FP32 + _FP32 + a
    tail.append(Layer(
        "loss", (),
        fwd=(memory_kernel("cross-entropy", logits * fwd_bytes),),
        dgrad=(memory_kernel("cross-entropy-bwd", logits * bwd_bytes),),
        collectives=loss_colls,
    ))
    if last_stage:
        tail = [copy_with(la, stage=last_stage) for la in tail]

    lazy = BlockLayers(embedding, first, prefix, names.block, per_block, stage_of, tail)

    # Gradient-ready order = reverse of execution order, parameter by parameter within a module. Block i's
    # part is block 0's shifted by i blocks (its parameters are), taken once per block rather than per layer.
    # Made whole only where read whole (BlockReady); each parameter at its first appearance (a tied weight is in
    # the output layer and the embedding).
    head_ready = list(dict.fromkeys(g for layer in reversed(tail) for g in reversed(layer.param_indices)))
    block_ready = [g for layer in reversed(first) for g in reversed(layer.param_indices)] if spec.num_layers else []
    seen = set(head_ready)
    rest_ready = [g for g in dict.fromkeys(reversed(embedding[0].param_indices)) if g not in seen]
    ready = BlockReady(head_ready, block_ready, spec.num_layers, rest_ready)
    if len(block_ready) != per_block or not ready.is_permutation(len(params)):
        raise AssertionError("every parameter belongs to one layer")  # a bug in this module, not user input

    # Summed in layer order, as over every layer (the same additions, bit for bit): the blocks' values are block
    # 0's repeated, by list repetition rather than an attribute read per copy.
    flops = [la.model_flop for la in embedding] + [la.model_flop for la in first] * spec.num_layers
    flop_per_sample = 3 * tp * sum(flops + [la.model_flop for la in tail]) / b
    notes = []
    if spec.kv_heads < tp:
        notes.append(f"num_kv_heads({spec.kv_heads}) < tp({tp}): K/V projections are replicated")
    return Workload(
        parameters=params,
        grad_ready_order=ready,
        layers=lazy,
        tokens_per_micro_batch=t,
        samples_per_micro_batch=b,
        model_flop_per_sample=flop_per_sample,
        num_stages=num_stages,
        # Megatron's scatter/gather optimisation (Narayanan et al. sec. 4.1): each tp rank sends 1/t of the
        # activation and the receiving stage all-gathers the slices over NVLink. With sequence parallelism each
        # rank holds and sends its own 1/t of the sequence, which the next stage reads as it is: no gather
        # (Megatron's p2p_communication scatters and gathers only without sequence_parallel).
        boundary_activation_bytes=t * h * a // tp,
        boundary_gather_bytes=t * h * a if tp > 1 and not sp else 0,
        notes=notes,
        blocks=(1, len(first), spec.num_layers) if spec.num_layers else None,  # after the embedding
        memo={("rank twins", par.pp): twins} if (twins := _block_twins(spec.num_layers, par.pp,
                                                                        par.virtual_stages, per_block)) else {},
        shared={} if structure_memo is None else structure_memo,
    )


def block_stage_starts(num_layers: int, pp: int, v: int) -> list[int]:
    """The first transformer block of each of the ``pp v`` virtual stages, then ``num_layers``.

    Where ``L / (pp v)`` blocks divide evenly, Megatron's split. Where they do not, torchtitan's default split
    (``generate_split_points`` in torchtitan's pipelining utilities, the runs of its published 405B tables): the
    first stage holds the floor of ``L / (pp v)``, the stages after it one more each while extra blocks last, and
    the last stage what remains (the floor, or one more). So the first stage, which holds the embedding, holds the
    floor, and where the extra blocks do not fill every stage but one the last, which holds the output layer, does
    too (Llama 3 405B's 126 layers on 16 stages: 7 on the first and last, 8 on the others, Dubey et al. 2024,
    sec. 3.3.2); no rank holds more than one block above another. (Block ``i`` on stage ``i pp v // L`` put every
    longer chunk of an interleaved split on the same ranks: 126 layers on pp 16 with 7 chunks gave ranks 0 and 8
    14 layers and the others 7.) With fewer blocks than stages, block ``i`` is on stage ``i pp v // L`` and some
    stages hold none.
    """
    stages = pp * v
    per_stage, extra = divmod(num_layers, stages)
    if not per_stage or not extra:
        return [-(-s * num_layers // stages) for s in range(stages + 1)]
    middle = min(extra, stages - 2)
    counts = [per_stage] + [per_stage + 1] * middle + [per_stage] * (stages - 1 - middle)
    counts[-1] += extra - middle
    return list(itertools.accumulate(counts, initial=0))


def _block_twins(num_layers: int, pp: int, v: int, per_block: int) -> list[tuple[int, int]] | None:
    """:meth:`Workload.rank_twins` of a transformer workload, from how :func:`_transformer_workload` lays it
    out rather than from a walk over every rank's layers and parameters (a 1T pipeline's 62 middle ranks).

    A middle rank holds blocks only: in its chunk ``c``, those of virtual stage ``c pp + r`` (block ``i`` goes
    to the stage :func:`block_stage_starts` says), each a copy of block 0 with its parameters shifted by ``i``
    blocks. Two middle ranks therefore have one shape exactly when their chunks hold as many blocks each and
    their first blocks are the same distance apart in every chunk; the later one's parameters are then the
    earlier one's shifted by that many blocks, with their sizes and ready order. As the walk does, a rank takes
    the first earlier rank of its shape. ``None`` (the walk answers) when a stage holds no block.
    ``tests/test_workload.py`` checks the answer against the walk's."""
    first = block_stage_starts(num_layers, pp, v)  # first block of each stage (and the end)
    if pp < 2 or any(b >= e for b, e in itertools.pairwise(first)):
        return None
    # The first rank of each shape: (blocks per chunk, first blocks less the rank's first) -> (rank, its first).
    kinds: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int]] = {}
    twins = [(0, 0)]
    if v == 1:  # one chunk: a shape is the rank's block count
        for r in range(1, pp - 1):
            start = first[r]
            got = kinds.setdefault(((first[r + 1] - start,), ()), (r, start))
            twins.append((got[0], (start - got[1]) * per_block))
        return [*twins, (pp - 1, 0)]
    for r in range(1, pp - 1):
        starts = [first[c * pp + r] for c in range(v)]
        counts = tuple(first[c * pp + r + 1] - s for c, s in enumerate(starts))
        got = kinds.setdefault((counts, tuple(s - starts[0] for s in starts)), (r, starts[0]))
        twins.append((got[0], (starts[0] - got[1]) * per_block))
    return [*twins, (pp - 1, 0)]


def _attention_core(name: str, scenario: Scenario, b: int, s: int, heads: int, kv_heads: int, head_dim: int,
                    dropout: bool, a: int, block: int) -> Layer:
    """The attention core of one rank's ``heads`` heads: FlashAttention, or Megatron's unfused kernels.

    FlashAttention (Dao et al. 2022; FlashAttention-2, Dao 2023) is one kernel per pass that never writes
    the s x s scores; a causal mask skips the blocks above the diagonal, half of the 4 b s^2 d FLOP per head.
    Unfused (Megatron's ``CoreAttention`` before FlashAttention): batched QK^T, the fused scale-mask-softmax
    (read and write the scores), dropout (read, write, one-byte mask), batched PV; backward runs four
    batched GEMMs (dP, dV, dQ, dK), dropout's and softmax's backward.
    """
    causal = True
    bh = b * heads
    model_flop = 4.0 * b * s * s * heads * head_dim  # Megatron's eq. 3 counts the full s x s
    if scenario.training.attention == "flash":
        work = model_flop * (0.5 if causal else 1.0)
        tiles = bh * -(-s // FLASH_BLOCK_ROWS)
        io = (4 * bh + 0) * s * head_dim * a  # read q, k, v and write o once (GQA reads fewer k, v: ignored)
        keys = s // 2 if causal else s  # keys a query block attends to, on average
        return Layer(name, (), fwd=(Kernel("flash-fwd", "flash-fwd", flop=work, bytes=io, k=keys, tiles=tiles),),
                     dgrad=(Kernel("flash-bwd", "flash-bwd", flop=FLASH_BWD_FLOP_RATIO * work, bytes=2 * io,
                                   k=keys, tiles=tiles),),
                     block=block, recompute="core", model_flop=model_flop, sac_recompute=0.0)
    scores = bh * s * s
    mask = _MASK_BYTES if dropout else 0
    fwd = [gemm_kernel("qk", s, s, head_dim, a, bh), memory_kernel("scale-mask-softmax", 2.0 * scores * a)]
    if dropout:
        fwd.append(memory_kernel("dropout", scores * (2 * a + mask)))
    fwd.append(gemm_kernel("pv", s, head_dim, s, a, bh))
    bwd = [gemm_kernel("dp", s, s, head_dim, a, bh), gemm_kernel("dv", s, head_dim, s, a, bh)]
    if dropout:
        bwd.append(memory_kernel("dropout-bwd", scores * (2 * a + mask)))
    bwd += [memory_kernel("softmax-bwd", 3.0 * scores * a), gemm_kernel("dq", s, head_dim, s, a, bh),
            gemm_kernel("dk", s, head_dim, s, a, bh)]
    del kv_heads
    return Layer(name, (), fwd=tuple(fwd), dgrad=tuple(bwd), block=block, recompute="core", model_flop=model_flop)


def fsdp_unit_layers(layers: tuple[Layer, ...]) -> tuple[list[list[int]], list[int]]:
    """FSDP wrapping, as simddp times and sizes it: one unit per transformer block (per layer of a
    parameter-list model); the rest (embedding, final norm, output layer, loss) is the root unit.

    Returns the units as lists of positions in ``layers`` (forward order), and the root's positions.
    Memory (:mod:`simddp.memory`) and the simulator (:mod:`simddp.sim`) both group by this one rule.
    """
    units: dict[int, list[int]] = {}
    root: list[int] = []
    transformer = any(la.block is not None for la in layers)
    for pos, la in enumerate(layers):
        if transformer:
            if la.block is None:
                root.append(pos)
            else:
                units.setdefault(la.block, []).append(pos)
        else:
            units[pos] = [pos]
    return list(units.values()), root


def copy_with(obj: _D, **changes: Any) -> _D:
    """``dataclasses.replace(obj, **changes)`` without re-running the dataclass constructor: for the frozen
    layers copied once per layer of every block, where the constructor is the cost. The
    other fields, kernel and collective tuples included, are shared with ``obj``."""
    new = object.__new__(type(obj))
    object.__setattr__(new, "__dict__", {**obj.__dict__, **changes})  # a plain dict (see _transformer_workload)
    return new  # type: ignore[no-any-return]
