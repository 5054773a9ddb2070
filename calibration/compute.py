"""Per-layer compute times of a model: ``simddp calibrate collect compute --model FILE.py:factory --out compute.json``.

(``simddp calibrate collect compute`` runs ``torchrun ... -m simddp_calibration.compute``.)

The factory returns ``(model, example_inputs)``. One training step is zero_grad, forward, a scalar loss
(:func:`simddp_calibration.common.scalar_loss`), backward and ``optimizer.step()``, as DDP runs it.

What is recorded:

* every trainable parameter (name, numel, dtype, owning module) and the gradient-ready order, from
  ``register_post_accumulate_grad_hook`` (the moment DDP's Reducer sees the gradient);
* per-layer times. A *layer* is a run of parameters, in ready order, owned by one module. Its backward
  time is the gap between the previous layer's gradients being ready (or backward starting) and its own;
  what follows the last gradient (the input's gradient) is a parameter-free layer. Its forward time is
  the owning module's own forward (forward pre/post hooks, children that own parameters excluded); the
  rest of forward (functional ops, the loss) goes to the parameter-free layer. Times come from CUDA
  events on GPU and ``perf_counter`` on CPU;
* hooked iterations measure the split; clean iterations (no Python hooks) measure the totals, and the
  per-layer times are scaled to the clean totals, so hook overhead does not count;
* the optimizer step, the rest of the step (zero_grad, Python between phases) and, on a one-rank gloo
  group, the extra time DDP's Reducer spends without communicating (bucket copies, hooks);
* measured matmul and copy rates and the device memory, which stand in for a spec sheet.

Under ``torchrun`` every rank measures at the same time (on a CPU the ranks share cores and memory
bandwidth as in training). The totals of an iteration are those of its slowest rank, which gates every
all-reduce of a DDP step; the per-layer split is the mean over ranks. Medians over iterations are what
the profile uses.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from simddp.profile import (
    MEASUREMENT_VERSION,
    ComputeMeasurements,
    MeasuredLayer,
    MeasuredParameter,
    PeakRates,
    TimingStats,
    timing_stats,
)
from simddp.units import MiB
from simddp_calibration.common import (
    Collector,
    CollectorError,
    Dist,
    Progress,
    Timer,
    add_common_args,
    build_model,
    check_out,
    count_autograd_nodes,
    dtype_name,
    exit_worker,
    finished,
    make_optimizer,
    model_file,
    one_line,
    run_info,
    scalar_loss,
    set_threads,
    trainable_parameters,
    usage_error,
    utc_now,
)

REST = "(other ops)"  # the parameter-free layer: functional ops, loss, input gradient


@dataclass
class Grouping:
    """Parameters (definition order), ready order, and layers as runs of one owner in ready order."""

    names: list[str]
    owners: list[str]
    params: list[torch.nn.Parameter]
    ready_order: list[int]
    groups: list[list[int]]  # in ready order
    group_owner: list[str]


def grad_ready_order(model: torch.nn.Module, inputs: Sequence[Any]) -> tuple[list[tuple[str, str, Any]], list[int]]:
    """Trainable parameters and the order their gradients become ready in one backward."""
    table = trainable_parameters(model)
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, i=i: order.append(i))
               for i, (_, _, p) in enumerate(table)]
    try:
        model.zero_grad(set_to_none=True)
        scalar_loss(model(*inputs)).backward()
    finally:
        for h in handles:
            h.remove()
    model.zero_grad(set_to_none=True)
    seen: set[int] = set()
    order = [i for i in order if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]
    # Parameters whose gradient never arrived (unused in this forward) go last, as DDP would find them.
    order += [i for i in range(len(table)) if i not in seen]
    return table, order


def make_grouping(model: torch.nn.Module, inputs: Sequence[Any]) -> Grouping:
    table, order = grad_ready_order(model, inputs)
    groups: list[list[int]] = []
    owners: list[str] = []
    for i in order:
        owner = table[i][1]
        if groups and owners[-1] == owner:
            groups[-1].append(i)
        else:
            groups.append([i])
            owners.append(owner)
    return Grouping([n for n, _, _ in table], [o for _, o, _ in table], [p for _, _, p in table], order,
                    groups, owners)


class Hooks:
    """Forward pre/post hooks on the owning modules and grad-ready hooks on the parameters."""

    def __init__(self, model: torch.nn.Module, g: Grouping, timer: Timer) -> None:
        self.timer, self.g = timer, g
        owners = set(g.owners)
        self.fwd_marks: list[tuple[str, str, Any]] = []  # (module, "pre"/"post", mark)
        self.ready_marks: dict[int, Any] = {}
        self.handles: list[Any] = []
        for name, module in model.named_modules():
            if name in owners:
                self.handles.append(module.register_forward_pre_hook(
                    lambda _m, _a, name=name: self.fwd_marks.append((name, "pre", self.timer.mark()))))
                self.handles.append(module.register_forward_hook(
                    lambda _m, _a, _o, name=name: self.fwd_marks.append((name, "post", self.timer.mark()))))
        for i, p in enumerate(g.params):
            self.handles.append(p.register_post_accumulate_grad_hook(
                lambda _p, i=i: self.ready_marks.__setitem__(i, self.timer.mark())))

    def reset(self) -> None:
        self.fwd_marks.clear()
        self.ready_marks.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def forward_exclusive_s(self) -> dict[str, float]:
        """Each owning module's own forward time (children that own parameters excluded), summed over calls."""
        out: dict[str, float] = {}
        stack: list[tuple[str, Any, float]] = []  # (module, start mark, time of children)
        for name, kind, mark in self.fwd_marks:
            if kind == "pre":
                stack.append((name, mark, 0.0))
                continue
            while stack and stack[-1][0] != name:  # a module whose post hook never ran (exception)
                stack.pop()
            if not stack:
                continue
            _, start, children = stack.pop()
            total = self.timer.elapsed_s(start, mark)
            out[name] = out.get(name, 0.0) + max(0.0, total - children)
            if stack:
                parent = stack[-1]
                stack[-1] = (parent[0], parent[1], parent[2] + total)
        return out

    def ready_offsets_s(self, bwd_start: Any) -> dict[int, float]:
        return {i: self.timer.elapsed_s(bwd_start, m) for i, m in self.ready_marks.items()}


def one_step(model: torch.nn.Module, inputs: Sequence[Any], opt: torch.optim.Optimizer, timer: Timer
             ) -> tuple[Any, ...]:
    """zero_grad, forward + loss, backward, optimizer step; returns the timer marks between phases."""
    t0 = timer.mark()
    opt.zero_grad(set_to_none=False)
    t1 = timer.mark()
    loss = scalar_loss(model(*inputs))
    t2 = timer.mark()
    loss.backward()
    t3 = timer.mark()
    opt.step()
    t4 = timer.mark()
    return t0, t1, t2, t3, t4


def measure_peak(device: torch.device, ranks_per_node: int, d: Dist) -> PeakRates:
    """fp32 matmul and copy rates (all ranks at once, as in training), and device memory per rank."""
    timer = Timer(device)
    n = 1024 if device.type == "cpu" else 8192
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    for _ in range(2):
        a @ b
    d.barrier()
    samples = []
    for _ in range(5):
        s = timer.mark()
        a @ b
        samples.append(timer.elapsed_s(s, timer.mark()))
    matmul = 2 * n**3 / statistics.median(samples)
    x = torch.empty(64 * MiB // 4, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    d.barrier()
    samples = []
    for _ in range(5):
        s = timer.mark()
        y.copy_(x)
        samples.append(timer.elapsed_s(s, timer.mark()))
    copy_rate = 2 * x.numel() * 4 / statistics.median(samples)
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // ranks_per_node
    rates = d.mean_over_ranks([matmul, copy_rate])
    return PeakRates(matmul_flop_per_s=rates[0], copy_bytes_per_s=rates[1], memory_bytes=int(memory))


def ddp_overhead_s(model: torch.nn.Module, inputs: Sequence[Any], optimizer: str, iterations: int,
                   d: Dist) -> tuple[list[float], list[float]] | None:
    """Per-iteration slowest rank's (DDP step on a one-rank gloo group) - (plain step), interleaved; CPU only.

    A one-rank all-reduce moves no data, so the difference is the Reducer's own work: copying gradients
    into buckets and back, its hooks and its bookkeeping. Needs gloo (no second GPU is needed on CPU).
    Also returns DDP's search for unused parameters: a forward with ``find_unused_parameters`` minus one
    without, paired, each rank's own (averaged over ranks: the search is host work of one rank).
    """
    if d.device.type != "cpu" or not dist.is_gloo_available():
        return None
    from torch.nn.parallel import DistributedDataParallel as DDP

    timer = Timer(d.device)
    with tempfile.TemporaryDirectory() as tmp:
        if d.active:
            # One singleton group per rank (every rank must create every group).
            singles = [dist.new_group([r], backend="gloo") for r in range(d.world_size)]
            pg = singles[d.rank]
        else:
            dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0,
                                    world_size=1)
            pg = None
        plain = copy.deepcopy(model)
        wrapped = DDP(copy.deepcopy(model), process_group=pg)
        opt_plain = make_optimizer(optimizer, list(plain.parameters()))
        opt_ddp = make_optimizer(optimizer, list(wrapped.parameters()))
        for _ in range(3):  # DDP rebuilds its buckets after the first iteration
            one_step(wrapped, inputs, opt_ddp, timer)
            one_step(plain, inputs, opt_plain, timer)
        diffs = []
        for _ in range(iterations):
            d.barrier()
            m = one_step(plain, inputs, opt_plain, timer)
            t_plain = timer.elapsed_s(m[0], m[-1])
            d.barrier()
            m = one_step(wrapped, inputs, opt_ddp, timer)
            t_ddp = timer.elapsed_s(m[0], m[-1])
            slowest = d.max_over_ranks([t_plain, t_ddp])  # as for the clean steps: the slowest rank's
            diffs.append(slowest[1] - slowest[0])
        searches = graph_search_s(wrapped, DDP(copy.deepcopy(model), process_group=pg, find_unused_parameters=True),
                                  inputs, iterations, d)
        del wrapped
        if not d.active:
            dist.destroy_process_group()
    return diffs, searches


def graph_search_s(plain: torch.nn.Module, searching: torch.nn.Module, inputs: Sequence[Any], iterations: int,
                   d: Dist) -> list[float]:
    """(DDP forward with find_unused_parameters) - (DDP forward without), paired and in alternating order."""
    for _ in range(3):
        for m in (plain, searching):
            scalar_loss(m(*inputs)).backward()
    local = []
    for i in range(iterations):
        fwd = {}
        for key, m in (("plain", plain), ("search", searching)) if i % 2 else (("search", searching),
                                                                                ("plain", plain)):
            d.sync()
            t0 = time.perf_counter()
            out = m(*inputs)
            d.sync()
            fwd[key] = time.perf_counter() - t0
            scalar_loss(out).backward()  # DDP expects the backward of the forward it prepared
        local.append(fwd["search"] - fwd["plain"])
    return d.mean_over_ranks(local)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m simddp_calibration.compute",
        description="Per-layer forward/backward, optimizer and host times of a model (run under torchrun on "
        "CPUs so that ranks share the machine as in training).",
    )
    p.add_argument("--model", required=True, help="FILE.py:factory returning (model, example_inputs)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd")
    p.add_argument("--no-ddp-overhead", action="store_true", help="skip the one-rank DDP overhead measurement")
    add_common_args(p, default_timeout_s=600.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        set_threads(args.threads)
        want_cuda = args.device == "cuda" or (args.device is None and torch.cuda.is_available())
        if want_cuda and not torch.cuda.is_available():
            raise CollectorError("--device cuda: no CUDA device visible")
        d = Dist("nccl" if want_cuda else "gloo", args.timeout, pin=args.pin)
        check_out(d, args.out, model_file(args.model))
        model, inputs = build_model(args.model, d.device)
        model.train()
        g = make_grouping(model, inputs)
        opt = make_optimizer(args.optimizer, g.params)
    except CollectorError as err:
        return usage_error("simddp_calibration.compute", err)
    except RuntimeError as err:  # e.g. the model's forward or backward fails on these inputs
        print(f"simddp_calibration.compute: error: {args.model}: {one_line(err)}", file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else 3
    repeats = args.repeats or 20
    info = run_info(d, utc_now())
    timer = Timer(d.device)
    result: dict[str, Any] = {}
    out: Path = args.out

    def snapshot(error: str | None, complete: bool) -> ComputeMeasurements:
        empty = timing_stats([0.0])
        return ComputeMeasurements(
            kind="simddp-compute", version=MEASUREMENT_VERSION, complete=complete, error=error, run=finished(info),
            model=args.model, optimizer=args.optimizer, micro_batch_size=_batch(inputs),
            input_shapes=[list(x.shape) for x in inputs if isinstance(x, torch.Tensor)],
            parameters=[MeasuredParameter(name=n, numel=p.numel(), dtype=dtype_name(p.dtype), module=o)
                        for n, o, p in zip(g.names, g.owners, g.params, strict=True)],
            grad_ready_order=g.ready_order, layers=result.get("layers", []),
            forward=result.get("forward", empty), backward=result.get("backward", empty),
            optimizer_step=result.get("optimizer", empty), host=result.get("host", empty),
            step=result.get("step", empty), ddp_overhead=result.get("ddp_overhead"), peak=result.get("peak"),
            rank_step_times_s=result.get("rank_steps", []), num_autograd_nodes=result.get("nodes"),
            graph_search=result.get("graph_search"),
        )

    collector = Collector(d, out, snapshot, args.timeout, model_file(args.model))
    progress = Progress(d.is_main, total=4)
    progress.note(f"simddp_calibration.compute: {args.model} on {info.device_names[0]}, {d.world_size} rank(s) "
                  f"at once, {info.num_threads} thread(s) each, {len(g.params)} parameters in {len(g.groups)} "
                  f"layers -> {out}")
    try:
        for _ in range(warmup):
            one_step(model, inputs, opt, timer)
        # Clean iterations: totals without Python hooks.
        clean: list[list[float]] = []
        mine: list[float] = []
        for i in range(repeats):
            d.barrier()
            t0, t1, t2, t3, t4 = one_step(model, inputs, opt, timer)
            fwd, bwd, opt_s = timer.elapsed_s(t1, t2), timer.elapsed_s(t2, t3), timer.elapsed_s(t3, t4)
            step = timer.elapsed_s(t0, t4)
            mine.append(step)
            # The slowest rank gates every all-reduce of a DDP step: keep its iteration.
            clean.append(d.row_of_slowest_rank([fwd, bwd, opt_s, step - fwd - bwd - opt_s, step]))
            collector.beat(f"clean iteration {i + 1}")
        cols = list(zip(*clean, strict=True))
        for key, col in zip(("forward", "backward", "optimizer", "host", "step"), cols, strict=True):
            result[key] = timing_stats(col)
        result["rank_steps"] = d.all_gather_object(mine)  # each rank's own steps: the jitter fit's data
        result["nodes"] = count_autograd_nodes(model, inputs)
        collector.save_partial()
        progress(f"step {result['step'].median_s * 1e3:.2f} ms: forward {result['forward'].median_s * 1e3:.2f}, "
                 f"backward {result['backward'].median_s * 1e3:.2f}, optimizer "
                 f"{result['optimizer'].median_s * 1e3:.2f}, rest {result['host'].median_s * 1e3:.2f} ms")

        result["layers"] = hooked_layers(model, inputs, opt, g, timer, d, repeats, warmup, collector, result)
        collector.save_partial()
        progress(f"per-layer times of {len(result['layers'])} layers")

        if not args.no_ddp_overhead:
            measured = ddp_overhead_s(model, inputs, args.optimizer, repeats, d)
            if measured is not None:
                diffs, searches = measured
                result["ddp_overhead"] = timing_stats(diffs)
                result["graph_search"] = timing_stats(searches)
                progress(f"DDP overhead without communication {result['ddp_overhead'].median_s * 1e3:.2f} ms; "
                         f"its unused-parameter search {result['graph_search'].median_s * 1e6:.0f} us")
            else:
                progress("DDP overhead: not measured on this device")
        collector.beat("peak rates")
        result["peak"] = measure_peak(d.device, d.ranks_per_node, d)
        progress(f"matmul {result['peak'].matmul_flop_per_s / 1e9:.1f} GFLOP/s, copy "
                 f"{result['peak'].copy_bytes_per_s / 1e9:.1f} GB/s")
        d.barrier()
        collector.finish()
        progress.note(f"simddp_calibration.compute: wrote {out}")
        d.close()
        return 0
    except Exception as err:  # any failure: keep what was measured, say why in one line
        return collector.fail(one_line(err))


def hooked_layers(model: torch.nn.Module, inputs: Sequence[Any], opt: torch.optim.Optimizer, g: Grouping,
                  timer: Timer, d: Dist, repeats: int, warmup: int, collector: Collector,
                  clean: dict[str, TimingStats]) -> list[MeasuredLayer]:
    """Per-layer forward and backward times from hooked iterations, scaled to the clean totals."""
    hooks = Hooks(model, g, timer)
    rows: list[list[float]] = []
    try:
        for _ in range(max(1, warmup // 2)):
            hooks.reset()
            one_step(model, inputs, opt, timer)
        for i in range(repeats):
            hooks.reset()
            d.barrier()
            _, t1, t2, t3, _ = one_step(model, inputs, opt, timer)
            fwd_total, bwd_total = timer.elapsed_s(t1, t2), timer.elapsed_s(t2, t3)
            own = hooks.forward_exclusive_s()
            ready = hooks.ready_offsets_s(t2)
            fwd, bwd, last = [], [], 0.0
            seen_owner: set[str] = set()
            for group, owner in zip(g.groups, g.group_owner, strict=True):
                fwd.append(own.get(owner, 0.0) if owner not in seen_owner else 0.0)
                seen_owner.add(owner)
                t = max(ready.get(p, last) for p in group)
                bwd.append(max(0.0, t - last))
                last = max(last, t)
            rest_fwd = max(0.0, fwd_total - sum(fwd))
            rest_bwd = max(0.0, bwd_total - last)
            rows.append(d.mean_over_ranks([*fwd, rest_fwd, *bwd, rest_bwd, fwd_total, bwd_total]))
            collector.beat(f"hooked iteration {i + 1}")
    finally:
        hooks.remove()
    n = len(g.groups)
    cols = [list(c) for c in zip(*rows, strict=True)]
    fwd_cols, bwd_cols = cols[: n + 1], cols[n + 1 : 2 * n + 2]
    # Hooks cost Python time, and a shared machine drifts between the hooked and the clean iterations:
    # each layer gets its median share of the hooked forward (backward), renormalised, times the clean
    # median, so the layers add up to the clean forward (backward) exactly.
    fwd_s = _scaled(fwd_cols, cols[-2], clean["forward"].median_s)
    bwd_s = _scaled(bwd_cols, cols[-1], clean["backward"].median_s)
    layers = [MeasuredLayer(name=REST, param_indices=[], fwd=fwd_s[n], bwd=bwd_s[n])]
    # Forward order is the reverse of the ready order: the first layer ready in backward ran last.
    for k in reversed(range(n)):
        layers.append(MeasuredLayer(name=g.group_owner[k] or "(root)", param_indices=sorted(g.groups[k]),
                                    fwd=fwd_s[k], bwd=bwd_s[k]))
    return layers


def _scaled(layer_cols: list[list[float]], totals: list[float], clean_total_s: float) -> list[TimingStats]:
    """Per-layer times whose medians are the layer's median share of ``totals`` times ``clean_total_s``."""
    shares = [[v / t if t > 0 else 0.0 for v, t in zip(col, totals, strict=True)] for col in layer_cols]
    med = [statistics.median(s) for s in shares]
    norm = sum(med) or 1.0
    factor = clean_total_s / norm
    return [timing_stats([v * factor for v in s]) for s in shares]


def _batch(inputs: Sequence[Any]) -> int:
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    return 1


if __name__ == "__main__":
    exit_worker(main())  # not SystemExit: see exit_worker
