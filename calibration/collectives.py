"""Collective timings on this cluster: ``simddp calibrate collect comm --nproc-per-node N --out comm.json``.

(``simddp calibrate collect comm`` runs ``torchrun ... -m simddp_calibration.collectives``.)

For each op (all-reduce, reduce-scatter, all-gather, broadcast), communicator and message size
(nccl-tests sizes: the full buffer, 1 KiB to 256 MiB by default), every rank runs warm-up iterations,
then timed repeats; a repeat is a barrier and a few ops back to back timed together (as nccl-tests
does, and as DDP issues its buckets), and its time per op is the slowest rank's (the collective is only
done when every rank is). The median over repeats is what the fit uses; percentiles, extremes
and outliers are kept. On several hosts the same sweep runs on the world group, on the ranks of each
host (intra-node, all hosts at once) and on one rank per host (inter-node, all local ranks at once, so
each gets its share of the NICs, as data-parallel groups do).

Then the interference benchmark: an fp32 matmul loop and an all-reduce run alone, then started together
on every rank (see :class:`simddp.profile.InterferenceCase`).

Rank 0 prints progress and rewrites ``--out`` after every measurement; a failure or a hung rank keeps what
was measured (``"complete": false``, exit status 3).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from simddp.cli import positive_int
from simddp.profile import (
    MEASUREMENT_VERSION,
    CommCase,
    CommMeasurements,
    InterferenceCase,
    timing_stats,
)
from simddp.units import KiB, MiB
from simddp_calibration.common import (
    Collector,
    CollectorError,
    Dist,
    Progress,
    add_common_args,
    check_out,
    exit_worker,
    finished,
    one_line,
    run_info,
    set_threads,
    usage_error,
    utc_now,
)

OPS = ("all-reduce", "reduce-scatter", "all-gather", "broadcast")
DEFAULT_SIZES = [KiB * 2**k for k in range(19)]  # 1 KiB .. 256 MiB
DEFAULT_INTERFERENCE_SIZES = [1 * MiB, 4 * MiB, 16 * MiB]
#: Bytes of timed traffic per measurement that set the default number of repeats (min 5, max 30).
REPEAT_BUDGET_BYTES = 512 * MiB
#: Bytes per timed repeat that set the default number of back-to-back ops in it (min 1, max 10).
ITERS_BUDGET_BYTES = 8 * MiB


def parse_sizes(text: str) -> list[int]:
    """'1K,64K,1M' or '1K:256M' (powers of two between the ends) -> bytes."""

    def one(tok: str) -> int:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*", tok, flags=re.IGNORECASE)
        if not m:
            raise CollectorError(f"--sizes: {tok!r} is not a size such as 4096, 64K, 1M")
        value = int(float(m.group(1)) * {"": 1, "K": KiB, "M": MiB, "G": 1024 * MiB}[m.group(2).upper()])
        if value <= 0:
            raise CollectorError(f"--sizes: {tok!r} must be > 0")
        return value

    if ":" in text:
        lo, hi = (one(t) for t in text.split(":", 1))
        if lo > hi:  # 4K:1K measured nothing and wrote a "complete" file of no cases
            raise CollectorError(f"--sizes {text!r}: a range runs from the smaller size to the larger (1K:256M)")
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= 2
        return out
    sizes = sorted({one(t) for t in text.split(",") if t.strip()})
    if not sizes:  # '' ran the whole default sweep (a minute here, far longer on a cluster)
        raise CollectorError(f"--sizes {text!r}: no size given (4096, 64K, 1M, or a range 1K:256M)")
    return sizes


def default_repeats(size_bytes: int) -> int:
    return max(5, min(30, REPEAT_BUDGET_BYTES // max(size_bytes, 1)))


class Communicator:
    """A process group this rank belongs to, and what it spans."""

    def __init__(self, name: str, handle: Any, ranks: Sequence[int], num_nodes: int) -> None:
        self.name, self.handle, self.ranks, self.num_nodes = name, handle, list(ranks), num_nodes

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def tier(self) -> str:
        return "inter" if self.num_nodes > 1 else "intra"


def communicators(d: Dist) -> list[Communicator]:
    """World; on several hosts also each host's ranks and one rank per host (every rank calls new_group)."""
    world = Communicator("world", None, range(d.world_size), d.num_nodes)
    if d.num_nodes == 1:
        return [world]
    hosts = list(dict.fromkeys(d.hosts))
    by_host = [[r for r, h in enumerate(d.hosts) if h == host] for host in hosts]
    mine_intra = mine_inter = None
    for ranks in by_host:
        g = dist.new_group(ranks)
        if d.rank in ranks:
            mine_intra = Communicator("intra-node", g, ranks, 1)
    for local in range(d.ranks_per_node):
        ranks = [host_ranks[local] for host_ranks in by_host]
        g = dist.new_group(ranks)
        if d.rank in ranks:
            mine_inter = Communicator("inter-node", g, ranks, d.num_nodes)
    out = [world]
    if d.ranks_per_node > 1 and mine_intra is not None:
        out.append(mine_intra)
    if mine_inter is not None:
        out.append(mine_inter)
    return out


def make_op(op: str, size_bytes: int, comm: Communicator, device: torch.device) -> tuple[Callable[..., Any], int]:
    """A closure running ``op`` once on buffers of ``size_bytes`` (rounded to whole fp32 per rank)."""
    n = comm.size
    numel = max(n, (size_bytes // 4) // n * n)
    g = comm.handle
    full = torch.ones(numel, dtype=torch.float32, device=device)
    shard = torch.ones(numel // n, dtype=torch.float32, device=device)
    src = comm.ranks[0]
    if op == "all-reduce":
        def run(async_op: bool = False) -> Any:
            return dist.all_reduce(full, group=g, async_op=async_op)
    elif op == "reduce-scatter":
        def run(async_op: bool = False) -> Any:
            return dist.reduce_scatter_tensor(shard, full, group=g, async_op=async_op)
    elif op == "all-gather":
        def run(async_op: bool = False) -> Any:
            return dist.all_gather_into_tensor(full, shard, group=g, async_op=async_op)
    elif op == "broadcast":
        def run(async_op: bool = False) -> Any:
            return dist.broadcast(full, src=src, group=g, async_op=async_op)
    else:
        raise CollectorError(f"unknown op {op!r}")
    return run, numel * 4


def default_iters(size_bytes: int) -> int:
    """Back-to-back ops per timed repeat: enough to reach ~8 MiB of traffic, 1 to 10."""
    return max(1, min(10, ITERS_BUDGET_BYTES // max(size_bytes, 1)))


def time_op(d: Dist, run: Callable[..., Any], warmup: int, repeats: int, beat: Callable[[str], None],
            what: str, iters: int = 1) -> list[float]:
    """Per-op time of each repeat, slowest rank (all communicators run at once).

    A repeat is a barrier, then ``iters`` ops back to back timed together (nccl-tests' method), divided
    by ``iters``: DDP issues its bucket all-reduces back to back too, and an op launched into an idle
    machine right after a barrier is not what a training step sees (on a small CPU machine isolated ops
    are up to 2x faster than a stream of them).
    """
    for _ in range(warmup):
        run()
    d.sync()
    local = []
    for i in range(repeats):
        d.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            run()
        d.sync()
        local.append((time.perf_counter() - t0) / iters)
        beat(f"{what}, repeat {i + 1}/{repeats}")
    return d.max_over_ranks(local)


# ----------------------------------------------------------------------------------- interference
def interference_case(d: Dist, size_bytes: int, repeats: int, matmul_n: int, beat: Callable[[str], None],
                      ) -> InterferenceCase:
    """Matmul loop alone, all-reduce alone, then both started together; interleaved, medians."""
    world = Communicator("world", None, range(d.world_size), d.num_nodes)
    run, size_bytes = make_op("all-reduce", size_bytes, world, d.device)
    a = torch.randn(matmul_n, matmul_n, device=d.device)
    b = torch.randn(matmul_n, matmul_n, device=d.device)
    c = torch.empty_like(a)

    def chunk() -> None:
        torch.mm(a, b, out=c)
        d.sync()

    for _ in range(3):
        run()
        chunk()
    # Chunk time and comm time decide how many chunks cover the collective about three times over.
    t0 = time.perf_counter()
    for _ in range(10):
        chunk()
    chunk_s = (time.perf_counter() - t0) / 10
    comm_s = statistics.median(time_op(d, run, 1, 3, beat, "interference probe"))
    num_chunks = int(d.max_over_ranks([max(5.0, 3 * comm_s / max(chunk_s, 1e-7))])[0])

    def compute() -> None:
        for _ in range(num_chunks):
            chunk()

    alone_compute, alone_comm, both, comm_in_both = [], [], [], []
    for i in range(repeats):
        d.barrier()
        t0 = time.perf_counter()
        compute()
        alone_compute.append(time.perf_counter() - t0)
        d.barrier()
        t0 = time.perf_counter()
        run()
        d.sync()
        alone_comm.append(time.perf_counter() - t0)
        d.barrier()
        t0 = time.perf_counter()
        work = run(async_op=True)
        done = None
        for _ in range(num_chunks):
            chunk()
            if done is None and work.is_completed():
                done = time.perf_counter() - t0
        work.wait()
        d.sync()
        end = time.perf_counter() - t0
        both.append(end)
        comm_in_both.append(done if done is not None else end)
        beat(f"interference {size_bytes} B, repeat {i + 1}/{repeats}")
    slowest = [d.max_over_ranks(x) for x in (alone_compute, alone_comm, both, comm_in_both)]
    med = [statistics.median(x) for x in slowest]
    lost = [(b - x) / c for x, c, b in zip(slowest[0], slowest[1], slowest[2], strict=True) if c > 0]
    return InterferenceCase(
        size_bytes=size_bytes,
        compute_alone_s=med[0],
        comm_alone_s=med[1],
        both_s=med[2],
        comm_in_both_s=med[3],
        repeats=repeats,
        lost_fractions=lost,
    )


# ------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun ... -m simddp_calibration.collectives",
        description="Time all-reduce, reduce-scatter, all-gather and broadcast over message sizes.",
    )
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo on CPU, nccl on GPUs")
    p.add_argument("--sizes", default=None,
                   help="sizes: '1K,64K,1M' or a power-of-two range '1K:256M' (default 1K:256M)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--interference-sizes", default=None,
                   help="all-reduce sizes of the interference benchmark (default 1M,4M,16M; 'none' skips it)")
    p.add_argument("--iters", type=positive_int, default=None,
                   help="back-to-back ops per timed repeat (default: ~8 MiB of traffic, 1 to 10)")
    p.add_argument("--matmul-n", type=positive_int, default=None,
                   help="matmul size of the interference compute (default 256 on CPU, 4096 on GPU)")
    add_common_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        set_threads(args.threads)
        sizes = parse_sizes(args.sizes) if args.sizes is not None else DEFAULT_SIZES
        ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        bad = [o for o in ops if o not in OPS]
        if bad:
            raise CollectorError(f"--ops: unknown {', '.join(bad)}; valid: {', '.join(OPS)}")
        if args.interference_sizes == "none":
            isizes: list[int] = []
        else:
            isizes = parse_sizes(args.interference_sizes) if args.interference_sizes is not None else [
                s for s in DEFAULT_INTERFERENCE_SIZES if s <= max(sizes)] or [max(sizes)]
        d = Dist(args.backend, args.timeout, pin=args.pin)
        if d.world_size < 2:
            raise CollectorError("needs at least 2 ranks; launch with simddp calibrate collect comm --nproc-per-node N",
                                 quiet=not d.is_main)
        check_out(d, args.out)
    except CollectorError as err:
        return usage_error("simddp_calibration.collectives", err)
    started = utc_now()
    info = run_info(d, started)
    cases: list[CommCase] = []
    interference: list[InterferenceCase] = []
    out: Path = args.out

    def snapshot(error: str | None, complete: bool) -> CommMeasurements:
        return CommMeasurements(kind="simddp-comm", version=MEASUREMENT_VERSION, complete=complete, error=error,
                                run=finished(info), cases=cases, interference=interference)

    collector = Collector(d, out, snapshot, args.timeout)
    comms = communicators(d)
    progress = Progress(d.is_main, total=len(comms) * len(ops) * len(sizes) + len(isizes))
    progress.note(f"simddp_calibration.collectives: {d.world_size} ranks on {d.num_nodes} host(s), {d.backend}, "
                  f"{info.device_names[0]}, {info.num_threads} thread(s) per rank -> {out}")
    try:
        for comm in comms:
            for op in ops:
                for size in sizes:
                    run, actual = make_op(op, size, comm, d.device)
                    repeats = args.repeats or default_repeats(actual)
                    what = f"{op} {actual} B on {comm.name}"
                    collector.beat(what)
                    iters = args.iters or default_iters(actual)
                    times = time_op(d, run, args.warmup if args.warmup is not None else 2, repeats,
                                    collector.beat, what, iters)
                    stats = timing_stats(times)
                    cases.append(CommCase(op=op, group=comm.name, tier=comm.tier, num_ranks=comm.size,  # type: ignore[arg-type]
                                          num_nodes=comm.num_nodes, size_bytes=actual, iters=iters, stats=stats))
                    collector.save_partial()
                    algbw = actual / stats.median_s / 1e9 if stats.median_s > 0 else 0.0
                    progress(f"{comm.name:<10} {op:<14} {actual:>11} B  median {stats.median_s * 1e3:9.3f} ms  "
                             f"spread {stats.spread:5.1%}  algbw {algbw:7.3f} GB/s")
                    del run
        matmul_n = args.matmul_n or (4096 if d.device.type == "cuda" else 256)
        for size in isizes:
            collector.beat(f"interference {size} B")
            case = interference_case(d, size, args.repeats or 15, matmul_n, collector.beat)
            interference.append(case)
            collector.save_partial()
            progress(f"interference {case.size_bytes:>11} B  compute {case.compute_alone_s * 1e3:.2f} ms, "
                     f"comm {case.comm_alone_s * 1e3:.2f} ms, both {case.both_s * 1e3:.2f} ms -> compute loses "
                     f"{case.lost_fraction:.0%} of the collective's time")
        d.barrier()
        collector.finish()
        progress.note(f"simddp_calibration.collectives: wrote {out}")
        d.close()
        return 0
    except Exception as err:  # any failure: keep what was measured, say why in one line
        # No destroy_process_group: with a dead peer it may block; the process exit cleans up.
        return collector.fail(one_line(err))


if __name__ == "__main__":
    exit_worker(main())  # not SystemExit: see exit_worker
