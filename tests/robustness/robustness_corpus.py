"""A corpus of hostile inputs and faults, and the judge of what a clean outcome is.

Each :class:`Case` runs one ``simddp`` command (or a Python snippet using the API or the dashboard's
AppTest) in a fresh temporary folder. A clean outcome is either

* a valid result: exit 0, strict JSON for ``--json`` (no NaN, no Infinity), sane numbers; or
* one clean error line: a non-zero documented exit status (2, or 3 for a collector's partial run), one
  line on stderr, no traceback, no terminal escape sequences;

within the case's time bound, with every input file unchanged, and nothing outside the case's folder
touched (a "victim" file in a separate folder, which planted symlinks point to, keeps its content).

The corpus imports nothing from simddp, so that the same cases can probe an older checkout
(``tests/robustness/robustness_probe.py --root OLD --old``), and the suite (``test_corpus.py``) runs it in-process.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------- fixtures
SCENARIO = """name: probe
cluster: {preset: dgx-h100-80gb, num_nodes: 2}
model: {preset: gpt2}
training: {micro_batch_size: 2, seq_len: 1024}
"""


def _stats(t: float) -> dict[str, Any]:
    times = [t * f for f in (0.98, 0.99, 1.0, 1.0, 1.01, 1.02)]
    return {"times_s": times, "median_s": t, "p10_s": t * 0.985, "p90_s": t * 1.015, "min_s": min(times),
            "max_s": max(times), "num_outliers": 0}


def _run(world: int = 2) -> dict[str, Any]:
    return {"world_size": world, "num_nodes": 1, "ranks_per_node": world, "backend": "gloo", "device": "cpu",
            "hosts": ["h"] * world, "device_names": ["cpu"] * world, "torch_version": "2.13.0", "num_threads": 1,
            "started_at": "2026-01-01T00:00:00+00:00"}


_BUSBW = {"all-reduce": lambda n: 2 * (n - 1) / n, "reduce-scatter": lambda n: (n - 1) / n,
          "all-gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def comm_dict(world: int = 2, ops: Sequence[str] = tuple(_BUSBW), sizes: Sequence[int] | None = None,
              complete: bool = True) -> dict[str, Any]:
    """Exact alpha-beta ring timings (alpha 20 us per step, 2 GB/s bus bandwidth)."""
    sizes = sizes if sizes is not None else [2**k for k in range(10, 27, 2)]
    cases = []
    for op in ops:
        steps = 2 * (world - 1) if op == "all-reduce" else world - 1
        for s in sizes:
            cases.append({"op": op, "group": "world", "tier": "intra", "num_ranks": world, "num_nodes": 1,
                          "size_bytes": s, "iters": 1, "stats": _stats(steps * 20e-6 + s * _BUSBW[op](world) / 2e9)})
    inter = [{"size_bytes": 4 * 2**20, "compute_alone_s": 0.03, "comm_alone_s": 0.01, "both_s": 0.032,
              "comm_in_both_s": 0.011, "repeats": 3, "lost_fractions": [0.18, 0.2, 0.22]}]
    return {"kind": "simddp-comm", "version": 1, "complete": complete, "run": _run(world), "cases": cases,
            "interference": inter}


def compute_dict(world: int = 2, complete: bool = True, micro_batch: int = 8, model: str = "toy.py:build"
                 ) -> dict[str, Any]:
    params, layers = [], [{"name": "(other ops)", "param_indices": [], "fwd": _stats(1e-3), "bwd": _stats(5e-4)}]
    for i in range(4):
        params += [{"name": f"l{i}.weight", "numel": 250_000, "dtype": "float32", "module": f"l{i}"},
                   {"name": f"l{i}.bias", "numel": 500, "dtype": "float32", "module": f"l{i}"}]
        layers.append({"name": f"l{i}", "param_indices": [2 * i, 2 * i + 1], "fwd": _stats(2e-3), "bwd": _stats(4e-3)})
    order = [j for i in reversed(range(4)) for j in (2 * i + 1, 2 * i)]
    return {"kind": "simddp-compute", "version": 1, "complete": complete, "run": _run(world), "model": model,
            "optimizer": "sgd", "micro_batch_size": micro_batch, "input_shapes": [[micro_batch, 64]],
            "parameters": params, "grad_ready_order": order, "layers": layers, "forward": _stats(9e-3),
            "backward": _stats(17e-3), "optimizer_step": _stats(1e-3), "host": _stats(3e-4), "step": _stats(27.3e-3),
            "ddp_overhead": _stats(5e-4),
            "peak": {"matmul_flop_per_s": 5e10, "copy_bytes_per_s": 2e10, "memory_bytes": 8 * 2**30}}


def ddp_dict(world: int = 2, model: str = "toy.py:build", micro_batch: int = 8, median_s: float = 0.05
             ) -> dict[str, Any]:
    cases = [{"bucket_cap_mb": cap, "num_buckets": 0, "bucket_sizes_bytes": [], "stats": _stats(median_s)}
             for cap in (1.0, 25.0)]
    return {"kind": "simddp-ddp", "version": 1, "complete": True, "run": _run(world), "model": model,
            "optimizer": "sgd", "micro_batch_size": micro_batch, "cases": cases}


def poisoned(data: dict[str, Any], value: str) -> str:
    """``data`` as JSON with its first ``median_s`` replaced by ``value`` (e.g. NaN, Infinity, 0)."""
    return re.sub(r'"median_s": [-+0-9.eE]+', f'"median_s": {value}', json.dumps(data), count=1)


def write_fixtures(folder: Path, run_cli: Callable[[Sequence[str], Path], Any]) -> None:
    """sc.yaml, comm.json, compute.json, ddp.json, and profile.json fitted by the simddp under test."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sc.yaml").write_text(SCENARIO)
    (folder / "comm.json").write_text(json.dumps(comm_dict()))
    (folder / "compute.json").write_text(json.dumps(compute_dict()))
    (folder / "ddp.json").write_text(json.dumps(ddp_dict()))
    run_cli(["calibrate", "fit", "comm.json", "compute.json", "--out", "profile.json"], folder)


# ------------------------------------------------------------------------------------------ cases
Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """One probe: a ``simddp`` command line (``argv``) or a Python snippet (``code``), run in a fresh folder."""

    name: str
    argv: tuple[str, ...] = ()
    code: str = ""
    copy: tuple[str, ...] = ()  # fixture files copied into the case's folder
    setup: Setup | None = None
    expect: str = "either"  # "error": must be refused cleanly; "ok": must succeed; "either"
    unchanged: tuple[str, ...] = ()  # files whose content (or kind) must survive the command
    stdout_has: str = ""  # text a successful run must print (e.g. a warning)
    error_has: str = ""  # text the error line must hold (the file and the measurement it names)
    timeout_s: float = 60.0
    torch: bool = False  # needs torch (a collector)
    subprocess: bool = False  # must run in its own process (starts a server, or torchrun)
    old_argv: tuple[str, ...] | None = None  # the same fault through an older checkout's commands
    tags: tuple[str, ...] = field(default_factory=tuple)


def _files(**contents: str | bytes) -> Setup:
    def setup(folder: Path) -> None:
        for name, content in contents.items():
            path = folder / name.replace("__", ".")
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
    return setup


def _scenario(extra: str) -> Setup:
    return _files(bad__yaml=SCENARIO + extra)


def _json_file(name: str, data: Any) -> Setup:
    return _files(**{name.replace(".", "__"): json.dumps(data)})


def _fifo(name: str) -> Setup:
    return lambda folder: os.mkfifo(folder / name)


def _null_device(name: str) -> Setup:
    """A character device like /dev/null, inside the case's folder (needs root; else a FIFO)."""
    def setup(folder: Path) -> None:
        try:
            os.mknod(folder / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except (PermissionError, AttributeError):
            os.mkfifo(folder / name)
    return setup


def _symlink_to_victim(name: str) -> Setup:
    def setup(folder: Path) -> None:
        os.symlink(folder.parent / "outside" / "victim.txt", folder / name)
    return setup


def _both(*setups: Setup) -> Setup:
    def setup(folder: Path) -> None:
        for s in setups:
            s(folder)
    return setup


def _deep(n: int) -> str:
    return "model: {preset: gpt2}\ncluster: {preset: dgx-h100-80gb, num_nodes: 1}\nx: " + "[" * n + "]" * n + "\n"


def _params_scenario(n: int) -> str:
    lines = ["cluster: {preset: dgx-h100-80gb, num_nodes: 1}", "training: {seq_len: 1}", "model:", "  parameters:"]
    lines += [f"  - {{name: p{i}, numel: 1000}}" for i in range(n)]
    return "\n".join(lines) + "\n"


def _invalid_entries(n: int) -> str:
    lines = ["cluster: {preset: dgx-h100-80gb, num_nodes: 1}", "training: {seq_len: 1}", "model:", "  parameters:"]
    lines += [f"  - {{name: p{i}, numel: -1}}" for i in range(n)]
    return "\n".join(lines) + "\n"


def _alias_bomb() -> str:
    rows = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, 9):
        prev, cur = chr(96 + i), chr(97 + i)
        rows.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 10)}]")
    return "model: {preset: gpt2}\ncluster: {preset: dgx-h100-80gb, num_nodes: 1}\nname: x\nbomb:\n" + "\n".join(
        "  " + r for r in rows) + "\n"


def _big_yaml(size_bytes: int) -> Setup:
    def setup(folder: Path) -> None:
        line = "# " + "x" * 97 + "\n"
        with open(folder / "big.yaml", "w") as fh:
            fh.write(SCENARIO)
            fh.write(line * (size_bytes // len(line) + 1))
    return setup


SIM = ("simulate", "bad.yaml", "--json")
CAL = ("comm.json", "compute.json", "profile.json", "ddp.json", "sc.yaml")

_FLOAT_FIELDS = [
    "cluster.host_overhead_s", "cluster.comm_compute_interference", "cluster.intra_node.latency_s",
    "cluster.intra_node.bandwidth_bytes_per_s", "cluster.intra_node.nvls_latency_s",
    "cluster.inter_node.nic_bandwidth_bytes_per_s", "cluster.inter_node.latency_s",
    "cluster.gpu.peak_bf16_flop_per_s", "cluster.gpu.hbm_bandwidth_bytes_per_s", "ddp.bucket_cap_mb",
    "training.optimizer_time_s",
]


def _collector(kind: str, *args: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(new argv, old command) of a collector run on 2 gloo ranks (compute: 1 process)."""
    module = {"comm": "collectives", "compute": "compute", "ddp": "ddp_step"}[kind]
    nproc = "1" if kind == "compute" else "2"
    new = ("calibrate", "collect", kind, "--nproc-per-node", nproc, *args)
    old = ("{python}", "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
           f"calibration.{module}", *args)
    return new, old


def cases() -> list[Case]:
    out: list[Case] = []

    def add(name: str, argv: Sequence[str] = (), **kw: Any) -> None:
        out.append(Case(name=name, argv=tuple(argv), **kw))

    # ---- 1. outputs that destroy files
    add("fit --out is an input (comm.json)", ["calibrate", "fit", "comm.json", "compute.json", "--out", "comm.json"],
        copy=CAL, expect="error", unchanged=("comm.json",))
    add("fit --out is an input (compute.json)",
        ["calibrate", "fit", "comm.json", "compute.json", "--out", "./compute.json"], copy=CAL, expect="error",
        unchanged=("compute.json",))
    add("fit --out is a symlink to an input", ["calibrate", "fit", "comm.json", "compute.json", "--out", "link.json"],
        copy=CAL, setup=lambda f: os.symlink(f / "comm.json", f / "link.json"), expect="error",
        unchanged=("comm.json",))
    add("merge --out is an input", ["calibrate", "merge", "comm.json", "comm2.json", "--out", "comm2.json"],
        copy=CAL, setup=_json_file("comm2.json", comm_dict()), expect="error", unchanged=("comm2.json",))
    add("validate --html is the profile", ["calibrate", "validate", "profile.json", "ddp.json", "--html",
                                           "profile.json"], copy=CAL, expect="error", unchanged=("profile.json",))
    add("validate --html is the DDP file", ["calibrate", "validate", "profile.json", "ddp.json", "--html", "ddp.json"],
        copy=CAL, expect="error", unchanged=("ddp.json",))
    add("simulate --trace is the scenario", ["simulate", "sc.yaml", "--trace", "sc.yaml"], copy=CAL, expect="error",
        unchanged=("sc.yaml",))
    add("fit --out is a device node", ["calibrate", "fit", "comm.json", "compute.json", "--out", "null"], copy=CAL,
        setup=_null_device("null"), expect="error", unchanged=("null",))
    add("fit --out is a FIFO", ["calibrate", "fit", "comm.json", "compute.json", "--out", "fifo"], copy=CAL,
        setup=_fifo("fifo"), expect="error", unchanged=("fifo",), timeout_s=20)
    add("simulate --trace is a device node", ["simulate", "sc.yaml", "--trace", "null"], copy=CAL,
        setup=_null_device("null"), expect="error", unchanged=("null",))
    add("simulate --trace is a FIFO", ["simulate", "sc.yaml", "--trace", "fifo"], copy=CAL, setup=_fifo("fifo"),
        expect="error", unchanged=("fifo",), timeout_s=20)
    add("simulate --trace is a directory", ["simulate", "sc.yaml", "--trace", "."], copy=CAL, expect="error")
    add("validate --html is a device node", ["calibrate", "validate", "profile.json", "ddp.json", "--html", "null"],
        copy=CAL, setup=_null_device("null"), expect="error", unchanged=("null",))
    add("merge --out is a directory", ["calibrate", "merge", "comm.json", "--out", "sub"], copy=CAL,
        setup=lambda f: (f / "sub").mkdir(), expect="error")
    add("fit with a planted temp symlink", ["calibrate", "fit", "comm.json", "compute.json", "--out", "target.json"],
        copy=CAL, setup=_symlink_to_victim("target.json.tmp"))
    add("merge with a planted temp symlink", ["calibrate", "merge", "comm.json", "--out", "merged.json"], copy=CAL,
        setup=_symlink_to_victim("merged.json.tmp"))
    add("fit --out in a folder that cannot exist", ["calibrate", "fit", "comm.json", "compute.json", "--out",
                                                    "/proc/simddp-probe/profile.json"], copy=CAL, expect="error")
    add("simulate --trace cannot be created", ["simulate", "sc.yaml", "--trace", "/proc/simddp-probe/t.json"],
        copy=CAL, expect="error")
    add("fit --out into a new folder", ["calibrate", "fit", "comm.json", "compute.json", "--out", "new/dir/p.json"],
        copy=CAL, expect="ok")
    add("simulate --trace to a fresh file", ["simulate", "sc.yaml", "--trace", "trace.json"], copy=CAL, expect="ok")

    # ---- 2. bounded cost
    add("30k-parameter list (quadratic memory code)", ["memory", "big.yaml"],
        setup=_files(big__yaml=_params_scenario(30_000)), expect="ok", timeout_s=60)
    add("parameter list at the cap", ["simulate", "big.yaml", "--json"],
        setup=_files(big__yaml=_params_scenario(2**16)), expect="ok", timeout_s=60)
    add("parameter list over the cap", ["simulate", "big.yaml", "--json"],
        setup=_files(big__yaml=_params_scenario(2**16 + 1)), expect="error", error_has="model.parameters: 65,537")
    add("--fit-layout --num-gpus 1e9", ["memory", "sc.yaml", "--fit-layout", "--num-gpus", "1000000000"], copy=CAL,
        timeout_s=30)
    add("--fit-layout --num-gpus 2**24", ["memory", "sc.yaml", "--fit-layout", "--num-gpus", str(2**24)], copy=CAL,
        timeout_s=60)
    add("--fit-layout --num-gpus a large prime", ["memory", "sc.yaml", "--fit-layout", "--num-gpus", "16777213"],
        copy=CAL, timeout_s=30)
    add("tails: a million ranks x 10,000 steps", ["tails", "sc.yaml", "--steps", "10000", "--set",
                                                 "cluster.num_nodes=131072"], copy=CAL, expect="error", timeout_s=30,
        error_has="MAX_TAIL_DRAWS")
    add("tails: packing 1-token documents into long rows", ["tails", "pack.yaml", "--steps", "20", "--set",
                                                            "variability.seq_len_distribution=lognormal", "--set",
                                                            "variability.mean_seq_len=1", "--set",
                                                            "variability.sequence_handling=packing"],
        setup=_files(pack__yaml=SCENARIO.replace("seq_len: 1024", "seq_len: 32768")), expect="ok", timeout_s=60)
    add("run: failures faster than checkpoints", ["run", "sc.yaml", "--tokens", "1e12", "--mtbf-hours", "1e-9"],
        copy=CAL, expect="error", error_has="never finishes")
    add("run: 1e300 tokens", ["run", "sc.yaml", "--tokens", "1e300"], copy=CAL, timeout_s=30)
    add("knobs on a 30k-parameter list (8 simulations)", ["knobs", "big.yaml"],
        setup=_files(big__yaml=_params_scenario(30_000)), expect="ok", timeout_s=120)
    add("YAML over 20 MiB", ["simulate", "big.yaml"], setup=_big_yaml(21 * 2**20), expect="error", timeout_s=30)
    add("100k invalid entries, one bounded line", ["simulate", "big.yaml"],
        setup=_files(big__yaml=_invalid_entries(100_000)), expect="error", timeout_s=60)
    add("YAML alias bomb", ["simulate", "bad.yaml"], setup=_files(bad__yaml=_alias_bomb()), expect="error",
        timeout_s=30)
    add("YAML recursive alias", ["simulate", "bad.yaml"], setup=_scenario("loop: &a [*a]\n"), expect="error",
        timeout_s=30)
    add("num_layers 1e6", SIM, setup=_files(bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 1}\nmodel:\n"
                                          "  transformer: {num_layers: 1000000, hidden_size: 64, num_heads: 1, "
                                          "ffn_hidden_size: 64, vocab_size: 10}\n"), expect="error", timeout_s=30)
    # The fast engine extends a repeating pipeline schedule exactly, whatever the micro-batch count (its
    # overlapped gradient reduction in simpy for the last few operations); the simpy engine refuses it.
    huge_pipeline = ("cluster: {preset: dgx-h100-80gb, num_nodes: 2}\nmodel: {preset: gpt2}\n"
                     "parallelism: {pp: 2}\ntraining: {micro_batch_size: 1, global_batch_size: 80000000000}\n")
    add("pipeline with 1e10 micro-batches", SIM, setup=_files(bad__yaml=huge_pipeline), expect="ok", timeout_s=30)
    add("pipeline with 1e10 micro-batches, --exact", [*SIM, "--exact"], setup=_files(bad__yaml=huge_pipeline),
        expect="error", error_has="MAX_LAYER_PASSES", timeout_s=30)
    add("ZeRO-3 with 1e6 micro-batches", SIM,
        setup=_files(bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 2}\nmodel: {preset: gpt2}\n"
                     "parallelism: {zero_stage: 3}\ntraining: {micro_batch_size: 1, global_batch_size: 16000000}\n"),
        expect="error", timeout_s=30)
    add("DeepSpeed ZeRO-2 (reduces every micro-batch) with 1e9 micro-batches", SIM,
        setup=_files(bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 1}\nmodel: {preset: gpt2}\n"
                     "parallelism: {zero_stage: 2}\nddp: {implementation: deepspeed}\n"
                     "training: {micro_batch_size: 1, global_batch_size: 8000000000}\n"),
        expect="error", error_has="MAX_LAYER_PASSES", timeout_s=30)
    add("interleaved pipeline, 1e9 micro-batches", SIM,
        setup=_files(bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 2}\nmodel: {preset: gpt2}\n"
                     "parallelism: {pp: 4, pipeline_schedule: interleaved-1f1b, virtual_stages: 3}\n"
                     "training: {micro_batch_size: 1, global_batch_size: 4000000000}\n"),
        expect="ok", timeout_s=30)
    add("num_nodes 1e15", SIM, setup=_files(
        bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 1000000000000000}\nmodel: {preset: gpt2}\n"),
        timeout_s=30)
    add("--set path of 10,000 keys", ["simulate", "sc.yaml", "--set", ".".join(["a"] * 10_000) + "=1"], copy=CAL,
        expect="error", timeout_s=30)
    add("--set value nested 100,000 deep", ["simulate", "sc.yaml", "--set", "name=" + "[" * 100_000], copy=CAL,
        timeout_s=30)
    add("--set value nested 5,000 deep (closed)", ["simulate", "sc.yaml", "--set",
                                                   "name=" + "[" * 5000 + "]" * 5000], copy=CAL, expect="error",
        timeout_s=30)
    add("integer of 5,000 digits", SIM, setup=_scenario("parallelism: {tp: " + "9" * 5000 + "}\n"), expect="error")
    add("scenario is a FIFO", ["simulate", "fifo"], setup=_fifo("fifo"), expect="error", timeout_s=20)
    add("scenario is /dev/zero", ["simulate", "/dev/zero"], expect="error", timeout_s=20)
    add("calibration file is a FIFO", ["calibrate", "fit", "fifo", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_fifo("fifo"), expect="error", timeout_s=20)
    add("profile is /dev/zero", ["calibrate", "predict", "/dev/zero"], expect="error", timeout_s=20)
    add("JSON over 20 MiB", ["calibrate", "fit", "comm.json", "big.json", "--out", "p.json"], copy=CAL,
        setup=_files(big__json=" " * (21 * 2**20) + "{}"), expect="error", timeout_s=30)
    add("JSON nested 100,000 deep", ["calibrate", "fit", "deep.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_files(deep__json="[" * 100_000 + "]" * 100_000), expect="error", timeout_s=30)
    add("scenario JSON nested 500 deep", ["simulate", "deep.json"],
        setup=_files(deep__json='{"model": ' * 500 + "1" + "}" * 500), expect="error")

    # ---- 3. no traceback
    add("YAML nested 500 deep", ["simulate", "bad.yaml"], setup=_files(bad__yaml=_deep(500)), expect="error")
    add("YAML nested 50,000 deep", ["simulate", "bad.yaml"], setup=_files(bad__yaml=_deep(50_000)), expect="error",
        timeout_s=30)
    add("cluster preset is a list", ["simulate", "bad.yaml"],
        setup=_files(bad__yaml="cluster: {preset: [a]}\nmodel: {preset: gpt2}\n"), expect="error")
    add("model preset is a mapping", ["simulate", "bad.yaml"],
        setup=_files(bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 1}\nmodel: {preset: {a: 1}}\n"),
        expect="error")
    add("calibration is a number", ["simulate", "bad.yaml"], setup=_scenario("calibration: 5\n"), expect="error")
    add("calibration is a list", ["simulate", "bad.yaml"], setup=_scenario("calibration: [a, b]\n"), expect="error")
    add("calibration is a mapping", ["simulate", "bad.yaml"], setup=_scenario("calibration: {a: 1}\n"),
        expect="error")
    add("calibration is a directory", ["simulate", "bad.yaml"], setup=_scenario("calibration: /\n"), expect="error")
    add("calibration is a scenario file", ["simulate", "bad.yaml"], copy=CAL, setup=_scenario("calibration: sc.yaml\n"),
        expect="error")
    add("DDP median_s 0", ["calibrate", "validate", "profile.json", "zero.json"], copy=CAL,
        setup=_json_file("zero.json", ddp_dict(median_s=0.0)), expect="error", error_has="zero.json: cases.0")
    add("DDP median_s negative", ["calibrate", "validate", "profile.json", "neg.json"], copy=CAL,
        setup=_json_file("neg.json", ddp_dict(median_s=-0.01)), expect="error")
    add("app --port -5", ["app", "--port", "-5"], expect="error", subprocess=True, timeout_s=20)
    add("app --port 70000", ["app", "--port", "70000"], expect="error", subprocess=True, timeout_s=20)
    add("app --port abc", ["app", "--port", "abc"], expect="error", subprocess=True, timeout_s=20)
    add("app --host with a space", ["app", "--host", "bad host"], expect="error", subprocess=True, timeout_s=20)
    add("scenario is a list", ["simulate", "bad.yaml"], setup=_files(bad__yaml="- 1\n- 2\n"), expect="error")
    add("scenario is empty", ["simulate", "bad.yaml"], setup=_files(bad__yaml=""), expect="error")
    add("scenario is binary", ["simulate", "bad.yaml"], setup=_files(bad__yaml=bytes(range(256)) * 4),
        expect="error")
    add("scenario is UTF-16", ["simulate", "bad.yaml"], setup=_files(bad__yaml=SCENARIO.encode("utf-16")),
        expect="error")
    add("scenario is a directory", ["simulate", "."], expect="error")
    add("scenario does not exist", ["simulate", "missing.yaml"], expect="error")
    add("scenario YAML with a tab indent", ["simulate", "bad.yaml"], setup=_files(bad__yaml="cluster:\n\tpreset: x\n"),
        expect="error")
    add("scenario with a Python tag", ["simulate", "bad.yaml"],
        setup=_scenario("extra: !!python/object/apply:os.system ['echo pwned > pwned.txt']\n"), expect="error")
    add("unknown key", SIM, setup=_scenario("ddp: {bucket_cap_mbs: 5}\n"), expect="error")
    add("string where a number goes", SIM, setup=_scenario("ddp: {bucket_cap_mb: lots}\n"), expect="error")
    add("negative GPUs", SIM, setup=_files(bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: -2}\n"
                                           "model: {preset: gpt2}\n"), expect="error")
    add("--set without =", ["simulate", "sc.yaml", "--set", "ddp.bucket_cap_mb"], copy=CAL, expect="error")
    add("--set empty key", ["simulate", "sc.yaml", "--set", "=1"], copy=CAL, expect="error")
    add("--set a..b", ["simulate", "sc.yaml", "--set", "ddp..bucket_cap_mb=1"], copy=CAL, expect="error")
    add("--set a section to a number", ["simulate", "sc.yaml", "--set", "cluster=5"], copy=CAL, expect="error")
    add("--set through a number", ["simulate", "sc.yaml", "--set", "cluster.num_nodes.x=5"], copy=CAL,
        expect="error")
    add("--set preset to a list", ["simulate", "sc.yaml", "--set", "cluster.preset=[a]"], copy=CAL, expect="error")
    add("--set calibration to a number", ["simulate", "sc.yaml", "--set", "calibration=7"], copy=CAL,
        expect="error")
    add("fit: comm file missing", ["calibrate", "fit", "nope.json", "compute.json", "--out", "p.json"], copy=CAL,
        expect="error")
    add("fit: files swapped", ["calibrate", "fit", "compute.json", "comm.json", "--out", "p.json"], copy=CAL,
        expect="error")
    add("fit: truncated JSON", ["calibrate", "fit", "cut.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_files(cut__json=json.dumps(comm_dict())[:500]), expect="error")
    add("fit: JSON array", ["calibrate", "fit", "arr.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_files(arr__json="[1, 2]"), expect="error")
    add("fit: duplicate JSON keys", ["calibrate", "fit", "dup.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_files(dup__json='{"kind": "simddp-comm", "kind": "simddp-comm"}'), expect="error")
    add("fit: wrong version", ["calibrate", "fit", "v9.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_json_file("v9.json", {**comm_dict(), "version": 9}), expect="error")
    add("fit: kind is a list", ["calibrate", "fit", "k.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_json_file("k.json", {**comm_dict(), "kind": ["simddp-comm"]}), expect="error")
    add("merge: kind is a mapping", ["calibrate", "merge", "k.json", "--out", "m.json"], copy=CAL,
        setup=_json_file("k.json", {**comm_dict(), "kind": {"a": 1}}), expect="error")
    add("predict: profile is a scenario", ["calibrate", "predict", "sc.yaml"], copy=CAL, expect="error")
    add("predict --ranks 0", ["calibrate", "predict", "profile.json", "--ranks", "0"], copy=CAL, expect="error")
    add("predict --ranks 3 with 2 per node", ["calibrate", "predict", "profile.json", "--ranks", "3",
                                              "--gpus-per-node", "2"], copy=CAL, expect="error")
    add("predict --set unknown key", ["calibrate", "predict", "profile.json", "--set", "ddp.x=1"], copy=CAL,
        expect="error")
    add("collective --bytes nan", ["collective", "all-reduce", "--bytes", "nan"], expect="error")
    add("collective --bytes 1e400", ["collective", "all-reduce", "--bytes", "1e400"], expect="error")
    add("collective --bytes 0", ["collective", "all-reduce", "--bytes", "0"], expect="error")
    add("collective --bytes 10^30 T", ["collective", "all-reduce", "--bytes", "9" * 30 + "T", "--json"])
    add("collective on 1 GPU", ["collective", "all-reduce", "--gpus-per-node", "1"], expect="error")
    add("collective --num-nodes 1e12", ["collective", "all-reduce", "--num-nodes", "1000000000000", "--bytes", "1M",
                                        "--json"])
    add("memory --stage -1", ["memory", "sc.yaml", "--stage", "-1"], copy=CAL, expect="error")
    add("memory --stage 99", ["memory", "sc.yaml", "--stage", "99"], copy=CAL, expect="error")
    add("memory --num-gpus 0", ["memory", "sc.yaml", "--fit-layout", "--num-gpus", "0"], copy=CAL, expect="error")
    add("memory --num-gpus 7", ["memory", "sc.yaml", "--fit-layout", "--num-gpus", "7"], copy=CAL, expect="error")
    add("memory --num-gpus -8", ["memory", "sc.yaml", "--fit-layout", "--num-gpus", "-8"], copy=CAL, expect="error")
    add("unknown command", ["frobnicate"], expect="error")
    add("no command", [], expect="error")

    # ---- 4. finite numbers only
    for path in _FLOAT_FIELDS:
        section, _, key = path.rpartition(".")
        nested = "".join(f"{part}: {{" for part in section.split(".")) + f"{key}: VALUE" + "}" * len(
            section.split("."))
        for value in (".inf", ".nan"):
            add(f"{path}: {value}", SIM, setup=_scenario(nested.replace("VALUE", value) + "\n")
                if not path.startswith("cluster") else
                _files(bad__yaml="model: {preset: gpt2}\n" + "cluster: {preset: dgx-h100-80gb, num_nodes: 2, "
                       + nested.removeprefix("cluster: {").replace("VALUE", value) + "\n"),
                expect="error")
    add("--set host overhead inf", ["simulate", "sc.yaml", "--json", "--set", "cluster.host_overhead_s=.inf"],
        copy=CAL, expect="error")
    add("--set interference 1e308", ["simulate", "sc.yaml", "--json", "--set",
                                     "cluster.comm_compute_interference=1.0e308"], copy=CAL)
    add("host overhead 1e308", ["simulate", "sc.yaml", "--json", "--set", "cluster.host_overhead_s=1.0e308"],
        copy=CAL)
    add("seq_len 10^29", SIM, setup=_files(
        bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 2}\nmodel: {preset: gpt2}\n"
        "training: {seq_len: 100000000000000000000000000000}\n"))
    add("micro_batch 10^20", SIM, setup=_files(bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 2}\n"
                                               "model: {preset: gpt2}\ntraining: {micro_batch_size: "
                                               "100000000000000000000}\n"))
    add("hidden size 2^40", SIM, setup=_files(bad__yaml="cluster: {preset: dgx-h100-80gb, num_nodes: 1}\nmodel:\n"
                                              "  transformer: {num_layers: 2, hidden_size: 1099511627776, "
                                              "num_heads: 1, ffn_hidden_size: 1099511627776, vocab_size: 10}\n"))
    add("tiny bandwidth 1e-300", SIM, setup=_files(
        bad__yaml="model: {preset: gpt2}\ncluster: {preset: dgx-h100-80gb, num_nodes: 2, "
        "inter_node: {nic_bandwidth_bytes_per_s: 1.0e-300}}\n"))
    add("NaN timings in comm.json", ["calibrate", "fit", "nan.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_files(nan__json=poisoned(comm_dict(), "NaN")), expect="error", error_has="nan.json: ")
    add("Infinity timings in comm.json", ["calibrate", "fit", "inf.json", "compute.json", "--out", "p.json"],
        copy=CAL, setup=_files(inf__json=poisoned(comm_dict(), "Infinity")), expect="error", error_has="cases.0")
    add("NaN in ddp.json", ["calibrate", "validate", "profile.json", "nan.json", "--json"], copy=CAL,
        setup=_files(nan__json=poisoned(ddp_dict(), "NaN")), expect="error", error_has="nan.json: ")
    add("NaN in compute.json", ["calibrate", "fit", "comm.json", "nan.json", "--out", "p.json"], copy=CAL,
        setup=_files(nan__json=poisoned(compute_dict(), "NaN")), expect="error", error_has="nan.json: ")
    for z in ("nan", "inf", "1e308", "-1", "0"):
        add(f"validate --z {z}", ["calibrate", "validate", "profile.json", "ddp.json", "--z", z, "--json"], copy=CAL,
            expect="error" if z != "0" else "either")
    for z in ("nan", "inf", "1e308"):
        add(f"predict --z {z}", ["calibrate", "predict", "profile.json", "--z", z, "--json"], copy=CAL, expect="error")
    for cap in ("nan", "inf", "-1"):
        add(f"predict --bucket-cap-mb {cap}", ["calibrate", "predict", "profile.json", "--bucket-cap-mb", cap],
            copy=CAL, expect="error")
    add("predict at 10^9 ranks", ["calibrate", "predict", "profile.json", "--ranks", "1000000000", "--json"],
        copy=CAL, timeout_s=30)

    # ---- 5. calibration consistency
    add("fit: one measurement point", ["calibrate", "fit", "one.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_json_file("one.json", comm_dict(sizes=[2**20])), expect="error")
    add("fit: no all-reduce", ["calibrate", "fit", "bc.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_json_file("bc.json", comm_dict(ops=["broadcast"])), expect="error")
    add("fit: no collective cases", ["calibrate", "fit", "none.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_json_file("none.json", {**comm_dict(), "cases": []}), expect="error")
    add("fit: one point, --allow-partial", ["calibrate", "fit", "one.json", "compute.json", "--out", "p.json",
                                            "--allow-partial"], copy=CAL,
        setup=_json_file("one.json", comm_dict(sizes=[2**20])), expect="ok", stdout_has="placeholder")
    add("fit: 2-rank comm with 4-rank compute", ["calibrate", "fit", "comm.json", "c4.json", "--out", "p.json"],
        copy=CAL, setup=_json_file("c4.json", compute_dict(world=4)), expect="error")
    add("fit: mixed num_ranks in comm.json", ["calibrate", "fit", "mixed.json", "compute.json", "--out", "p.json"],
        copy=CAL, setup=_json_file("mixed.json", {**comm_dict(), "cases": comm_dict()["cases"]
                                                  + comm_dict(world=4)["cases"]}), expect="error")
    add("fit: partial compute.json", ["calibrate", "fit", "comm.json", "part.json", "--out", "p.json"], copy=CAL,
        setup=_json_file("part.json", compute_dict(complete=False)), expect="error")
    add("fit: zero timing", ["calibrate", "fit", "zero.json", "compute.json", "--out", "p.json"], copy=CAL,
        setup=_files(zero__json=poisoned(comm_dict(), "0")), expect="error",
        error_has="zero.json: cases.0 (all-reduce on world")
    add("validate: another model's DDP steps", ["calibrate", "validate", "profile.json", "other.json"], copy=CAL,
        setup=_json_file("other.json", ddp_dict(model="other.py:build", micro_batch=32, world=4)),
        stdout_has="warning")
    add("validate: another micro-batch", ["calibrate", "validate", "profile.json", "mb.json"], copy=CAL,
        setup=_json_file("mb.json", ddp_dict(micro_batch=32)), stdout_has="micro-batch")
    add("merge: different world sizes", ["calibrate", "merge", "comm.json", "c4.json", "--out", "m.json"], copy=CAL,
        setup=_json_file("c4.json", comm_dict(world=4)), expect="error")

    # ---- 6./7. minor
    add("ANSI escape in the scenario name", ["simulate", "bad.yaml"],
        setup=_files(bad__yaml=SCENARIO.replace("name: probe", 'name: "\\e[31mred\\e]0;title\\a\\e[0m"')),
        expect="ok")
    add("duplicate YAML key", SIM, setup=_files(bad__yaml=SCENARIO + "name: again\n"), expect="error")
    add("true where an integer goes", SIM, setup=_scenario("parallelism: {tp: true}\n"), expect="error")
    add("true where a number goes", SIM, setup=_scenario("ddp: {bucket_cap_mb: true}\n"), expect="error")
    add("true as a ZeRO stage", SIM, setup=_scenario("parallelism: {zero_stage: true}\n"), expect="error")
    add("control characters in a preset name", SIM,
        setup=_files(bad__yaml='cluster: {preset: "\\e[2Jdgx", num_nodes: 1}\nmodel: {preset: gpt2}\n'),
        expect="error")

    # ---- API (ScenarioError, one line) and dashboard
    api = "import simddp\nfrom simddp import ScenarioError\n"
    add("API: 500-deep dict", code=api + "d = x = {}\nfor _ in range(500):\n    x['a'] = {}\n    x = x['a']\n"
        "simddp.scenario_from_dict({'cluster': {'preset': 'dgx-h100-80gb', 'num_nodes': 1}, 'model': d})\n",
        expect="error")
    add("API: 5,000-deep dict under a preset", code=api + "d = x = {}\nfor _ in range(5000):\n    x['a'] = {}\n"
        "    x = x['a']\nsimddp.scenario_from_dict({'cluster': {'preset': 'dgx-h100-80gb', 'num_nodes': 1, 'gpu': d},"
        " 'model': {'preset': 'gpt2'}})\n", expect="error")
    add("API: 100,000-deep list", code=api + "x = []\nfor _ in range(100000):\n    x = [x]\n"
        "simddp.scenario_from_dict({'cluster': {'preset': 'dgx-h100-80gb', 'num_nodes': 1}, 'model': "
        "{'preset': 'gpt2'}, 'name': x})\n", expect="error")
    add("API: self-referencing dict", code=api + "d = {'cluster': {'preset': 'dgx-h100-80gb', 'num_nodes': 1}}\n"
        "d['model'] = d\nsimddp.scenario_from_dict(d)\n", expect="error")
    add("API: self-referencing dict under a preset", code=api + "g = {}\ng['gpu'] = g\n"
        "simddp.scenario_from_dict({'cluster': {'preset': 'dgx-h100-80gb', 'num_nodes': 1, 'gpu': g}, "
        "'model': {'preset': 'gpt2'}})\n", expect="error")
    add("API: booleans in grad_ready_order", code=api + "simddp.scenario_from_dict({'cluster': {'preset': "
        "'dgx-h100-80gb', 'num_nodes': 1}, 'model': {'parameters': [{'name': 'a', 'numel': 4}, {'name': 'b', "
        "'numel': 4}], 'grad_ready_order': [True, False]}})\n", expect="error")
    add("API: --set string through set_path", code=api + "from simddp.config import set_path\n"
        "set_path({}, 'a', '[' * 100000)\n", expect="error")
    add("API: unhashable preset", code=api + "simddp.scenario_from_dict({'cluster': {'preset': ['a']}, "
        "'model': {'preset': 'gpt2'}})\n", expect="error")
    add("API: calibration path is an int", code=api + "simddp.scenario_from_dict({'cluster': {'preset': "
        "'dgx-h100-80gb', 'num_nodes': 1}, 'model': {'preset': 'gpt2'}, 'calibration': 3})\n", expect="error")
    add("API: simulate with inf", code=api + "simddp.simulate({'cluster': {'preset': 'dgx-h100-80gb', 'num_nodes': 1, "
        "'host_overhead_s': float('inf')}, 'model': {'preset': 'gpt2'}})\n", expect="error")
    add("API: simulate with nan interference", code=api + "simddp.simulate({'cluster': {'preset': 'dgx-h100-80gb', "
        "'num_nodes': 2, 'comm_compute_interference': float('nan')}, 'model': {'preset': 'gpt2'}})\n",
        expect="error")
    add("API: True as tp", code=api + "simddp.scenario_from_dict({'cluster': {'preset': 'dgx-h100-80gb', "
        "'num_nodes': 1}, 'model': {'preset': 'gpt2'}, 'parallelism': {'tp': True}})\n", expect="error")
    add("API: load_scenario of a FIFO", code=api + "import os\nos.mkfifo('f.yaml')\nsimddp.load_scenario('f.yaml')\n",
        expect="error", timeout_s=20)
    add("API: layout search at 10^9 GPUs", code=api + "s = simddp.load_scenario('sc.yaml')\n"
        "simddp.smallest_layout_that_fits(s, 10**9)\n", copy=CAL, expect="error", timeout_s=30)
    add("API: 10^5 validation errors, bounded message", code=api + "try:\n    simddp.scenario_from_dict({'cluster': "
        "{'preset': 'dgx-h100-80gb', 'num_nodes': 1}, 'model': {'parameters': [{'name': 'p', 'numel': -1}] * 100000}})"
        "\nexcept ScenarioError as e:\n    assert len(str(e)) < 3000, len(str(e))\n    raise\n", expect="error",
        timeout_s=60)
    add("dashboard: uploaded scenario names a server path", code=_APP_UPLOAD % (
        "calibration: /etc/passwd\\n" + SCENARIO.replace("\n", "\\n")), expect="ok", timeout_s=120,
        subprocess=True)
    add("dashboard: uploaded scenario 500 deep", code=_APP_UPLOAD % _deep(500).replace("\n", "\\n"),
        expect="ok", timeout_s=120, subprocess=True)
    add("dashboard: uploads leave no shared folder", code=_APP_PROFILE, copy=CAL, expect="ok", timeout_s=120,
        subprocess=True)

    # ---- collectors (torch, under torchrun)
    new, old = _collector("comm", "--out", "/proc/simddp-probe/comm.json", "--sizes", "4K", "--repeats", "1")
    add("collector: unwritable --out (comm)", new, old_argv=old, expect="error", torch=True, subprocess=True,
        timeout_s=120)
    new, old = _collector("compute", "--model", "{models}/small_transformer.py:tiny", "--device", "cpu", "--out",
                          "/proc/simddp-probe/compute.json")
    add("collector: unwritable --out (compute)", new, old_argv=old, expect="error", torch=True, subprocess=True,
        timeout_s=120)
    new, old = _collector("ddp", "--model", "{models}/small_transformer.py:tiny", "--out", "sub")
    add("collector: --out is a directory (ddp)", new, old_argv=old, setup=lambda f: (f / "sub").mkdir(),
        expect="error", torch=True, subprocess=True, timeout_s=120)
    new, old = _collector("comm", "--out", "comm.json", "--sizes", "4K,64K", "--repeats", "2", "--warmup", "0",
                          "--interference-sizes", "none", "--timeout", "20")
    add("collector: a failed re-run keeps the complete result", new, old_argv=old, copy=CAL,
        setup=lambda f: None, unchanged=("comm.json",), torch=True, subprocess=True, timeout_s=120,
        tags=("fault:exit:1:1",))
    return out


_APP_UPLOAD = """
from pathlib import Path
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(str(Path("{app}") / "streamlit_app.py"), default_timeout=60)
at.run()
at.switch_page("app_pages/compare.py").run()
at.file_uploader(key="compare_upload").set_value(("up.yaml", "%s".encode(), "application/x-yaml")).run()
assert not at.exception, [e.value for e in at.exception]
errors = [e.value for e in at.error]
assert errors, "the upload was accepted"
assert not any("passwd:" in e for e in errors), errors  # says nothing about a server-side path
"""

_APP_PROFILE = '''
import os, tempfile
from pathlib import Path
from streamlit.testing.v1 import AppTest
shared = Path(tempfile.gettempdir()) / "simddp-app"
before = sorted(os.listdir(shared)) if shared.exists() else []
at = AppTest.from_file(str(Path("{app}") / "streamlit_app.py"), default_timeout=60)
at.run()
at.switch_page("app_pages/calibration.py").run()
at.file_uploader(key="cal_profile").set_value(("profile.json", Path("profile.json").read_bytes(), "application/json"))
at.run()
assert not at.exception, [e.value for e in at.exception]
after = sorted(os.listdir(shared)) if shared.exists() else []
assert after == before, f"uploads written to the shared folder {shared}: {sorted(set(after) - set(before))}"
'''


# ------------------------------------------------------------------------------------------ judge
@dataclass
class Outcome:
    returncode: int | None  # None: killed at the time bound
    stdout: str
    stderr: str
    elapsed_s: float


def fingerprint(path: Path) -> str:
    """Content hash of a regular file, or its kind (a device, a FIFO), or 'missing'."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "symlink -> " + os.readlink(path)
    if not stat.S_ISREG(st.st_mode):
        return f"special {stat.S_IFMT(st.st_mode):o}"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _strict_json(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def _insane(data: Any) -> str | None:
    """A result that must not be printed: non-finite numbers, exposed > step, negative times."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return f"non-finite number {value} in the JSON"
        if isinstance(value, dict):
            stack.extend(value.values())
            step = value.get("step_time_s")
            if isinstance(step, int | float):
                for key in ("exposed_comm_time_s", "compute_time_s", "optimizer_time_s"):
                    part = value.get(key)
                    if isinstance(part, int | float) and (part < 0 or part > step * (1 + 1e-9)):
                        return f"{key} {part} outside 0..step_time_s {step}"
                comm = value.get("comm_time_s")
                tp = value.get("tp_comm_time_s", 0.0) or 0.0
                exposed = value.get("exposed_comm_time_s")
                if isinstance(comm, int | float) and isinstance(exposed, int | float) and exposed > (comm + tp) * (
                        1 + 1e-9) + 1e-12 and not value.get("pp", 1) > 1:
                    return f"exposed communication {exposed} > total communication {comm + tp}"
        elif isinstance(value, list):
            stack.extend(value)
    return None


def judge(case: Case, outcome: Outcome, before: dict[str, str], after: dict[str, str]) -> str | None:
    """None if the outcome is clean, else what is wrong, in a few words."""
    text = outcome.stdout + outcome.stderr
    if outcome.returncode is None:
        return f"no answer within {case.timeout_s:g} s"
    if "Traceback (most recent call last)" in text:
        return "traceback"
    if "\x1b" in text:
        return "terminal escape sequence in the output"
    changed = [name for name in before if before[name] != after.get(name)]
    if changed:
        return f"changed {', '.join(changed)}"
    rc = outcome.returncode
    if rc and case.error_has and case.error_has not in outcome.stderr:
        return f"the error does not name {case.error_has!r}: {_last_line(outcome.stderr)}"
    if rc < 0 or rc >= 128:
        return f"killed by a signal (status {rc})"
    if case.code:  # a snippet: exit 0 means its assertions held; 2 means a clean ScenarioError
        if rc == 2 and case.expect != "ok":
            return _one_line_problem(outcome.stderr)
        if rc == 0 and case.expect != "error":
            return None
        return f"exit {rc}: {_last_line(text)}"
    if rc == 0:
        if case.expect == "error":
            return "accepted (a clean refusal was expected)"
        if "--json" in case.argv and outcome.stdout.strip():
            try:
                data = _strict_json(outcome.stdout)
            except ValueError as err:
                return f"invalid JSON: {str(err)[:80]}"
            bad = _insane(data)
            if bad:
                return bad
        if case.stdout_has and case.stdout_has.lower() not in text.lower():
            return f"no {case.stdout_has!r} in the output"
        return None
    if case.expect == "ok":
        return f"failed: {_last_line(outcome.stderr)}"
    if rc not in (1, 2, 3):
        return f"exit status {rc}: {_last_line(outcome.stderr)}"
    return _one_line_problem(outcome.stderr, errors_only=case.torch)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "(nothing)")[:120]


def _one_line_problem(stderr: str, errors_only: bool = False) -> str | None:
    """Exactly one line on stderr (for a collector, whose progress goes to stderr: one line saying error)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and (not errors_only or "error" in ln.lower())]
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr: {_last_line(stderr)}"
    if len(lines[0]) > 3000:
        return f"an error line of {len(lines[0]):,} characters"
    return None
