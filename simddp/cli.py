"""The ``simddp`` command: simulate, tails, run, knobs, buckets, collective, presets, memory, calibrate, app.

Every user error (bad scenario, preset, flag, file) prints one line ``simddp: error: ...`` and exits 2,
with no traceback. A result that fails its sanity checks (:mod:`simddp.sanity`) is a bug: one line
``simddp: internal error: ...`` and exit 70, never output (``SIMDDP_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from simddp import __version__, safeio, units
from simddp.config import Cluster, Scenario, ScenarioError, format_validation_error
from simddp.errors import INTERNAL_ERROR_EXIT, InternalError
from simddp.limits import SimulationTooLarge
from simddp.presets import CLUSTER_PRESETS, MODEL_PRESETS
from simddp.scenario_io import load_scenario, mark_modified, scenario_data
from simddp.zero import zero_rule

DEFAULT_SCENARIO = "default_scenario.yaml"


class UsageError(Exception):
    """A bad command-line value."""


def default_scenario_path() -> Path:
    return Path(str(resources.files("simddp").joinpath(DEFAULT_SCENARIO)))


def scenario_path(args: argparse.Namespace) -> str | Path:
    """The scenario file a command reads: its argument, or the embedded default where none is given (an empty
    one, ``simddp plan ''``, is refused: it read the default without a word)."""
    if args.scenario is not None and not str(args.scenario).strip():
        raise UsageError(f"scenario {str(args.scenario)!r}: empty path; give a scenario file, or none for the "
                         "embedded default")
    return args.scenario or default_scenario_path()


def scenario_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario file's keys with its ``--set`` ones, not yet validated (what :func:`_load` validates; ``plan``
    and ``sweep`` work from the keys themselves, as a preset or profile they set fills in under them)."""
    return mark_modified(scenario_data(scenario_path(args), args.set), args.set)


def _load(args: argparse.Namespace) -> Scenario:
    return load_scenario(scenario_path(args), args.set)


def _scenario_inputs(args: argparse.Namespace, scenario: Scenario | None = None) -> list[str]:
    """Files a scenario command reads: outputs must not replace them."""
    inputs = [str(args.scenario)] if args.scenario else []
    if scenario is not None and scenario.calibration:
        inputs.append(scenario.calibration)
    return inputs


def parse_size(text: str) -> int:
    """Bytes from '1048576', '256MiB' (binary), '256MB' (decimal) or '1Gbit' (:func:`units.parse_size`)."""
    try:
        value = units.parse_size(text)
    except ValueError as err:
        raise UsageError(f"--bytes {text!r}: {err}") from None
    if value <= 0:
        raise UsageError(f"--bytes {text!r}: must be > 0")
    from simddp.limits import MAX_MESSAGE_BYTES

    if value > MAX_MESSAGE_BYTES:
        raise UsageError(f"--bytes {safeio.short_repr(text)}: over the limit of 2^60 bytes (1 EiB)")
    return value


def _checked_number(text: str, kind: type, minimum: float, inclusive: bool) -> Any:
    try:
        if not text.isascii():  # int() reads other scripts' digits ('\u0663' is 3): a flag takes ASCII ones
            raise ValueError
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{safeio.short_repr(text)} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if not (value >= minimum if inclusive else value > minimum):
        raise argparse.ArgumentTypeError(f"{value} must be {'>=' if inclusive else '>'} {minimum}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer > 0 (the message names the value)."""
    return int(_checked_number(text, int, 0, inclusive=False))


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return int(_checked_number(text, int, 0, inclusive=True))


def seed_number(text: str) -> int:
    """argparse type: a seed, an integer 0..2^53 (what ``variability.seed`` takes, so that a seed printed by
    `simddp tails --json` goes back into a scenario)."""
    from simddp.config import MAX_INPUT_INT

    value = non_negative_int(text)
    if value > MAX_INPUT_INT:
        raise argparse.ArgumentTypeError(f"{value} is over the limit of 2^53 ({MAX_INPUT_INT:,})")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return float(_checked_number(text, float, 0.0, inclusive=False))


def bucket_cap_mb(text: str) -> float:
    """argparse type: a bucket cap in MiB, > 0 and at most :data:`simddp.config.MAX_BUCKET_CAP_MB`."""
    from simddp.config import MAX_BUCKET_CAP_MB

    value = positive_float(text)
    if value > MAX_BUCKET_CAP_MB:
        raise argparse.ArgumentTypeError(f"{text!r} is above {MAX_BUCKET_CAP_MB:,} MiB (1 EiB)")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return float(_checked_number(text, float, 0.0, inclusive=True))


def rate(text: str) -> float:
    """argparse type: bytes/s, a number or with a unit (25GB/s, 400Gbit/s)."""
    try:
        value = units.parse_rate(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{safeio.short_repr(text)}: {err}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{safeio.short_repr(text)} must be a bandwidth > 0")
    return value


#: Widest uncertainty band, in standard errors (``--z``): beyond it the band says nothing.
MAX_Z = 10.0


def z_score(text: str) -> float:
    """argparse type: a band width in standard errors, 0 <= z <= MAX_Z."""
    value = float(_checked_number(text, float, 0.0, inclusive=True))
    if value > MAX_Z:
        raise argparse.ArgumentTypeError(f"{value:g} must be <= {MAX_Z:g} standard errors")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1..65535."""
    value = int(_checked_number(text, int, 1, inclusive=True))
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} must be <= 65535")
    return value


def host_name(text: str) -> str:
    """argparse type: an interface address or host name to bind (no spaces or control characters)."""
    if not re.fullmatch(r"[A-Za-z0-9.:%\[\]_-]{1,253}", text):
        raise argparse.ArgumentTypeError(f"{safeio.short_repr(text)} is not a host name or address")
    return text


# ------------------------------------------------------------------------------------- commands
def _verdict_lines(memory: Any) -> list[str]:
    """The first lines of a report whose layout does not fit in memory (none when it fits)."""
    from simddp.verdict import HYPOTHETICAL, MemoryVerdict

    if memory is None or MemoryVerdict.of(memory).fits:
        return []
    return [MemoryVerdict.of(memory).headline(), HYPOTHETICAL, ""]


def cmd_simulate(args: argparse.Namespace) -> int:
    from simddp.exports import STEP_CSV_NAMES, write_step_csv
    from simddp.results import BREAKDOWN_PARTS
    from simddp.sanity import check_step_result
    from simddp.sim import simulate_step
    from simddp.verdict import MemoryVerdict, verdict_json

    scenario = _load(args)
    inputs = _scenario_inputs(args, scenario)
    outputs: list[tuple[str, Any]] = []
    if args.trace is not None:
        outputs.append(("--trace", safeio.check_output(args.trace, inputs, "--trace")))
    if args.csv is not None:
        outputs += [("--csv", path) for path in safeio.check_output_dir(args.csv, STEP_CSV_NAMES, inputs, "--csv")]
    safeio.check_distinct(outputs)
    # The trace is the simpy simulation's; layers.csv reads its per-layer spans only at pp 1 (a pipeline's layer
    # rows have no times), so a pipeline's --csv alone runs the fast engine. Until 2026-11-29 any output ran simpy:
    # a probe's pipeline answered without --csv was refused with it, blamed on its micro-batches.
    traced = "--trace" if args.trace is not None else (
        "--csv" if args.csv is not None and scenario.parallelism.pp == 1 else None)
    try:
        result = simulate_step(scenario, trace=traced is not None, exact=args.exact)
    except SimulationTooLarge as e:
        if traced is None or args.exact:
            raise
        simulate_step(scenario, trace=False)  # answered without the output? Else the scenario's own error stands
        what = "a trace comes" if traced == "--trace" else "layers.csv's per-layer times come"
        raise ScenarioError(f"{traced}: {what} from the event-by-event simulation, and {e}; without {traced} the "
                            "fast engine answers this step") from None
    check_step_result(result)
    with safeio.writes_together():  # every output, or none where one fails
        if args.trace is not None:
            if result.trace is None:
                raise InternalError("the simulator returned no trace")
            result.trace.write(args.trace, inputs)
        if args.csv is not None:
            written = write_step_csv(args.csv, scenario, result, verdict_json(result.memory), inputs)
    if args.json:
        print(safeio.json_text({**verdict_json(result.memory), **result.to_json_dict()}, indent=2))
        return 0
    f, ms = units.fmt_time, result.step_time_s
    algos = sorted({f"{b.algorithm}/{b.protocol}" for b in result.buckets})
    lines = [
        *_verdict_lines(result.memory),
        f"Scenario   {result.scenario}: {result.model} on {scenario.cluster.num_nodes} x "
        f"{result.cluster} ({result.num_gpus} GPUs), dp={result.dp} tp={result.tp} pp={result.pp}",
        f"Batch      {result.global_batch_size} samples x {scenario.training.seq_len} tokens, "
        f"{result.num_micro_batches} micro-batch(es) of {scenario.training.micro_batch_size} per GPU",
        "",
        f"  step time              {f(ms):>12}",
        f"  compute (fwd+bwd)      {f(result.compute_time_s):>12}",
        f"  optimizer              {f(result.optimizer_time_s):>12}",
        f"  data-parallel comm     {f(result.comm_time_s):>12}   " + (
            "DataParallel: scatter, replicate, gather, reduce to GPU 0"
            if scenario.ddp.wrapper == "dataparallel" else
            f"{len(result.buckets)} {_reduction_units(scenario, result.pp)}, {', '.join(algos) or '-'}"),
    ]
    if result.tp > 1:
        lines.append(f"  tensor-parallel comm   {f(result.tp_comm_time_s):>12}   blocking, inside the layers")
    for key, label in (("ddp_host", "framework host time"), ("grad_clip", "gradient clipping")):
        if result.part(key) > 0:
            lines.append(f"  {label:<22} {f(result.part(key)):>12}   {BREAKDOWN_PARTS[key][1]}")
    if result.pp > 1:
        lines.append(f"  pipeline bubble        {f(result.pipeline_bubble_time_s):>12}   "
                     f"{scenario.parallelism.pipeline_schedule}, {result.reported_rank}")
        if result.stage_imbalance_time_s > 0:
            lines.append(f"  stage imbalance        {f(result.stage_imbalance_time_s):>12}   "
                         f"{BREAKDOWN_PARTS['stage_imbalance'][1]}")
        if result.pipeline_p2p_time_s > 0:
            lines.append(f"  pipeline send/recv     {f(result.pipeline_p2p_time_s):>12}   "
                         f"{BREAKDOWN_PARTS['pipeline_p2p'][1]}")
    # The step's other parts, so that every line but data-parallel comm (mostly hidden) adds up to the step.
    for key, label, value in (("interference", "compute slowed by NCCL", result.interference_time_s),
                              ("host", "host overhead", result.host_overhead_s)):
        if value > 0:
            lines.append(f"  {label:<22} {f(value):>12}   {BREAKDOWN_PARTS[key][1]}")
    lines += [
        f"  exposed comm           {f(result.exposed_comm_time_s):>12}   "
        f"{result.exposed_comm_fraction:.1%} of the step",
        "",
        f"  throughput             {result.samples_per_s:,.1f} samples/s"
        + (f", {result.tokens_per_s:,.0f} tokens/s" if scenario.training.seq_len > 1 else ""),
        f"  MFU                    {result.mfu:.1%}",
        f"  scaling efficiency     {result.scaling_efficiency:.1%} of a GPU without communication",
        f"  bounds                 no overlap {f(result.bounds.no_overlap_s)}, "
        f"perfect overlap {f(result.bounds.perfect_overlap_s)}",
    ]
    if result.memory is not None:
        mem = result.memory
        lines.append(f"  memory per GPU         {units.fmt_bytes(mem.total_bytes):>12}   "
                     f"{MemoryVerdict.of(mem).short()} (rank {mem.rank}, stage {mem.stage}; see `simddp memory`)")
    for note in result.not_modelled:
        lines.append(f"  not modelled: {note}")
    if result.memory is not None:
        shown = set(result.not_modelled)
        lines += [f"  memory note: {note}" for note in result.memory.notes if note not in shown]
    if args.trace is not None:
        lines.append(f"  trace written to {safeio.shown_path(args.trace)} (open in https://ui.perfetto.dev)")
    if args.csv is not None:
        lines.append(f"  tables written: {', '.join(safeio.shown_path(p) for p in written)}")
    print("\n".join(lines))
    return 0


def _reduction_units(scenario: Scenario, pp: int) -> str:
    """What the data-parallel reduction works on: buckets, FSDP units or DeepSpeed ZeRO-3 modules."""
    rule = zero_rule(scenario)
    if not rule.sharded_params or pp > 1:
        return "buckets"
    return "FSDP units" if rule.unit_rule == "block" else "ZeRO-3 reduce buckets"


def cmd_tails(args: argparse.Namespace) -> int:
    from simddp.variability import simulate_tails

    scenario = _load(args)
    result = simulate_tails(scenario, args.steps, args.seed)
    if args.json:
        print(safeio.json_text(result.to_json_dict(), indent=2))
        return 0
    f, var = units.fmt_time, result.variability
    docs = var.seq_len_distribution if var.seq_len_distribution == "fixed" else (
        f"{var.seq_len_distribution} ({var.sequence_handling})")
    lines = [
        f"Tails      {result.scenario}: {result.num_ranks:,} ranks (dp={result.dp} tp={result.tp} pp={result.pp}), "
        f"{result.num_steps:,} Monte Carlo steps, seed {result.seed}",
        f"Variation  jitter CV {var.jitter_cv:.1%}, {var.num_stragglers} straggler(s) x{var.straggler_slowdown:g}, "
        f"documents {docs}",
        "",
        f"  simulated step          {f(result.deterministic_step_s):>12}   no variation",
        f"  mean step               {f(result.mean_s):>12}",
        f"  p50 / p90 / p99         {f(result.p50_s):>12} / {f(result.p90_s)} / {f(result.p99_s)}",
        f"  balanced step           {f(result.balanced_step_s):>12}   every rank at the mean: nobody waits",
        f"  lost to the tail        {result.tail_loss_fraction:>12.1%}   of throughput (1 - balanced / mean)",
        f"  padding                 {result.padding_fraction:>12.1%}   of the tokens computed",
        f"  tokens/s                {result.tokens_per_s:>12,.0f}   real tokens",
    ]
    if result.stragglers:
        shown = ", ".join(str(r) for r in result.stragglers[:8]) + (", ..." if len(result.stragglers) > 8 else "")
        lines.append(f"  stragglers              ranks {shown}")
    lines += ["", "Waiting per step, by synchronisation point:"]
    for w in result.sync_points:
        lines.append(f"  {w.label:<58}{f(w.wait_s):>12}   {w.share:6.1%}")
    if result.below_zero_note:
        lines.append(f"  note: {result.below_zero_note}")
    print("\n".join(lines))
    return 0


def _run_config(args: argparse.Namespace, scenario: Scenario) -> Any:
    """The scenario's run section with the `simddp run` flags applied (validated: errors name run.KEY)."""
    from pydantic import ValidationError

    from simddp.config import RunConfig

    flags = {"tokens": args.tokens, "gpu_hour_cost_usd": args.gpu_hour_cost, "mtbf_hours": args.mtbf_hours,
             "mtbf_scope": args.mtbf_per, "storage_write_bytes_per_s": args.checkpoint_bandwidth,
             "checkpoint_saving": args.checkpoint_saving, "checkpoint_interval_s": args.checkpoint_interval,
             "restart_overhead_s": args.restart_overhead, "achieved_tflops_per_gpu": args.tflops_per_gpu}
    data = {**scenario.run.model_dump(), **{k: v for k, v in flags.items() if v is not None}}
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ScenarioError("run." + format_validation_error(err)) from None


def cmd_run(args: argparse.Namespace) -> int:
    from simddp.run import simulate_run

    scenario = _load(args)
    scenario = scenario.model_copy(update={"run": _run_config(args, scenario)})
    result = simulate_run(scenario)
    if args.json:
        print(safeio.json_text(result.to_json_dict(), indent=2))
        return 0
    f, run = units.fmt_duration, scenario.run
    per = f"{run.mtbf_hours:,.0f} h per {run.mtbf_scope}"
    scope = result.num_gpus if run.mtbf_scope == "gpu" else result.num_nodes
    lines = [
        f"Run        {result.scenario}: {result.tokens:.3g} tokens on {result.num_gpus:,} GPUs "
        f"({result.num_nodes:,} nodes)",
        f"Throughput {result.tokens_per_s:,.0f} tokens/s, step {f(result.step_time_s)}, "
        f"{result.achieved_flop_per_s_per_gpu / units.TFLOP:.1f} TFLOP/s per GPU ({result.throughput_source})",
        "",
        f"  training, no failures   {result.training_days:>12.2f} days   {result.num_steps:,.0f} steps",
        f"  wall clock              {result.days:>12.2f} days",
        f"  GPU-hours               {result.gpu_hours:>12,.0f}",
        f"  cost                    {'$' + format(result.cost, ',.0f'):>12}   at ${result.gpu_hour_cost_usd:g} per "
        "GPU-hour",
        f"  expected failures       {result.expected_failures:>12.1f}   job MTBF {result.mtbf_s / units.HOUR:.3g} h "
        f"({per} / {scope:,})",
        f"  checkpoint              {f(result.checkpoint_time_s):>12}   {result.checkpoint_bytes / units.TB:.3g} TB, "
        f"{result.checkpoint_saving} (rank 0 alone: {f(result.checkpoint_time_rank0_s)}, sharded: "
        f"{f(result.checkpoint_time_sharded_s)})",
        f"  checkpoint interval     {f(result.checkpoint_interval_s):>12}   Young's sqrt(2 delta M): "
        f"{f(result.young_interval_s)}",
        f"  restart                 {f(result.restart_s):>12}   per failure, reading the checkpoint included",
        f"  start-up broadcast      {f(result.startup_s):>12}   DDP's parameter broadcast from rank 0, once",
        f"  goodput                 {result.goodput:>12.1%}   training time / wall clock",
    ]
    for note in result.notes:
        lines.append(f"  note: {note}")
    print("\n".join(lines))
    return 0


def cmd_knobs(args: argparse.Namespace) -> int:
    from simddp.knobs import knob_table

    scenario = _load(args)
    table = knob_table(scenario)
    if args.json:
        print(safeio.json_text(table.to_json_dict(), indent=2))
        return 0
    f = units.fmt_time
    lines = [f"Knobs      {table.scenario}: simulated step {f(table.baseline_s)}", "",
             f"  {'knob':<44}{'setting':<26}{'step':>12}{'change':>12}  where"]
    for r in table.rows:
        if r.step_time_s is None:
            lines.append(f"  {r.knob:<44}{r.setting:<26}{'-':>12}{'-':>12}  {r.note}")
            continue
        change = f"{(r.delta_s or 0.0) / (r.baseline_s or 1.0):+.2%}"
        lines.append(f"  {r.knob:<44}{r.setting:<26}{f(r.step_time_s):>12}{change:>12}  {r.moved or 'no change'}")
        if r.note:
            lines.append(f"  {'':<44}{'':<26}{'':>12}{'':>12}  {r.note}")
    lines += ["", f"  start-up parameter broadcast (once per run, counted by `simddp run`): "
              f"{f(table.startup_broadcast_s)}"]
    print("\n".join(lines))
    return 0


def cmd_buckets(args: argparse.Namespace) -> int:
    from simddp.exports import bucket_export

    if args.json and args.csv:
        raise UsageError("--json and --csv: choose one")
    scenario = _load(args)
    export = bucket_export(scenario, args.stage)
    if args.json:
        print(safeio.json_text(export.to_json_dict()))
        return 0
    if args.csv:
        print(export.to_csv(), end="")
        return 0
    buckets = export.buckets
    par = scenario.parallelism
    rule = zero_rule(scenario)
    if rule.sharded_params and par.pp == 1:
        return _print_reduction_units(scenario)
    if scenario.ddp.wrapper == "dataparallel":
        print("no DDP buckets: DataParallel (ddp.wrapper) sums every replica's gradients onto GPU 0 after backward "
              "(see simddp simulate --trace)")
        return 0
    where = f"pipeline stage {export.stage} of {par.pp}, " if par.pp > 1 else ""
    print(f"{len(buckets)} buckets, {units.fmt_bytes(sum(b.size_bytes for b in buckets))} of gradients "
          f"({where}tp shard {(par.tp > 1 and f'1 of {par.tp}') or 'whole model'}; parameter indices are this "
          "rank's, in model.parameters() order)")
    if rule.sharded_params:
        print(f"note: {rule.name} reduce-scatters per unit instead (see simddp simulate --trace)")
    print(f"{'#':>4} {'size':>12} {'dtype':>9} {'params':>7}  first .. last parameter")
    for b in buckets:
        print(f"{b.index:>4} {units.fmt_bytes(b.size_bytes):>12} {b.dtype:>9} {len(b.params):>7}  "
              f"{b.params[0].name} .. {b.params[-1].name}")
    return 0


def _print_reduction_units(scenario: Scenario) -> int:
    """``simddp buckets`` under FSDP or DeepSpeed ZeRO-3 (pp 1): the units whose gradients are reduce-scattered,
    as the simulated step reduces them (torch DDP's buckets play no part there)."""
    from simddp.sim.plan import build_plan

    plan = build_plan(scenario)
    reduced = plan.ranks[0].reduced_units
    what = _reduction_units(scenario, 1)
    size = units.fmt_bytes(sum(u.grad_bytes for u in reduced))
    rule = zero_rule(scenario)
    if rule.unit_rule == "block":
        print(f"{len(reduced)} {what}, {size} of gradients, each reduce-scattered after its backward "
              f"({rule.name}; `--json` / `--csv` list each one's parameters)")
        print(f"{'#':>4} {'size':>12} {'layers':>7}  unit")
        for u in reduced:
            print(f"{u.index:>4} {units.fmt_bytes(u.grad_bytes):>12} {len(u.layers):>7}  {u.name}")
        return 0
    # DeepSpeed's reduce bucket goes after a module's backward and holds the gradients that filled it (numbered as
    # `simulate` numbers them: by the module it follows).
    params = plan.workload.parameters
    print(f"{len(reduced)} {what}, {size} of gradients, each reduce-scattered once full, after the backward of "
          f"the module named ({rule.name}; `--json` / `--csv` list each one's parameters)")
    print(f"{'#':>4} {'size':>12} {'params':>7}  after  (first .. last parameter)")
    for u in reduced:
        first, last = params[u.reduce_ids[0]].name, params[u.reduce_ids[-1]].name
        print(f"{u.index:>4} {units.fmt_bytes(u.grad_bytes):>12} {len(u.reduce_ids):>7}  {u.name}  ({first} .. {last})")
    return 0


_MEMORY_LABELS = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "buffers": "buffers",
    "overhead": "overhead",
}


def cmd_memory(args: argparse.Namespace) -> int:
    from simddp.memory import max_micro_batch_that_fits, memory_breakdown, smallest_layout_that_fits
    from simddp.verdict import MemoryVerdict, verdict_json

    scenario = _load(args)
    if args.num_gpus is not None and not args.fit_layout:
        raise UsageError("--num-gpus needs --fit-layout")
    mem = memory_breakdown(scenario, stage=args.stage)
    max_mb = max_micro_batch_that_fits(scenario) if args.max_micro_batch else None
    layout = smallest_layout_that_fits(scenario, args.num_gpus) if args.fit_layout else None
    if args.json:
        out = {**verdict_json(mem), **mem.to_json_dict()}
        if max_mb is not None:
            out["max_micro_batch"] = max_mb
        if layout is not None:
            out.update(layout.to_json_dict())
        print(safeio.json_text(out, indent=2))
        return 0
    fb, tr, par = units.fmt_bytes, scenario.training, scenario.parallelism
    flight = f"{mem.in_flight_micro_batches:g}"
    lines = [
        *_verdict_lines(mem)[:1], *([""] if not MemoryVerdict.of(mem).fits else []),
        f"Memory     {scenario.name}: {mem.model} on {scenario.cluster.num_nodes} x "
        f"{scenario.cluster.preset or 'custom'} ({mem.num_gpus} x {mem.gpu}), dp={mem.dp} tp={mem.tp} pp={mem.pp}, "
        f"ZeRO-{mem.zero_stage}{', SP' if par.sequence_parallel else ''}",
        f"Training   {mem.precision}, {mem.optimizer}, recompute {mem.recompute}, micro-batch "
        f"{tr.micro_batch_size} x {tr.seq_len} tokens, {flight} in flight",
        f"GPU        rank {mem.rank} (pipeline stage {mem.stage} of {mem.pp}), {mem.num_params:,} parameters "
        "before ZeRO sharding",
        "",
    ]
    for category, label in _MEMORY_LABELS.items():
        items = [i for i in mem.items if i.category == category]
        size = sum(i.size_bytes for i in items)
        if len(items) == 1:
            lines.append(f"  {label:<28}{fb(size):>12}   {items[0].note}")
            continue
        lines.append(f"  {label:<28}{fb(size):>12}")
        for i in items:
            lines.append(f"    {i.name:<26}{fb(i.size_bytes):>12}   {i.note}")
    lines += [
        f"  {'-' * 40}",
        f"  {'total':<28}{fb(mem.total_bytes):>12}   {MemoryVerdict.of_stage(mem).short()}",
    ]
    if mem.pp > 1:
        stages = ", ".join(f"{s}: {fb(b)}" for s, b in enumerate(mem.stage_total_bytes))
        lines.append(f"  per pipeline stage: {stages}")
    for note in mem.notes:
        lines.append(f"  note: {note}")
    if max_mb is not None:
        kept = f" (global batch {tr.global_batch_size} kept)" if tr.global_batch_size else ""
        lines += ["", f"Largest micro-batch that fits: {max_mb}{kept}" if max_mb else
                  "No micro-batch fits, not even 1"]
    if layout is not None:
        lines += ["", *_layout_lines(layout, scenario)]
    print("\n".join(lines))
    return 0


#: What each answer of `memory --fit-layout` keeps from the scenario's layout (its field descriptions).
_KEPT = {"smallest ZeRO stage": ("tp", "pp", "sequence_parallel", "recompute"),
         "least recompute": ("zero_stage", "tp", "pp", "sequence_parallel"),
         "smallest tp": ("zero_stage", "pp", "recompute"),
         "smallest pp": ("zero_stage", "tp", "sequence_parallel", "recompute")}


def _layout_lines(layout: Any, scenario: Scenario) -> list[str]:
    """The answers of `memory --fit-layout`, then every layout it evaluated (fitting ones first). An answer that
    keeps part of the scenario's layout says whether no such layout fits or none is valid on these GPUs (the batch
    or the layers do not split so)."""
    par = scenario.parallelism
    own = {"zero_stage": par.zero_stage, "tp": par.tp, "pp": par.pp, "sequence_parallel": par.sequence_parallel,
           "recompute": scenario.training.recompute}

    def missing(name: str) -> str:
        kept = _KEPT.get(name)
        if kept is None:
            return "invalid layout" if name == "current" else "none fits"
        if any(all(getattr(f, k) == own[k] for k in kept) for f in layout.evaluated):
            return "none fits"
        names = {"zero_stage": "ZeRO", "sequence_parallel": "SP"}
        said = ", ".join(f"{names.get(k, k)} {('on' if own[k] else 'off') if k == 'sequence_parallel' else own[k]}"
                         for k in kept)
        return f"none valid on {layout.num_gpus} GPUs with {said}"

    fb = units.fmt_bytes
    fitting = sum(f.fits for f in layout.evaluated)
    lines = [f"Layouts on {layout.num_gpus} GPUs: {layout.num_layouts} evaluated (ZeRO stage x tp x pp x sequence "
             f"parallelism x recompute), {fitting} fit"]
    rows = [("current", layout.current), ("smallest ZeRO stage", layout.smallest_zero_stage),
            ("least recompute", layout.least_recompute), ("smallest tp", layout.smallest_tp),
            ("smallest pp", layout.smallest_pp), ("least model parallel", layout.best)]
    for name, fit in rows:
        if fit is None:
            lines.append(f"  {name:<22}{missing(name)}")
            continue
        lines.append(f"  {name:<22}{fit.label():<52}{fb(fit.total_bytes):>12}   "
                     f"{'fits' if fit.fits else 'does not fit'}")
    lines += ["", "Every layout evaluated (fitting first, most preferred first: least tp x pp, recompute, ZeRO, pp):",
              f"  {'fits':<5} {'ZeRO':>4} {'tp':>3} {'pp':>3} {'dp':>5} {'SP':<4}{'recompute':<10}{'memory':>12}"]
    for f in layout.evaluated:
        lines.append(f"  {'yes' if f.fits else 'no':<5} {f.zero_stage:>4} {f.tp:>3} {f.pp:>3} {f.dp:>5} "
                     f"{'on' if f.sequence_parallel else 'off':<4}{f.recompute:<10}{fb(f.total_bytes):>12}")
    return lines


def cmd_collective(args: argparse.Namespace) -> int:
    from simddp.collectives import collective_cost
    from simddp.topology import world_group

    cluster_dict: dict[str, Any] = {"preset": args.cluster, "num_nodes": args.num_nodes}
    if args.gpus_per_node is not None:
        cluster_dict["gpus_per_node"] = args.gpus_per_node
    try:
        cluster = Cluster.model_validate(cluster_dict)
    except Exception as err:  # pydantic ValidationError
        raise ScenarioError(_cluster_error(err)) from None
    from simddp.limits import too_many_gpus

    over = too_many_gpus(cluster.num_nodes, cluster.gpus_per_node, ("--num-nodes", "--gpus-per-node"))
    if over is not None:
        raise UsageError(over)
    group = world_group(cluster)
    if args.op in ("all-to-all", "send-recv") and (args.algorithm, args.protocol) != ("auto", "auto"):
        raise UsageError(f"--algorithm/--protocol: NCCL runs {args.op} as point-to-point sends and receives "
                         "(Simple protocol); leave them out")
    if group.num_ranks < 2:
        raise UsageError(f"a collective needs at least 2 ranks (got {group.num_ranks} GPU)")
    sizes = [parse_size(args.bytes)] if args.bytes is not None else [8 * 4**k for k in range(16)]  # '' is an error
    rows = []
    for size in sizes:
        try:
            c = collective_cost(args.op, size, group, args.algorithm, args.protocol)
        except ValueError as err:
            raise UsageError(str(err)) from None
        rows.append(c)
    if args.json:
        out = [
            {
                "op": c.op,
                "size_bytes": c.size_bytes,
                "num_ranks": c.num_ranks,
                "algorithm": c.algorithm,
                "protocol": c.protocol,
                "time_s": c.time_s,
                "algbw_bytes_per_s": c.algbw_bytes_per_s,
                "busbw_bytes_per_s": c.busbw_bytes_per_s,
            }
            for c in rows
        ]
        print(safeio.json_text(out[0] if args.bytes else out, indent=2))
        return 0
    print(f"{args.op} on {cluster.num_gpus} GPUs ({cluster.num_nodes} x {args.cluster})")
    print(f"{'size (B)':>12} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  algorithm")
    for c in rows:
        print(f"{c.size_bytes:>12} {c.time_s / units.US:>11.1f} {c.algbw_bytes_per_s / units.GB:>13.2f} "
              f"{c.busbw_bytes_per_s / units.GB:>13.2f}  {c.algorithm}/{c.protocol}")
    return 0


def _cluster_error(err: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(err, ValidationError):
        return "cluster: " + format_validation_error(err)
    return str(err)


def cmd_presets(args: argparse.Namespace) -> int:
    if getattr(args, "presets_command", None) == "show":
        from simddp.schema import preset_values, preset_yaml

        if args.show_json or args.json:  # `presets --json show NAME` means the same
            section, values = preset_values(args.name)
            print(safeio.json_text({section: values}, indent=2))
        else:
            print(preset_yaml(args.name), end="")
        return 0
    groups = {"clusters": CLUSTER_PRESETS, "models": MODEL_PRESETS}
    if args.json:
        from simddp.schema import preset_values

        print(safeio.json_text({k: {n: {"description": p.description, "source": p.source,
                                        "values": preset_values(n)[1]} for n, p in v.items()}
                                for k, v in groups.items()}, indent=2))
        return 0
    for title, presets in groups.items():
        print(f"{title}:")
        for name, p in presets.items():
            print(f"  {name:<18} {p.description}  [{p.source}]")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from simddp.schema import schema_keys

    if args.path is not None and not args.path.strip():  # '' listed every key, as no path does
        raise UsageError("schema '': empty key path; give one (training.seq_len), or none for every key")
    keys = schema_keys(args.path or "")
    if args.json:
        print(safeio.json_text([k.model_dump(mode="json") for k in keys], indent=2))
        return 0
    print("\n".join(k.to_text() for k in keys))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from simddp.config import read_mapping
    from simddp.schema import starter_scenario

    base = read_mapping(default_scenario_path())
    print(starter_scenario(base, args.model, args.cluster, args.num_nodes), end="")
    return 0


def dashboard_folder() -> Path:
    """Where the installed dashboard package (``simddp_app``, the repository's ``app/``) lives."""
    import importlib.util

    spec = importlib.util.find_spec("simddp_app")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the dashboard package simddp_app is not installed; reinstall simddp (pip install simddp)")
    return Path(next(iter(spec.submodule_search_locations)))


def streamlit_flags(config: Path, host: str, port: int, headless: bool) -> list[str]:
    """Every option of the shipped ``.streamlit/config.toml`` as a flag, then the host and port.

    Flags win over any config file, so the dashboard binds ``host`` (127.0.0.1 unless asked), sends no
    usage statistics and never looks up the external IP (a fixed browser.serverAddress needs no lookup).
    """
    import socket
    import tomllib

    options: dict[str, Any] = {}
    if config.is_file():
        with config.open("rb") as fh:
            for section, values in tomllib.load(fh).items():
                options.update({f"{section}.{key}": value for key, value in values.items()})
    wildcard = host in ("0.0.0.0", "::")
    options["server.address"] = host
    options["server.port"] = port
    options["browser.serverAddress"] = socket.gethostname() if wildcard else (
        "localhost" if host in ("127.0.0.1", "::1", "localhost") else host)
    if headless:
        options["server.headless"] = True
    return [f"--{key}={str(v).lower() if isinstance(v, bool) else v}" for key, v in options.items()]


def cmd_app(args: argparse.Namespace) -> int:
    folder = dashboard_folder()
    app = folder / "streamlit_app.py"
    if not app.is_file():
        raise UsageError(f"dashboard not found at {app}; reinstall simddp")
    flags = streamlit_flags(folder / ".streamlit" / "config.toml", args.host, args.port, args.headless)
    # Replace this process, so that stopping `simddp app` stops the server too.
    os.execv(sys.executable, [sys.executable, "-m", "streamlit", "run", str(app), *flags])
    return 0  # not reached


def cmd_calibrate_fit(args: argparse.Namespace) -> int:
    from simddp.fit import fit_profile
    from simddp.profile import CommMeasurements, ComputeMeasurements, read_calibration_file, write_json

    inputs = [args.comm, args.compute]
    safeio.check_output(args.out, inputs, "--out")
    comm = read_calibration_file(args.comm, CommMeasurements)
    compute = read_calibration_file(args.compute, ComputeMeasurements)
    profile = fit_profile(comm, compute, sources={"comm": str(args.comm), "compute": str(args.compute)},
                          allow_partial=args.allow_partial, allow_mixed=args.allow_mixed)
    write_json(profile, args.out, inputs)
    placeholders = [n for n in profile.notes if n.startswith("PLACEHOLDER")]
    for note in placeholders:
        print(f"simddp: warning: {note}", file=sys.stderr)
    if args.json:
        print(profile.model_dump_json(indent=1))
        return 0
    run = profile.comm_run
    print(f"Collectives measured on {run.world_size} ranks ({run.num_nodes} host(s), {run.backend}, "
          f"{run.device_names[0] if run.device_names else run.device})")
    print(f"{'op':<15}{'group':<11}{'tier':<6}{'used for sizes':>23} {'alpha/step':>11} {'busbw':>11} {'R2':>7} "
          f"{'rel.resid':>9}")
    for r in profile.fits:
        f = r.fit
        sizes = f"{units.fmt_bytes(f.min_bytes)}..{units.fmt_bytes(f.max_bytes)}"
        busbw = units.fmt_bandwidth(f.bus_bandwidth_bytes_per_s) if f.bus_bandwidth_bytes_per_s < 1e17 else "-"
        print(f"{f.op:<15}{r.group:<11}{f.tier:<6}{sizes:>23} {units.fmt_time(f.latency_per_step_s):>11} "
              f"{busbw:>11} {r.r2:>7.3f} {f.rel_residual:>9.1%}")
    layers = profile.model["layers"]
    fwd = sum(la.get("fwd_time_s") or 0.0 for la in layers)
    bwd = sum(la.get("bwd_time_s") or 0.0 for la in layers)
    print(f"Compute    {len(layers)} layers: forward {units.fmt_time(fwd)}, backward {units.fmt_time(bwd)}, "
          f"optimizer {units.fmt_time(profile.training['optimizer_time_s'])}, host "
          f"{units.fmt_time(profile.cluster['host_overhead_s'])} (step noise {profile.compute_rel_sigma:.1%})")
    print(f"Interference {profile.interference.value:.3f} ({profile.interference.note})")
    if profile.jitter is not None:
        print(f"Jitter     CV {profile.jitter.cv:.1%} of a rank's step ({profile.jitter.note}): "
              "variability.jitter_cv, for simddp tails and run")
    for note in profile.notes:
        if note.startswith(("fitted from partial", "parameter dtypes", "overlap", "mixed")):
            print(f"note: {note}")
    print(f"wrote {safeio.shown_path(args.out)}"
          + (f" with {len(placeholders)} placeholder(s) (--allow-partial)" if placeholders else ""))
    return 0


def cmd_calibrate_merge(args: argparse.Namespace) -> int:
    from simddp.profile import merge_measurements, read_measurements, write_json

    safeio.check_output(args.out, args.files, "--out")
    merged = merge_measurements([read_measurements(f) for f in args.files])  # type: ignore[type-var]
    write_json(merged, args.out, args.files)
    print(f"merged {len(args.files)} {merged.kind} files into {safeio.shown_path(args.out)}")
    return 0


def cmd_calibrate_validate(args: argparse.Namespace) -> int:
    from simddp.profile import DDPMeasurements, read_calibration_file
    from simddp.report import extrapolate, validate, write_html

    if args.gpus_per_node is not None and not args.extrapolate:
        raise UsageError("--gpus-per-node shapes --extrapolate's world sizes: give --extrapolate RANKS too")
    # The HTML report goes beside ddp.json unless --html names it; --json alone writes none (stdout is the report).
    html: Path | None = Path(args.html) if args.html else (
        None if args.json else Path(args.ddp).with_name(Path(args.ddp).stem + "_report.html"))
    inputs = [args.profile, args.ddp]
    if html is not None:
        safeio.check_output(html, inputs, "--html")
    ddp = read_calibration_file(args.ddp, DDPMeasurements)
    report = validate(args.profile, ddp, args.ddp, z=args.z)
    sizes = _world_sizes(args.extrapolate) if args.extrapolate is not None else []
    cap = ddp.cases[-1].bucket_cap_mb
    extra = extrapolate(args.profile, sizes, args.gpus_per_node, cap, z=args.z) if sizes else []
    text = report.to_text()
    if args.json:  # with --extrapolate, its predictions beside the report (as `calibrate predict --json` lists them)
        data = report.to_json_dict()
        if extra:
            data["extrapolated"] = [p.model_dump() for p in extra]
        text = safeio.json_text(data, indent=2)
    if html is not None:
        write_html(report, html, extra, inputs)
    if args.json:  # the text report shows them at the top
        for warning in report.warnings:
            print(f"simddp: warning: {warning}", file=sys.stderr)
    print(text)
    if not args.json:
        print(f"report written to {safeio.shown_path(html)}")
    return 0


def cmd_calibrate_predict(args: argparse.Namespace) -> int:
    from simddp.report import extrapolate

    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected key.path=value")
        key, value = item.split("=", 1)
        from simddp.config import set_path

        overrides = set_path(overrides, key.strip(), value)
    ddp_keys = overrides.get("ddp")
    if args.bucket_cap_mb is not None and isinstance(ddp_keys, dict) and "bucket_cap_mb" in ddp_keys:
        # the --set one won without a word (a probe): one cap, given once
        raise UsageError(f"--bucket-cap-mb {args.bucket_cap_mb:g} and --set ddp.bucket_cap_mb="
                         f"{ddp_keys['bucket_cap_mb']}: give the bucket cap once")
    preds = extrapolate(args.profile, _world_sizes(args.ranks), args.gpus_per_node, args.bucket_cap_mb,
                        overrides, z=args.z)
    for p in preds:
        from simddp.sanity import check_range

        check_range(p.high_s, f"the step at {p.world_size} ranks")
    if args.json:
        print(safeio.json_text([p.model_dump() for p in preds], indent=2))
        return 0
    print(f"{'ranks':>6} {'nodes':>6} {'buckets':>8} {'step':>11} {'band (z=' + format(args.z, 'g') + ')':>25} "
          f"{'comm':>11} {'exposed':>11}")
    notes: list[str] = []
    for p in preds:
        band = f"{units.fmt_time(p.low_s)} .. {units.fmt_time(p.high_s)}"
        print(f"{p.world_size:>6} {p.num_nodes:>6} {p.num_buckets:>8} {units.fmt_time(p.step_time_s):>11} "
              f"{band:>25} {units.fmt_time(p.comm_time_s):>11} {units.fmt_time(p.exposed_comm_time_s):>11}")
        notes += [n for n in p.notes if n not in notes]
    for n in notes:
        print(f"note: {n}")
    return 0


def _world_sizes(text: str) -> list[int]:
    tokens = [t.strip() for t in text.split(",")] if "," in text else text.split()
    if "" in tokens:  # '2,,8' read as 2,8 and '' as none, until 2026-11-29 (a probe)
        raise UsageError(f"world sizes {safeio.short_repr(text)}: an empty size; expected integers such as 2,8,128")
    try:
        sizes = [int(t) for t in tokens]
    except ValueError:
        raise UsageError(f"world sizes {text!r}: expected integers such as 2,8,128") from None
    if not sizes or any(n < 1 for n in sizes):
        raise UsageError(f"world sizes {text!r}: expected integers >= 1")
    from simddp.limits import MAX_GPUS

    if max(sizes) > MAX_GPUS:
        raise UsageError(f"world size {max(sizes):,} is over the limit of {MAX_GPUS:,} (simddp.limits.MAX_GPUS)")
    if len(sizes) > 64:
        raise UsageError(f"world sizes {safeio.short_repr(text)}: at most 64 sizes")
    return sizes


#: ``simddp calibrate collect KIND`` -> the collector module of the simddp_calibration package.
COLLECTORS = {"comm": "collectives", "compute": "compute", "ddp": "ddp_step"}


def _launcher_parser(kind: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"simddp calibrate collect {kind}", add_help=False)
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=positive_int, default=1 if kind == "compute" else 2)
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node-rank", "--node_rank", type=non_negative_int)
    p.add_argument("--master-addr", "--master_addr", type=host_name)
    p.add_argument("--master-port", "--master_port", type=port_number)
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint")
    p.add_argument("--rdzv-backend", "--rdzv_backend")
    p.add_argument("--rdzv-id", "--rdzv_id")
    p.add_argument("--standalone", action="store_true")  # one node: added anyway where nothing else says where
    return p


def cmd_calibrate_collect(args: argparse.Namespace) -> int:
    """Run a collector under torchrun (``python -m torch.distributed.run``), after checking its output."""
    import importlib.util
    import subprocess

    module = f"simddp_calibration.{COLLECTORS[args.kind]}"
    rest = list(args.collector_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if "-h" in rest or "--help" in rest:
        return subprocess.run([sys.executable, "-m", module, "--help"], check=False).returncode
    if importlib.util.find_spec("torch") is None:
        raise UsageError("the collectors need torch: pip install 'simddp[calibration]' (or your own torch >= 2.1)")
    launch, rest = _launcher_parser(args.kind).parse_known_args(rest)
    files = _Parser(prog=f"simddp calibrate collect {args.kind}", add_help=False)
    files.add_argument("--out")
    files.add_argument("--model")
    known, _ = files.parse_known_args(rest)
    if not known.out:
        raise UsageError(f"calibrate collect {args.kind}: --out FILE is required")
    inputs = [known.model.rsplit(":", 1)[0]] if known.model and ":" in known.model else []
    safeio.check_output(known.out, inputs, "--out")
    safeio.check_output(safeio.partial_path(known.out), inputs, "--out")
    torchrun = [f"--nproc-per-node={launch.nproc_per_node}", f"--nnodes={launch.nnodes}"]
    distributed = {k: v for k, v in vars(launch).items()
                   if k not in ("nproc_per_node", "nnodes", "standalone") and v is not None}
    if launch.standalone and (distributed or launch.nnodes != "1"):  # torchrun would put the rendezvous on
        # localhost without a word (an info log): each node would wait for peers that cannot join
        raise UsageError(f"--standalone is one node: not with --nnodes {launch.nnodes} or "
                         f"{', '.join('--' + k.replace('_', '-') for k in distributed) or 'a rendezvous'}")
    if launch.standalone or (not distributed and launch.nnodes == "1"):
        torchrun.append("--standalone")
    torchrun += [f"--{k.replace('_', '-')}={v}" for k, v in distributed.items()]
    cmd = [sys.executable, "-m", "simddp_calibration.launch", *torchrun, "-m", module, *rest]
    # The launcher in a process group of its own: a signal reaches it once, passed on from here, whether it was sent
    # to this process alone or to the terminal's group (Ctrl-C; it got two then, and a second SIGINT ends torchrun's
    # shutdown with 130). SIGTERM (timeout, Slurm's scancel) and Ctrl-C stop its ranks (torchrun starts each in a
    # session of its own: only the launcher passes a signal on), and it ends with the collectors' status. This
    # process ended at once with 143 and no word, and a SIGINT to it alone was ignored: the run went on.
    proc = subprocess.Popen(cmd, process_group=0)
    before = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, before)
    return code if code >= 0 else 128 - code


# ------------------------------------------------------------------------------------- parser
EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []  # type: ignore[type-arg]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``simddp simulate: error: ...`` and where to find the usage."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {safeio.one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="simddp", description="Simulate distributed deep-learning training steps (DDP, ZeRO, TP, PP)."
    )
    parser.add_argument("--version", action="version", version=f"simddp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def scenario_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("scenario", nargs="?", help="scenario YAML/JSON (default: the embedded Llama-2-7B on 128 H100s)")
        p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                       help="override a scenario key, e.g. --set ddp.bucket_cap_mb=50 (repeatable; `simddp schema` "
                       "lists the keys). Sizes and rates take units: 80GiB (binary), 80GB (decimal), 25GB/s, "
                       "400Gbit/s; a bare number is bytes or bytes/s")
        p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("simulate", help="simulate one training step")
    scenario_args(p)
    p.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the timeline")
    p.add_argument("--csv", metavar="DIR",
                   help="write summary.csv, buckets.csv and layers.csv into DIR (created if missing)")
    p.add_argument("--exact", action="store_true",
                   help="always run the full event simulation (the reference), not the fast engine")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("tails", help="step-time tails: jitter, stragglers, sequence lengths (Monte Carlo)")
    scenario_args(p)
    p.add_argument("--steps", type=positive_int, default=200, help="Monte Carlo steps (default 200)")
    p.add_argument("--seed", type=seed_number, help="seed of the draws, 0..2^53 (default: variability.seed)")
    p.set_defaults(func=cmd_tails)

    p = sub.add_parser("run", help="the whole training run: days, GPU-hours, cost, failures, checkpoints, goodput")
    scenario_args(p)
    p.add_argument("--tokens", type=positive_float, help="tokens to train on, e.g. 300e9 (run.tokens)")
    p.add_argument("--gpu-hour-cost", type=non_negative_float, metavar="USD",
                   help="price of one GPU-hour, USD (run.gpu_hour_cost_usd; default 12.29)")
    p.add_argument("--mtbf-hours", type=positive_float, metavar="H",
                   help="hours between job-interrupting failures per GPU (or per node with --mtbf-per node); "
                   "default 50,700 (Llama 3)")
    p.add_argument("--mtbf-per", choices=("gpu", "node"), help="what --mtbf-hours is per (default gpu)")
    p.add_argument("--checkpoint-bandwidth", type=rate, metavar="B",
                   help="aggregate storage write bandwidth: bytes/s or 273GB/s (run.storage_write_bytes_per_s)")
    p.add_argument("--checkpoint-saving", choices=("rank0", "sharded"),
                   help="rank0: one process writes the whole state (default); sharded: every rank its part")
    p.add_argument("--checkpoint-interval", type=positive_float, metavar="S",
                   help="training seconds between checkpoints (default: Daly's optimum)")
    p.add_argument("--restart-overhead", type=non_negative_float, metavar="S",
                   help="seconds from a failure to computing again, besides reading the checkpoint (default 600)")
    p.add_argument("--tflops-per-gpu", type=positive_float, metavar="X",
                   help="use this measured throughput (model TFLOP/s per GPU, recompute counted, as Narayanan et "
                   "al.) instead of the simulated step")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("knobs", help="what each DDP knob costs here: find_unused_parameters, static_graph, "
                       "gradient clipping, gloo, DataParallel")
    scenario_args(p)
    p.set_defaults(func=cmd_knobs)

    p = sub.add_parser("buckets", help="DDP gradient buckets, exactly as torch builds them")
    scenario_args(p)
    p.add_argument("--csv", action="store_true", help="print CSV: one row per parameter, with its bucket")
    p.add_argument("--stage", type=non_negative_int, default=0,
                   help="pipeline stage whose buckets to list (default 0; `simulate` reports its reported_stage's)")
    p.set_defaults(func=cmd_buckets)

    p = sub.add_parser("memory", help="per-GPU memory: model states, activations, buffers; does it fit?")
    scenario_args(p)
    p.add_argument("--stage", type=non_negative_int, help="report this pipeline stage (default: the most loaded)")
    p.add_argument("--max-micro-batch", action="store_true", help="also find the largest micro-batch that fits")
    p.add_argument("--fit-layout", action="store_true",
                   help="also search ZeRO stage x tp x pp x sequence parallelism x recompute for layouts that fit, "
                   "and list every layout evaluated")
    p.add_argument("--num-gpus", type=positive_int, help="GPUs for --fit-layout (default: the scenario's cluster)")
    p.set_defaults(func=cmd_memory)

    from simddp.collectives import ALGORITHMS, OPS

    p = sub.add_parser("collective", help="time of one collective (nccl-tests algbw/busbw)")
    p.add_argument("op", choices=OPS)
    p.add_argument("--bytes", help="message size: bytes, or 256MiB (binary, 2^20), 256MB (decimal, 10^6), 1Gbit; "
                   "omitted: an nccl-tests-like sweep 8 B .. 8 GiB")
    p.add_argument("--cluster", default="dgx-h100-80gb", choices=sorted(CLUSTER_PRESETS))
    p.add_argument("--num-nodes", type=positive_int, default=1)
    p.add_argument("--gpus-per-node", type=positive_int)
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS)
    p.add_argument("--protocol", default="auto", choices=("auto", "LL", "LL128", "Simple"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_collective)

    p = sub.add_parser("presets", help="list cluster and model presets; `presets show NAME` prints one's values")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_presets)
    shows = p.add_subparsers(dest="presets_command")
    q = shows.add_parser("show", help="every value of a preset, as YAML to paste into a scenario")
    q.add_argument("name", help="a cluster or model preset (see `simddp presets`)")
    q.add_argument("--json", dest="show_json", action="store_true", help="print JSON")

    p = sub.add_parser("schema", help="every scenario key with its type, unit, default, bounds and description")
    p.add_argument("path", nargs="?", metavar="KEY.PATH", help="only this key or section, e.g. cluster.inter_node")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("init", help="print a starter scenario with every key commented (simddp init > scenario.yaml)")
    p.add_argument("--model", choices=sorted(MODEL_PRESETS), help="model preset (default: the embedded default's)")
    p.add_argument("--cluster", choices=sorted(CLUSTER_PRESETS), help="cluster preset (default: dgx-h100-80gb)")
    p.add_argument("--num-nodes", type=positive_int, help="nodes (default: the embedded default's 16)")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("calibrate", help="fit a calibration profile from torch measurements; validate it")
    cal = p.add_subparsers(dest="calibrate_command", required=True)
    q = cal.add_parser("fit", help="fit comm.json + compute.json into profile.json")
    q.add_argument("comm", help="comm.json from `simddp calibrate collect comm`")
    q.add_argument("compute", help="compute.json from `simddp calibrate collect compute`")
    q.add_argument("--out", default="profile.json", help="profile to write (default profile.json)")
    q.add_argument("--allow-partial", action="store_true",
                   help="write a profile even without the fits it needs (placeholders are marked PLACEHOLDER), "
                        "or from a collector run that stopped early")
    q.add_argument("--allow-mixed", action="store_true",
                   help="fit files from different world sizes, and comm cases of one op measured at several "
                        "numbers of ranks (the most measured count is fitted)")
    q.add_argument("--json", action="store_true", help="print the profile as JSON")
    q.set_defaults(func=cmd_calibrate_fit)
    q = cal.add_parser("merge", help="pool the repeats of several runs of one collector into one file")
    q.add_argument("files", nargs="+", help="comm, compute or ddp JSON files of the same kind")
    q.add_argument("--out", required=True, help="merged file to write")
    q.set_defaults(func=cmd_calibrate_merge)
    q = cal.add_parser("validate", help="predicted vs measured DDP steps (ddp.json), MAPE, HTML report")
    q.add_argument("profile", help="profile.json from `simddp calibrate fit`")
    q.add_argument("ddp", help="ddp.json from `simddp calibrate collect ddp`")
    q.add_argument("--html", help="report to write (default: <ddp>_report.html beside ddp.json; none with --json)")
    q.add_argument("--z", type=z_score, default=2.0, help="band width in standard errors, 0..10 (default 2)")
    q.add_argument("--extrapolate", metavar="RANKS",
                   help="also predict these world sizes, e.g. 2,8,128 (plotted in the HTML; under --json, listed "
                        "as 'extrapolated')")
    q.add_argument("--gpus-per-node", type=positive_int,
                   help="ranks per node when extrapolating (default: one node)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_calibrate_validate)
    q = cal.add_parser("predict", help="calibrated step time at other world sizes, with its uncertainty band")
    q.add_argument("profile", help="profile.json from `simddp calibrate fit`")
    q.add_argument("--ranks", default="2,8,32,128", help="data-parallel world sizes (default 2,8,32,128)")
    q.add_argument("--gpus-per-node", type=positive_int, help="ranks per node (default: all on one node)")
    q.add_argument("--bucket-cap-mb", type=bucket_cap_mb, help="DDP bucket cap, MiB (default: torch's)")
    q.add_argument("--z", type=z_score, default=2.0, help="band width in standard errors, 0..10 (default 2)")
    q.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario key, e.g. --set cluster.inter_node.kind=infiniband (repeatable)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_calibrate_predict)

    q = cal.add_parser("collect", help="run a torch collector under torchrun: comm, compute or ddp (needs torch)",
                       description="Runs `python -m torch.distributed.run [launcher options] -m "
                       "simddp_calibration.{collectives,compute,ddp_step} [collector options]`, after checking "
                       "that --out can be written. Launcher options: --nproc-per-node N (comm and ddp: 2, "
                       "compute: 1), --nnodes, --node-rank, --master-addr, --master-port, --rdzv-endpoint, "
                       "--rdzv-backend, --rdzv-id. Every other option goes to the collector; see `simddp "
                       "calibrate collect comm --help`. Results appear in --out only when complete; a run that "
                       "stops early keeps what it measured in <out>.partial.json and exits 3.")
    q.add_argument("kind", choices=sorted(COLLECTORS), help="comm: collectives; compute: per-layer times; "
                   "ddp: real DDP steps (validation)")
    q.add_argument("collector_args", nargs=argparse.REMAINDER, metavar="OPTIONS",
                   help="launcher and collector options, e.g. --nproc-per-node 8 --out comm.json")
    q.set_defaults(func=cmd_calibrate_collect)

    p = sub.add_parser("app", help="start the Streamlit what-if dashboard (on 127.0.0.1 unless --host says otherwise)")
    p.add_argument("--host", type=host_name, default="127.0.0.1",
                   help="interface to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=port_number, default=8501, help="TCP port, 1..65535 (default 8501)")
    p.add_argument("--headless", action="store_true", help="do not open a browser")
    p.set_defaults(func=cmd_app)

    from simddp.cli_search import add_commands

    add_commands(sub, scenario_args)
    for add in EXTRA_COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    stdout = sys.stdout
    sys.stdout = _NamedStdout(stdout)  # type: ignore[assignment]  # a write error on it names it
    try:
        with safeio.undo_created_dirs_on_error():  # a refused command leaves no empty output directory behind
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # a full disk behind standard output fails here, not after the error handling
            return code
    except BrokenPipeError:  # output piped into `head` and closed early
        return 0
    except (ScenarioError, UsageError, ValueError, OSError) as err:
        if isinstance(err, OSError) and err.filename == _STDOUT and stdout is sys.__stdout__:
            # `> /dev/full`: what could not be written is dropped, so the process's exit does not fail on it again
            # (only for the process's own standard output: a caller's stream is the caller's).
            stdout = open(os.devnull, "w")
        print(f"simddp: error: {safeio.one_line(err)}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"simddp: error: input nested too deeply (limit {safeio.MAX_DEPTH} levels)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug: one line, and the traceback only on request
        if os.environ.get("SIMDDP_DEBUG"):
            raise
        what = "" if isinstance(err, InternalError) else f"{type(err).__name__}: "
        print(f"simddp: internal error: {what}{safeio.one_line(err, 1000)} (a bug in simddp; please report it "
              "with the command line; SIMDDP_DEBUG=1 shows the traceback)", file=sys.stderr)
        return INTERNAL_ERROR_EXIT
    finally:
        sys.stdout = stdout


_STDOUT = "standard output"


class _NamedStdout:
    """Standard output for the length of a command: a write or flush that fails (a full disk behind it) raises an
    ``OSError`` naming it, not a nameless "[Errno 28] No space left on device"; everything else is the stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OSError(err.errno, err.strerror, _STDOUT) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OSError(err.errno, err.strerror, _STDOUT) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


if __name__ == "__main__":
    raise SystemExit(main())
