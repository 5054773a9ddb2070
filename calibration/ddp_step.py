"""Real DDP step times, for validation only: ``torchrun ... -m simddp_calibration.ddp_step --model FILE.py:factory
--bucket-cap-mb 1 5 25 --out ddp.json``.

One DistributedDataParallel copy of the model per bucket cap (DDP's hooks would clash on shared
parameters). A step is what ``simddp_calibration.compute`` times: zero_grad, forward, the scalar loss, backward
(with DDP's overlapped all-reduces) and ``optimizer.step()``, after a barrier; its time is the slowest
rank's. The caps are measured in rounds, a few steps of each cap per round, so that a slow spell of a
shared machine hits every cap alike; the median over all steps of a cap is its measured time.

With ``--knobs``, the same steps are also measured with torch's unused-parameter options, at the first cap:
plain, ``find_unused_parameters``, ``static_graph`` and both, interleaved round by round (validation of
simddp's model of them; the per-node cost of the graph search is what the compute collector fits).

These numbers are never used to fit anything: ``simddp calibrate validate`` compares them with the
simulator's prediction from the profile.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from simddp.cli import positive_int
from simddp.config import MAX_BUCKET_CAP_MB
from simddp.profile import MEASUREMENT_VERSION, DDPCase, DDPKnobCase, DDPMeasurements, timing_stats
from simddp_calibration.common import (
    Collector,
    CollectorError,
    Dist,
    Progress,
    add_common_args,
    build_model,
    check_out,
    count_autograd_nodes,
    exit_worker,
    finished,
    make_optimizer,
    model_file,
    one_line,
    run_info,
    scalar_loss,
    set_threads,
    usage_error,
    utc_now,
)


def parse_cap(text: str) -> float | None:
    if text.lower() in ("default", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise CollectorError(f"--bucket-cap-mb {text!r}: expected a number of MiB or 'default'") from None
    if not 0 < value <= MAX_BUCKET_CAP_MB:  # inf passed here and ended mid-run in an OverflowError
        raise CollectorError(f"--bucket-cap-mb {text!r}: must be > 0 and at most {MAX_BUCKET_CAP_MB:,} (1 EiB)")
    return value


def bucket_sizes(ddp: DDP) -> list[int]:
    """Bucket sizes DDP rebuilt, in reduction order (bytes), from its logging data when available."""
    try:
        data = ddp._get_ddp_logging_data()
        sizes = data.get("rebuilt_bucket_sizes")
        if isinstance(sizes, str):
            return [int(s) for s in sizes.split(",") if s.strip()]
        return [int(s) for s in sizes or []]
    except Exception:  # private API: best effort
        return []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchrun ... -m simddp_calibration.ddp_step",
                                description="Time real DDP steps at one or more bucket caps (validation).")
    p.add_argument("--model", required=True, help="FILE.py:factory returning (model, example_inputs)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl on GPUs, else gloo")
    p.add_argument("--bucket-cap-mb", nargs="+", default=["default"],
                   help="one or more caps in MiB ('default' = torch's 25 MiB with a 1 MiB first bucket)")
    p.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd")
    p.add_argument("--rounds", type=positive_int, default=None, help="rounds over the caps (default 8)")
    p.add_argument("--gradient-as-bucket-view", action="store_true", help="pass gradient_as_bucket_view=True")
    p.add_argument("--knobs", action="store_true",
                   help="also measure find_unused_parameters and static_graph at the first cap")
    add_common_args(p, default_timeout_s=600.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        set_threads(args.threads)
        caps = [parse_cap(c) for c in args.bucket_cap_mb]
        if len(set(caps)) < len(caps):  # each was measured and scored twice, counted twice in the MAPE
            raise CollectorError(f"--bucket-cap-mb {' '.join(args.bucket_cap_mb)}: a cap is listed twice")
        backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        d = Dist(backend, args.timeout, pin=args.pin)
        if d.world_size < 2:
            raise CollectorError("needs at least 2 ranks; launch with simddp calibrate collect ddp --nproc-per-node N",
                                 quiet=not d.is_main)
        check_out(d, args.out, model_file(args.model))
        base, inputs = build_model(args.model, d.device)
        base.train()
    except CollectorError as err:
        return usage_error("simddp_calibration.ddp_step", err)
    rounds = args.rounds if args.rounds is not None else 8
    per_round = args.repeats or 3
    warmup = args.warmup if args.warmup is not None else 3
    info = run_info(d, utc_now())
    out: Path = args.out
    times: dict[int, list[float]] = {k: [] for k in range(len(caps))}
    sizes: dict[int, list[int]] = {k: [] for k in range(len(caps))}
    knob_times: dict[tuple[bool, bool], list[float]] = {k: [] for k in KNOBS} if args.knobs else {}
    nodes = count_autograd_nodes(base, inputs) if args.knobs else None

    def snapshot(error: str | None, complete: bool) -> DDPMeasurements:
        cases = [DDPCase(bucket_cap_mb=cap, num_buckets=len(sizes[k]), bucket_sizes_bytes=sizes[k],
                         stats=timing_stats(times[k])) for k, cap in enumerate(caps) if times[k]]
        knobs = [DDPKnobCase(find_unused_parameters=fu, static_graph=sg, bucket_cap_mb=caps[0],
                             stats=timing_stats(ts)) for (fu, sg), ts in knob_times.items() if ts]
        return DDPMeasurements(kind="simddp-ddp", version=MEASUREMENT_VERSION, complete=complete, error=error,
                               run=finished(info), model=args.model, optimizer=args.optimizer,
                               micro_batch_size=_batch(inputs), cases=cases, knob_cases=knobs,
                               num_autograd_nodes=nodes)

    collector = Collector(d, out, snapshot, args.timeout, model_file(args.model))
    progress = Progress(d.is_main, total=rounds)
    progress.note(f"simddp_calibration.ddp_step: {args.model}, {d.world_size} ranks, {d.backend}, caps "
                  f"{', '.join('default' if c is None else f'{c:g}' for c in caps)} MiB, {rounds} rounds of "
                  f"{per_round} steps -> {out}")
    try:
        wrapped, optims = [], []
        for cap in caps:
            model = DDP(copy.deepcopy(base), bucket_cap_mb=cap,
                        gradient_as_bucket_view=args.gradient_as_bucket_view)
            opt = make_optimizer(args.optimizer, list(model.parameters()))
            for _ in range(warmup):  # buckets are rebuilt after the first iteration
                step(model, inputs, opt)
            wrapped.append(model)
            optims.append(opt)
            collector.beat(f"warm-up cap {cap}")
        for r in range(rounds):
            for k, (model, opt) in enumerate(zip(wrapped, optims, strict=True)):
                local = []
                for _ in range(per_round):
                    d.barrier()
                    t0 = time.perf_counter()
                    step(model, inputs, opt)
                    d.sync()
                    local.append(time.perf_counter() - t0)
                times[k].extend(d.max_over_ranks(local))
                # DDP logs its rebuilt buckets at sampled iterations: refresh until they show up.
                sizes[k] = bucket_sizes(model)
                collector.beat(f"round {r + 1}, cap {caps[k]}")
            collector.save_partial()
            medians = ", ".join(
                f"{'default' if c is None else f'{c:g}'}: {sorted(times[k])[len(times[k]) // 2] * 1e3:.1f}"
                for k, c in enumerate(caps))
            progress(f"round {r + 1}: median step (ms) by cap {medians}")
        if args.knobs:
            measure_knobs(base, inputs, caps[0], args, d, rounds, per_round, warmup, knob_times, collector, progress)
        d.barrier()
        collector.finish()
        progress.note(f"simddp_calibration.ddp_step: wrote {out}")
        d.close()
        return 0
    except Exception as err:  # any failure: keep what was measured, say why in one line
        return collector.fail(one_line(err))


#: (find_unused_parameters, static_graph) settings measured with --knobs; plain first.
KNOBS = ((False, False), (True, False), (False, True), (True, True))


def measure_knobs(base: torch.nn.Module, inputs: Sequence[Any], cap: float | None, args: argparse.Namespace,
                  d: Dist, rounds: int, per_round: int, warmup: int, times: dict[tuple[bool, bool], list[float]],
                  collector: Collector, progress: Progress) -> None:
    """DDP steps under each unused-parameter setting, interleaved by round (the order alternates, so that a
    slow spell of the machine hits every setting alike)."""
    import warnings

    models, optims = {}, {}
    with warnings.catch_warnings():  # torch warns that static_graph is experimental
        warnings.simplefilter("ignore")
        for fu, sg in KNOBS:
            models[(fu, sg)] = DDP(copy.deepcopy(base), bucket_cap_mb=cap, find_unused_parameters=fu,
                                   static_graph=sg, gradient_as_bucket_view=args.gradient_as_bucket_view)
            optims[(fu, sg)] = make_optimizer(args.optimizer, list(models[(fu, sg)].parameters()))
            for _ in range(warmup):
                step(models[(fu, sg)], inputs, optims[(fu, sg)])
    order = list(KNOBS)
    for r in range(rounds):
        for key in order if r % 2 else order[::-1]:
            local = []
            for _ in range(per_round):
                d.barrier()
                t0 = time.perf_counter()
                step(models[key], inputs, optims[key])
                d.sync()
                local.append(time.perf_counter() - t0)
            times[key].extend(d.max_over_ranks(local))
        collector.beat(f"knobs round {r + 1}")
        collector.save_partial()
    medians = ", ".join(f"{'unused' if fu else 'plain'}{'+static' if sg else ''} "
                        f"{sorted(ts)[len(ts) // 2] * 1e3:.2f}" for (fu, sg), ts in times.items())
    progress.note(f"simddp_calibration.ddp_step: knobs measured, median step (ms): {medians}")


def step(model: torch.nn.Module, inputs: Sequence[Any], opt: torch.optim.Optimizer) -> None:
    opt.zero_grad(set_to_none=False)
    scalar_loss(model(*inputs)).backward()
    opt.step()


def _batch(inputs: Sequence[Any]) -> int:
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    return 1


if __name__ == "__main__":
    exit_worker(main())  # not SystemExit: see exit_worker
