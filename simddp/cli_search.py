"""``simddp plan`` and ``simddp sweep``: many scenarios at once (layouts ranked, grids over any keys)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from simddp import safeio, units
from simddp.config import Scenario, ScenarioError, list_item_problem
from simddp.limits import MAX_PLAN_TOP
from simddp.planner import fsdp_caveat, layout_settings

ScenarioArgs = Callable[[argparse.ArgumentParser], None]


def _positive_int(text: str) -> int:
    from simddp.cli import positive_int

    return positive_int(text)


def cmd_plan(args: argparse.Namespace) -> int:
    from simddp.planner import plan_layouts, scenario_layout, terminal_progress

    scenario, cluster_sets, own, why = _plan_scenario(args)
    gpus = args.gpus or scenario.cluster.num_gpus
    result = plan_layouts(scenario, gpus, top=args.top, objective=args.objective, jobs=args.jobs,
                          progress=None if args.json else terminal_progress("plan"))
    yours = None if own is None else scenario_layout(own)
    if own is not None and yours is None:
        why = "it cannot be simulated"
    if args.json:
        print(safeio.json_text({**result.to_json_dict(), "untimed_reason": result.untimed_reason,
                                "scenario_layout": None if yours is None else yours.model_dump(),
                                "scenario_layout_reason": why}, indent=2))
        return 0
    print("\n".join(plan_lines(scenario, result, cluster_sets, yours, why)))
    return 0


def _plan_scenario(args: argparse.Namespace) -> tuple[Scenario, dict[str, Any], Scenario | None, str | None]:
    """:func:`simddp.planner.plan_start` of the scenario file with its ``--set`` flags: the scenario to plan from,
    the cluster keys it has that the user's has not, the user's scenario on those GPUs (or None) and why not."""
    from simddp.cli import scenario_dict
    from simddp.planner import plan_start

    start = plan_start(scenario_dict(args), args.gpus)
    return start.base, start.cluster_sets, start.own, start.why_not


def plan_lines(scenario: Scenario, result: Any, cluster_sets: dict[str, Any] | None = None,
               yours: Any = None, why_not_yours: str | None = None) -> list[str]:
    """The text report of a :class:`simddp.planner.PlanResult`: what was searched and what was kept, the
    ranked table, and the scenario's own layout beside it (``cluster_sets``: keys the best layout's settings
    need besides :func:`layout_settings`'; ``yours``: :func:`simddp.planner.scenario_layout`'s row, or
    ``why_not_yours``)."""
    tr, par = scenario.training, scenario.parallelism
    batch_origin = "" if tr.global_batch_size is not None else (
        f" (training.global_batch_size is null: micro_batch_size {tr.micro_batch_size} x dp {scenario.dp}, kept "
        "for every layout)")
    schedule = par.pipeline_schedule if par.pipeline_schedule != "interleaved-1f1b" else "1f1b"
    not_fit = result.evaluated - result.fitting
    searched = (f"Searched   {result.evaluated:,} layouts (tp, pp, virtual stages, dp, ZeRO, micro-batch, recompute "
                f"none/selective/full, SP, bucket cap): {result.fitting:,} fit in memory, {not_fit:,} do not")
    if result.dominated:
        searched += f" ({result.dominated:,} of them known from a smaller micro-batch or more recompute)"
    lines = [
        f"Plan       {scenario.model.preset or scenario.name} on {result.num_gpus} x {scenario.cluster.gpu.name} "
        f"({scenario.cluster.preset or 'cluster'}), global batch {scenario.global_batch_size} x {tr.seq_len} "
        f"tokens{batch_origin}",
        f"Kept       {tr.precision}, {tr.optimizer}, {scenario.ddp.implementation} data parallel, {tr.attention} "
        f"attention, schedule {schedule} (interleaved-1f1b when v > 1), and the rest of the scenario",
        searched,
    ]
    if result.fitting:
        timed = f"Simulated  {result.simulated:,} of those that fit, fastest lower bound first; the others' lower " \
                "bound could not beat the listed ones"
        if result.untimed:
            timed += (f"; {result.untimed:,} could not be simulated and are not ranked "
                      f"({safeio.one_line(result.untimed_reason or '', 160)})")
        lines.append(timed)
    lines.append("")
    if not result.layouts:
        lines.append("No layout fits in memory: try more GPUs, a larger GPU, or a smaller model or sequence.")
        return lines
    rows = [(f"{k:>3}", lay.model_dump()) for k, lay in enumerate(result.layouts, start=1)]
    if yours is not None:
        rows.append(("you", yours.model_dump()))
    # Columns as wide as their widest number (dp 262,144 on 256k GPUs overflowed a fixed width of 5).
    w = {key: max(width, *(len(str(lay[key])) for _, lay in rows))
         for key, width in (("tp", 3), ("pp", 3), ("virtual_stages", 2), ("dp", 5), ("micro_batch_size", 4))}
    lines.append(f"{'#':>3} {'tp':>{w['tp']}} {'pp':>{w['pp']}} {'v':>{w['virtual_stages']}} {'dp':>{w['dp']}} "
                 f"{'ZeRO':>4} {'mbs':>{w['micro_batch_size']}} {'recompute':>9} {'SP':>3} "
                 f"{'cap':>6} {'step time':>10} {'tokens/s':>11} {'MFU':>6} {'memory/GPU':>11}")
    for label, lay in rows:
        lines.append(
            f"{label:>3} {lay['tp']:>{w['tp']}} {lay['pp']:>{w['pp']}} {lay['virtual_stages']:>{w['virtual_stages']}} "
            f"{lay['dp']:>{w['dp']}} {lay['zero_stage']:>4} {lay['micro_batch_size']:>{w['micro_batch_size']}} "
            f"{lay['recompute']:>9} "
            f"{'yes' if lay['sequence_parallel'] else 'no':>3} {_cap(lay['bucket_cap_mb']):>6} "
            f"{units.fmt_time(lay['step_time_s']):>10} {lay['tokens_per_s']:>11,.0f} {lay['mfu']:>6.1%} "
            f"{units.fmt_bytes(lay['memory_bytes']):>11}" + ("" if lay["fits"] else "  does not fit"))
    if yours is not None:
        lines.append("you: the scenario's own layout on these GPUs, simulated the same way")
    elif why_not_yours:
        lines.append(f"The scenario's own layout is not compared: {safeio.one_line(why_not_yours, 200)}")
    best = result.layouts[0]
    caveat = fsdp_caveat(scenario, best)
    if caveat:
        lines.append(f"note: {caveat}")
    sets = {**(cluster_sets or {}), **layout_settings(scenario, result.num_gpus, best)}
    lines += ["", "Use the best with: " + " ".join(f"--set {k}={_flag(v)}" for k, v in sets.items())]
    return lines


def _flag(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_vary(items: list[str]) -> dict[str, list[Any]]:
    """``["ddp.bucket_cap_mb=25,50", ...]`` -> ``{"ddp.bucket_cap_mb": [25, 50]}`` (values parsed as YAML)."""
    from simddp.schema import schema_keys

    varies: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise ScenarioError(f"--vary {safeio.short_repr(item)}: expected key.path=v1,v2,...")
        path, raw = (part.strip() for part in item.split("=", 1))
        if not all(path.split(".")):
            raise ScenarioError(f"--vary {safeio.short_repr(item)}: empty key in the path "
                                "(expected key.path=v1,v2,...)")
        problem = list_item_problem(path, "varied")
        if problem:
            raise ScenarioError(f"--vary {path}: {problem}")
        if path in varies:
            raise ScenarioError(f"--vary {path}: given twice")
        for other in varies:  # one would overwrite part of the other: rows labelled with values they did not use
            if path.startswith(other + ".") or other.startswith(path + "."):
                raise ScenarioError(f"--vary {path}: overlaps --vary {other}; vary one or the other")
        try:
            schema_keys(path)
        except ScenarioError as err:
            raise ScenarioError(f"--vary {err}".replace("schema: ", "")) from None
        values = []
        for text in raw.split(","):
            if not text.strip():
                raise ScenarioError(f"--vary {path}: empty value in {safeio.short_repr(raw)}")
            try:
                values.append(safeio.parse_yaml(text.strip(), f"--vary {path}"))
            except safeio.MalformedInput:
                values.append(text.strip())
        varies[path] = values
    return varies


def _csv_text(rows: list[dict[str, Any]]) -> str:
    from simddp.exports import dicts_to_csv

    return dicts_to_csv(rows, list(rows[0]) if rows else [])


def cmd_sweep(args: argparse.Namespace) -> int:
    from simddp.cli import _scenario_inputs, scenario_dict
    from simddp.planner import terminal_progress
    from simddp.scenario_io import scenario_from_dict
    from simddp.sweeps import sweep_html, vary_sweep

    # The file's own keys with its --set ones, as simulate --set reads them: a point's preset or calibration
    # profile then fills in under them (from the validated scenario, its old preset's or profile's values stood).
    data = scenario_dict(args)
    scenario = scenario_from_dict(data)
    varies = parse_vary(args.vary)
    # A file a point reads (a calibration profile, say) is an input too: no output may replace it.
    inputs = _scenario_inputs(args, scenario) + sorted(
        {v for values in varies.values() for v in values if isinstance(v, str) and os.path.isfile(v)})
    outputs = [(flag, safeio.check_output(target, inputs, flag))
               for flag, target in (("--csv", args.csv), ("--html", args.html)) if target is not None]
    safeio.check_distinct(outputs)
    points = 1
    for values in varies.values():
        points *= len(values)
    if points > MAX_SWEEP_POINTS:
        raise ScenarioError(f"--vary: {points:,} combinations exceed the limit of {MAX_SWEEP_POINTS:,} per sweep")
    sweep = vary_sweep(data, varies, batch=args.batch, jobs=args.jobs,
                       progress=None if args.json else terminal_progress("sweep"))
    rows = sweep.rows()
    # Every text is made before any file is written: one that fails (an internal error) leaves no output behind.
    texts = [(flag, target, make()) for flag, target, make in (
        ("--csv", args.csv, lambda: _csv_text(rows)), ("--html", args.html, lambda: sweep_html(sweep)))
        if target is not None]
    shown = safeio.json_text({"scenario": sweep.scenario, "paths": sweep.paths,
                              "points": [_typed_json(row) for row in rows]}, indent=2) if args.json else None
    written = []
    with safeio.writes_together():  # both outputs, or neither where one fails
        for flag, target, text in texts:
            written.append(safeio.write_text(target, text, inputs, flag))
    if shown is not None:
        print(shown)
    else:
        print("\n".join(sweep_lines(sweep)))
        for path in written:
            print(f"written: {safeio.shown_path(path)}")
    if sweep.points and not any(p.ok for p in sweep.points):
        # Every row is kept and written, but nothing was answered: a script must not take that for a result.
        first = safeio.one_line(sweep.points[0].error, 200)
        print(f"simddp: error: every point of the sweep is invalid (the first: {first})", file=sys.stderr)
        return 2
    return 0


def _typed_json(value: Any) -> Any:
    """A sweep row for JSON: a varied value that is not a finite number, at any depth (``--vary
    ddp.bucket_cap_mb=1e400``, ``--vary 'training={seq_len: 1e400}'``: invalid points that keep what was typed), as
    its text, ``"inf"``, since strict JSON has no infinity. Probes found such rows ending the command with an
    internal error, at the top level of a row and then (2026-11-29) inside a varied mapping or list."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _typed_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_typed_json(v) for v in value]
    return value


#: Most combinations one ``simddp sweep`` evaluates (each is a full simulation).
MAX_SWEEP_POINTS = 100_000


def _cap(cap_mb: float | None) -> str:
    """A row's bucket cap: MiB, or the implementation's default (the scenario's own layout with a null cap)."""
    return "dflt" if cap_mb is None else f"{cap_mb:g}Mi"


def _value_text(value: Any) -> str:
    """A varied value in the table: floats short (2.5e+10, 25), the rest as they are."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def sweep_lines(sweep: Any) -> list[str]:
    """One row per point: the varied values, step time, exposed communication, MFU, memory; or the reason."""
    shown = [[_value_text(pt.values[p]) for p in sweep.paths] for pt in sweep.points]
    widths = [max(len(p), *(len(row[k]) for row in shown)) for k, p in enumerate(sweep.paths)]
    head = "  ".join(f"{p:<{w}}" for p, w in zip(sweep.paths, widths, strict=True))
    lines = [f"Sweep      {sweep.scenario}: {len(sweep.points)} points "
             f"({sum(not p.ok for p in sweep.points)} invalid, kept with their reason)", "",
             f"{head}  {'step time':>10}  {'exposed':>8}  {'MFU':>6}  {'memory/GPU':>11}  fits"]
    for pt, row in zip(sweep.points, shown, strict=True):
        keys = "  ".join(f"{v:<{w}}" for v, w in zip(row, widths, strict=True))
        if not pt.ok:
            lines.append(f"{keys}  invalid: {safeio.one_line(pt.error, 200)}")
            continue
        mem = units.fmt_bytes(pt.memory_bytes) if pt.memory_bytes is not None else "-"
        fits = "-" if pt.memory_fits is None else ("yes" if pt.memory_fits else "NO")
        lines.append(f"{keys}  {units.fmt_time(pt.step_time_s or 0.0):>10}  {pt.exposed_comm_fraction or 0.0:>8.1%}  "
                     f"{pt.mfu or 0.0:>6.1%}  {mem:>11}  {fits}")
    return lines


def add_commands(sub: argparse._SubParsersAction, scenario_args: ScenarioArgs) -> None:  # type: ignore[type-arg]
    from simddp.planner import OBJECTIVES

    p = sub.add_parser("plan", help="the fastest parallel layouts that fit: tp, pp, virtual stages, dp, ZeRO, "
                                    "micro-batch, recompute, sequence parallel, bucket cap",
                       description="Search the scenario's parallel layout (tp, pp, virtual stages, dp, ZeRO stage, "
                                   "micro-batch size, recompute none/selective/full, sequence parallelism, bucket "
                                   "cap) for the fastest that fit; the model, global batch, precision, optimizer, "
                                   "implementation, schedule and cluster are the scenario's. The scenario's own "
                                   "layout is listed beside the ranking ('you') when it is valid on those GPUs.")
    scenario_args(p)
    p.add_argument("--gpus", type=_positive_int, help="GPUs to plan for (default: the scenario's cluster)")
    p.add_argument("--top", type=_positive_int, default=10,
                   help=f"layouts to list (default 10, at most {MAX_PLAN_TOP})")
    p.add_argument("--objective", choices=OBJECTIVES, default="step_time",
                   help="rank by step time (default) or tokens per second (the same order: the batch and "
                        "sequence are the scenario's for every layout)")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="worker processes for the memory check of the candidates (default 1; same answer; at most "
                        "the CPUs)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("sweep", help="a grid over any scenario keys: --vary key.path=v1,v2,... (repeatable)")
    scenario_args(p)
    p.add_argument("--vary", action="append", default=[], required=True, metavar="KEY.PATH=V1,V2,...",
                   help="values of one scenario key (repeatable: every combination is simulated)")
    p.add_argument("--csv", metavar="FILE", help="write every point (invalid ones with their reason) as CSV")
    p.add_argument("--html", metavar="FILE", help="write a self-contained plotly report")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="worker processes (default 1; at most the CPUs and the points)")
    p.add_argument("--batch", choices=("weak", "strong"), default="weak",
                   help="when the cluster size varies: weak scales the global batch with the GPUs (the "
                        "base's samples per data-parallel replica, at the base's layout; default), strong "
                        "keeps the global batch")
    p.set_defaults(func=cmd_sweep)


__all__ = ["add_commands", "cmd_plan", "cmd_sweep", "parse_vary", "plan_lines", "sweep_lines"]
