"""The ``simddp`` command: simulate, buckets, collective, presets, memory, calibrate, app.

Every user error (bad scenario, preset, flag, file) prints one line ``simddp: error: ...`` and exits 2,
with no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from simddp import __version__, units
from simddp.config import Cluster, Scenario, ScenarioError, format_validation_error, load_scenario
from simddp.presets import CLUSTER_PRESETS, MODEL_PRESETS

DEFAULT_SCENARIO = "default_scenario.yaml"


class UsageError(Exception):
    """A bad command-line value."""


def default_scenario_path() -> Path:
    return Path(str(resources.files("simddp").joinpath(DEFAULT_SCENARIO)))


def _load(args: argparse.Namespace) -> Scenario:
    path = args.scenario or default_scenario_path()
    return load_scenario(path, args.set)


def parse_size(text: str) -> int:
    """Bytes from '1048576', '256MiB' (binary), '256MB' (decimal) or '1Gbit' (:func:`units.parse_size`)."""
    try:
        value = units.parse_size(text)
    except ValueError as err:
        raise UsageError(f"--bytes {text!r}: {err}") from None
    if value <= 0:
        raise UsageError(f"--bytes {text!r}: must be > 0")
    return value


def _checked_number(text: str, kind: type, minimum: float, inclusive: bool) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not (value >= minimum if inclusive else value > minimum):
        raise argparse.ArgumentTypeError(f"{value} must be {'>=' if inclusive else '>'} {minimum}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer > 0 (the message names the value)."""
    return int(_checked_number(text, int, 0, inclusive=False))


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return int(_checked_number(text, int, 0, inclusive=True))


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    return float(_checked_number(text, float, 0.0, inclusive=False))


# ------------------------------------------------------------------------------------- commands
def _verdict_lines(memory: Any) -> list[str]:
    """The first lines of a report whose layout does not fit in memory (none when it fits)."""
    from simddp.verdict import HYPOTHETICAL, MemoryVerdict

    if memory is None or memory.fits:
        return []
    return [MemoryVerdict.of(memory).headline(), HYPOTHETICAL, ""]


def cmd_simulate(args: argparse.Namespace) -> int:
    from simddp.sim import simulate_step
    from simddp.verdict import MemoryVerdict, verdict_json

    scenario = _load(args)
    result = simulate_step(scenario, trace=bool(args.trace or args.csv))
    if args.trace:
        assert result.trace is not None
        result.trace.write(args.trace)
    if args.csv:
        from simddp.exports import write_step_csv

        written = write_step_csv(args.csv, scenario, result, verdict_json(result.memory))
    if args.json:
        print(json.dumps({**verdict_json(result.memory), **result.to_json_dict()}, indent=2))
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
        f"  data-parallel comm     {f(result.comm_time_s):>12}   {len(result.buckets)} "
        f"{'FSDP units' if scenario.parallelism.zero_stage == 3 and result.pp == 1 else 'buckets'}, "
        f"{', '.join(algos) or '-'}",
    ]
    if result.tp > 1:
        lines.append(f"  tensor-parallel comm   {f(result.tp_comm_time_s):>12}   blocking, inside the layers")
    if result.pp > 1:
        lines.append(f"  pipeline bubble        {f(result.pipeline_bubble_time_s):>12}   "
                     f"{scenario.parallelism.pipeline_schedule}, {result.reported_rank}")
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
    if args.trace:
        lines.append(f"  trace written to {args.trace} (open in https://ui.perfetto.dev)")
    if args.csv:
        lines.append(f"  tables written: {', '.join(str(p) for p in written)}")
    print("\n".join(lines))
    return 0


def cmd_buckets(args: argparse.Namespace) -> int:
    from simddp.exports import bucket_export

    scenario = _load(args)
    export = bucket_export(scenario)
    if args.json:
        print(json.dumps(export.to_json_dict()))
        return 0
    if args.csv:
        print(export.to_csv(), end="")
        return 0
    buckets = export.buckets
    par = scenario.parallelism
    where = f"pipeline stage 0 of {par.pp}, " if par.pp > 1 else ""
    print(f"{len(buckets)} buckets, {units.fmt_bytes(sum(b.size_bytes for b in buckets))} of gradients "
          f"({where}tp shard {(par.tp > 1 and f'1 of {par.tp}') or 'whole model'}; parameter indices are this "
          "rank's, in model.parameters() order)")
    if par.zero_stage == 3:
        print("note: with zero_stage 3, FSDP reduce-scatters per unit instead (see simddp simulate --trace)")
    print(f"{'#':>4} {'size':>12} {'dtype':>9} {'params':>7}  first .. last parameter")
    for b in buckets:
        print(f"{b.index:>4} {units.fmt_bytes(b.size_bytes):>12} {b.dtype:>9} {len(b.params):>7}  "
              f"{b.params[0].name} .. {b.params[-1].name}")
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
        print(json.dumps(out, indent=2))
        return 0
    fb, tr, par = units.fmt_bytes, scenario.training, scenario.parallelism
    flight = f"{mem.in_flight_micro_batches:g}"
    lines = [
        *_verdict_lines(mem)[:1], *([""] if not mem.fits else []),
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
        f"  {'total':<28}{fb(mem.total_bytes):>12}   {MemoryVerdict.of(mem).short()}",
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
        lines += ["", *_layout_lines(layout)]
    print("\n".join(lines))
    return 0


def _layout_lines(layout: Any) -> list[str]:
    """The answers of `memory --fit-layout`, then every layout it evaluated (fitting ones first)."""
    fb = units.fmt_bytes
    fitting = sum(f.fits for f in layout.evaluated)
    lines = [f"Layouts on {layout.num_gpus} GPUs: {layout.num_layouts} evaluated (ZeRO stage x tp x pp x sequence "
             f"parallelism x recompute), {fitting} fit"]
    rows = [("current", layout.current), ("smallest ZeRO stage", layout.smallest_zero_stage),
            ("least recompute", layout.least_recompute), ("smallest tp", layout.smallest_tp),
            ("smallest pp", layout.smallest_pp), ("least model parallel", layout.best)]
    for name, fit in rows:
        if fit is None:
            lines.append(f"  {name:<22}{'invalid layout' if name == 'current' else 'none fits'}")
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
    group = world_group(cluster)
    if group.num_ranks < 2:
        raise UsageError(f"a collective needs at least 2 ranks (got {group.num_ranks} GPU)")
    sizes = [parse_size(args.bytes)] if args.bytes else [8 * 4**k for k in range(16)]
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
        print(json.dumps(out[0] if args.bytes else out, indent=2))
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

        if args.show_json:
            section, values = preset_values(args.name)
            print(json.dumps({section: values}, indent=2))
        else:
            print(preset_yaml(args.name), end="")
        return 0
    groups = {"clusters": CLUSTER_PRESETS, "models": MODEL_PRESETS}
    if args.json:
        from simddp.schema import preset_values

        print(json.dumps({k: {n: {"description": p.description, "source": p.source, "values": preset_values(n)[1]}
                              for n, p in v.items()} for k, v in groups.items()}, indent=2))
        return 0
    for title, presets in groups.items():
        print(f"{title}:")
        for name, p in presets.items():
            print(f"  {name:<18} {p.description}  [{p.source}]")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from simddp.schema import schema_keys

    keys = schema_keys(args.path or "")
    if args.json:
        print(json.dumps([k.model_dump(mode="json") for k in keys], indent=2))
        return 0
    print("\n".join(k.to_text() for k in keys))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from simddp.config import read_mapping
    from simddp.schema import starter_scenario

    base = read_mapping(default_scenario_path())
    print(starter_scenario(base, args.model, args.cluster, args.num_nodes), end="")
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    app = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    if not app.exists():
        raise UsageError(f"dashboard not found at {app}; install simddp from its source tree")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(args.port)]
    if args.headless:
        cmd += ["--server.headless", "true"]
    # Replace this process, so that stopping `simddp app` stops the server too.
    os.execv(sys.executable, cmd)
    return 0  # not reached


def cmd_calibrate_fit(args: argparse.Namespace) -> int:
    from simddp.fit import fit_profile
    from simddp.profile import CommMeasurements, ComputeMeasurements, read_calibration_file, write_json

    comm = read_calibration_file(args.comm, CommMeasurements)
    compute = read_calibration_file(args.compute, ComputeMeasurements)
    profile = fit_profile(comm, compute, sources={"comm": str(args.comm), "compute": str(args.compute)})
    write_json(profile, args.out)
    if args.json:
        print(profile.model_dump_json(indent=1))
        return 0
    run = profile.comm_run
    print(f"Collectives measured on {run.world_size} ranks ({run.num_nodes} host(s), {run.backend}, "
          f"{run.device_names[0] if run.device_names else run.device})")
    print(f"{'op':<15}{'group':<11}{'tier':<6}{'sizes':>23} {'alpha/step':>11} {'busbw':>11} {'R2':>7} "
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
    for note in profile.notes:
        if note.startswith(("fitted from partial", "parameter dtypes", "overlap")):
            print(f"note: {note}")
    print(f"wrote {args.out}")
    return 0


def cmd_calibrate_merge(args: argparse.Namespace) -> int:
    from simddp.profile import merge_measurements, read_measurements, write_json

    merged = merge_measurements([read_measurements(f) for f in args.files])  # type: ignore[type-var]
    write_json(merged, args.out)
    print(f"merged {len(args.files)} {merged.kind} files into {args.out}")
    return 0


def cmd_calibrate_validate(args: argparse.Namespace) -> int:
    from simddp.profile import DDPMeasurements, read_calibration_file
    from simddp.report import extrapolate, validate, write_html

    ddp = read_calibration_file(args.ddp, DDPMeasurements)
    if not ddp.cases:
        raise ScenarioError(f"{args.ddp}: no DDP step measured")
    report = validate(args.profile, ddp, args.ddp, z=args.z)
    sizes = _world_sizes(args.extrapolate) if args.extrapolate else []
    cap = ddp.cases[-1].bucket_cap_mb
    extra = extrapolate(args.profile, sizes, args.gpus_per_node, cap, z=args.z) if sizes else []
    html = Path(args.html) if args.html else Path(args.ddp).with_name(Path(args.ddp).stem + "_report.html")
    if args.json:
        print(json.dumps(report.to_json_dict(), indent=2))
    else:
        print(report.to_text())
    write_html(report, html, extra)
    if not args.json:
        print(f"report written to {html}")
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
    preds = extrapolate(args.profile, _world_sizes(args.ranks), args.gpus_per_node, args.bucket_cap_mb,
                        overrides, z=args.z)
    if args.json:
        print(json.dumps([p.model_dump() for p in preds], indent=2))
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
    try:
        sizes = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise UsageError(f"world sizes {text!r}: expected integers such as 2,8,128") from None
    if not sizes or any(n < 1 for n in sizes):
        raise UsageError(f"world sizes {text!r}: expected integers >= 1")
    return sizes


# ------------------------------------------------------------------------------------- parser
EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []  # type: ignore[type-arg]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    p.add_argument("--csv", metavar="DIR", help="write summary.csv, buckets.csv and layers.csv into DIR")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("buckets", help="DDP gradient buckets, exactly as torch builds them")
    scenario_args(p)
    p.add_argument("--csv", action="store_true", help="print CSV: one row per parameter, with its bucket")
    p.set_defaults(func=cmd_buckets)

    p = sub.add_parser("memory", help="per-GPU memory: model states, activations, buffers; does it fit?")
    scenario_args(p)
    p.add_argument("--stage", type=int, help="report this pipeline stage (default: the most loaded)")
    p.add_argument("--max-micro-batch", action="store_true", help="also find the largest micro-batch that fits")
    p.add_argument("--fit-layout", action="store_true",
                   help="also search ZeRO stage x tp x pp x sequence parallelism x recompute for layouts that fit, "
                   "and list every layout evaluated")
    p.add_argument("--num-gpus", type=int, help="GPUs for --fit-layout (default: the scenario's cluster)")
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
    q.add_argument("comm", help="comm.json from `torchrun ... -m calibration.collectives`")
    q.add_argument("compute", help="compute.json from `python -m calibration.compute`")
    q.add_argument("--out", default="profile.json", help="profile to write (default profile.json)")
    q.add_argument("--json", action="store_true", help="print the profile as JSON")
    q.set_defaults(func=cmd_calibrate_fit)
    q = cal.add_parser("merge", help="pool the repeats of several runs of one collector into one file")
    q.add_argument("files", nargs="+", help="comm, compute or ddp JSON files of the same kind")
    q.add_argument("--out", required=True, help="merged file to write")
    q.set_defaults(func=cmd_calibrate_merge)
    q = cal.add_parser("validate", help="predicted vs measured DDP steps (ddp.json), MAPE, HTML report")
    q.add_argument("profile", help="profile.json from `simddp calibrate fit`")
    q.add_argument("ddp", help="ddp.json from `torchrun ... -m calibration.ddp_step`")
    q.add_argument("--html", help="report to write (default: <ddp>_report.html beside ddp.json)")
    q.add_argument("--z", type=positive_float, default=2.0, help="band width in standard errors (default 2)")
    q.add_argument("--extrapolate", metavar="RANKS", help="also plot predictions for these world sizes, e.g. 2,8,128")
    q.add_argument("--gpus-per-node", type=positive_int,
                   help="ranks per node when extrapolating (default: one node)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_calibrate_validate)
    q = cal.add_parser("predict", help="calibrated step time at other world sizes, with its uncertainty band")
    q.add_argument("profile", help="profile.json from `simddp calibrate fit`")
    q.add_argument("--ranks", default="2,8,32,128", help="data-parallel world sizes (default 2,8,32,128)")
    q.add_argument("--gpus-per-node", type=positive_int, help="ranks per node (default: all on one node)")
    q.add_argument("--bucket-cap-mb", type=float, help="DDP bucket cap, MiB (default: torch's)")
    q.add_argument("--z", type=positive_float, default=2.0, help="band width in standard errors (default 2)")
    q.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario key, e.g. --set cluster.inter_node.kind=infiniband (repeatable)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_calibrate_predict)

    p = sub.add_parser("app", help="start the Streamlit what-if dashboard")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--headless", action="store_true")
    p.set_defaults(func=cmd_app)

    for add in EXTRA_COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and closed early
        return 0
    except (ScenarioError, UsageError, ValueError, OSError) as err:
        print(f"simddp: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
