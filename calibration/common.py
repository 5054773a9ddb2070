"""Shared pieces of the collectors: model factories, process groups, timing, progress, failure handling.

Failure handling (issue: a rank that dies or hangs must end the collector with a clear error within a
timeout, keeping partial results):

* every collective runs under the process group's ``timeout`` (gloo raises; NCCL aborts the
  communicator with ``TORCH_NCCL_ASYNC_ERROR_HANDLING``, on by default);
* a :class:`Watchdog` thread ends the process if the main loop makes no progress for ``timeout_s``
  (a hang outside a collective, or a backend that never returns);
* rank 0 rewrites ``<out>.partial.json`` after every measurement with ``"complete": false`` and on
  SIGTERM (what torchrun sends the survivors when one rank dies) or an exception records the error there
  and exits non-zero, so what was measured is kept; ``--out`` itself appears (atomically, through
  :func:`simddp.safeio.write_text`) only when the run is complete, so a failed re-run never replaces a
  complete result with a partial one;
* before any measurement, rank 0 checks that ``--out`` can be written (not an input, not a directory,
  device or FIFO, in a writable folder) and every rank stops with exit status 2 and one message if not.
"""

from __future__ import annotations

import datetime as dt
import importlib
import importlib.util
import inspect
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from pydantic import BaseModel

from simddp import safeio
from simddp.profile import RunInfo, write_json

#: Exit status of a collector that stopped early (partial results written to <out>.partial.json).
EXIT_PARTIAL = 3
#: Exit status of a collector given a bad argument (nothing measured).
EXIT_USAGE = 2
#: Environment variable of the fault-injection test hook (see :meth:`Collector.save_partial`).
FAULT_ENV = "SIMDDP_CALIBRATION_FAULT"


class CollectorError(RuntimeError):
    """A collector cannot go on; the message is shown as one line (by rank 0 only when ``quiet`` elsewhere)."""

    def __init__(self, message: str, quiet: bool = False) -> None:
        super().__init__(message)
        self.quiet = quiet


def usage_error(prog: str, err: CollectorError) -> int:
    """Print a collector's argument error (once, not on every rank) and return :data:`EXIT_USAGE`."""
    if not err.quiet:
        print(f"{prog}: error: {safeio.one_line(err)}", file=sys.stderr)
    return EXIT_USAGE


def model_file(spec: str | None) -> list[str]:
    """The file of a ``FILE.py:factory`` spec: an input that ``--out`` must not replace."""
    return [spec.rsplit(":", 1)[0]] if spec and ":" in spec and spec.rsplit(":", 1)[0].endswith(".py") else []


def check_out(d: Dist, out: Path, inputs: Sequence[str | Path] = ()) -> None:
    """Rank 0 checks that ``out`` (and ``<out>.partial``) can be written; every rank learns the verdict.

    Before any measurement, so that a bad ``--out`` costs nothing and every rank stops with one message
    (rank 0's) instead of rank 0 failing at its first write and the others blaming the network.
    """
    problem = None
    if d.is_main:
        try:
            for path in (out, safeio.partial_path(out)):
                safeio.check_output(path, inputs, "--out")
        except ValueError as err:
            problem = str(err)
    verdict = d.all_gather_object(problem)[0]
    if verdict is not None:
        raise CollectorError(verdict, quiet=not d.is_main)


# ------------------------------------------------------------------------------------------ models
def load_factory(spec: str) -> Callable[[], Any]:
    """The factory named by ``FILE.py:factory`` (or ``package.module:factory``)."""
    if ":" not in spec:
        raise CollectorError(f"--model {spec!r}: expected FILE.py:factory")
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where)
        if not path.exists():
            raise CollectorError(f"--model {spec!r}: {path} does not exist")
        module_name = "_simddp_model_" + path.stem
        mod_spec = importlib.util.spec_from_file_location(module_name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise CollectorError(f"--model {spec!r}: cannot import {path}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[module_name] = module
        try:
            mod_spec.loader.exec_module(module)
        except Exception as err:
            raise CollectorError(f"--model {spec!r}: importing {path} raised {one_line(err)}") from err
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise CollectorError(f"--model {spec!r}: {one_line(err)}") from err
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CollectorError(f"--model {spec!r}: {where} has no callable {name!r}")
    return factory


def build_model(spec: str, device: torch.device) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Call the factory: it returns ``(model, example_inputs)``; inputs may be one tensor or a tuple."""
    factory = load_factory(spec)
    try:
        out = factory()
    except Exception as err:  # the user's code: report it in one line
        raise CollectorError(f"--model {spec!r}: the factory raised {one_line(err)}") from err
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.nn.Module)):
        raise CollectorError(f"--model {spec!r}: the factory must return (model, example_inputs)")
    model, inputs = out
    if not isinstance(inputs, tuple | list):
        inputs = (inputs,)
    model = model.to(device)
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    if not any(p.requires_grad for p in model.parameters()):
        raise CollectorError(f"--model {spec!r}: the model has no trainable parameters")
    return model, inputs


def scalar_loss(output: Any) -> torch.Tensor:
    """A scalar to call backward on: the sum of the (first) output, in fp32.

    The same in every collector, so the measured backward is the one DDP runs; a model that computes its
    own loss can return it.
    """
    if isinstance(output, dict):
        output = next(iter(output.values()))
    if isinstance(output, tuple | list):
        output = output[0]
    return output.float().sum() if output.dim() else output.float()


def make_optimizer(name: str, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """sgd (no momentum), adam or adamw, with a tiny learning rate so repeated steps stay stable.

    ``foreach`` is left at torch's default, as in a real training script.
    """
    lr = 1e-6
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise CollectorError(f"--optimizer {name!r}: expected sgd, adam or adamw")


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, str, torch.nn.Parameter]]:
    """(name, owning module name, parameter) of the parameters DDP sees: trainable, deduplicated."""
    owner: dict[int, str] = {}
    for mod_name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owner.setdefault(id(p), mod_name)
    return [(n, owner.get(id(p), ""), p) for n, p in model.named_parameters() if p.requires_grad]


def count_autograd_nodes(model: torch.nn.Module, inputs: Sequence[Any]) -> int:
    """Nodes of one forward's autograd graph, reached from the loss as DDP's unused-parameter search walks
    it (``Reducer::prepare_for_backward``: every ``grad_fn`` and ``next_functions``, AccumulateGrad included)."""
    loss = scalar_loss(model(*inputs))
    seen: set[Any] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return max(1, len(seen))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------------------- threads
def set_threads(num_threads: int | None) -> int:
    """Pin torch's intra-op threads (OMP/MKL follow); returns the number in use."""
    if num_threads is not None:
        if num_threads < 1:
            raise CollectorError(f"--threads {num_threads}: must be >= 1")
        os.environ["OMP_NUM_THREADS"] = str(num_threads)
        torch.set_num_threads(num_threads)
    return torch.get_num_threads()


def pin_cores(local_rank: int, local_world_size: int, mode: str) -> list[int]:
    """Pin this process (and the threads it starts later) to its own ``torch.get_num_threads()`` cores.

    ``auto`` pins when every local rank can get its own cores. Off by default, as torchrun leaves it, and
    for a measured reason: on the 2-core acceptance machine pinning made plain steps steadier (106 ms,
    p90 120 ms, against 117 ms, p90 167 ms) but made 30-80% of small gloo collectives stall for a
    scheduler tick (~4 ms) instead of 10-15%, because gloo's threads then hand work over on one core.
    Whatever you choose, use the same for every collector and the DDP run. Returns the pinned cores.
    """
    if mode not in ("auto", "on", "off"):
        raise CollectorError(f"--pin {mode!r}: expected auto, on or off")
    if mode == "off" or not hasattr(os, "sched_setaffinity"):
        return []
    available = sorted(os.sched_getaffinity(0))
    per_rank = torch.get_num_threads()
    if per_rank * local_world_size > len(available):
        if mode == "on":
            raise CollectorError(f"--pin on: {local_world_size} ranks x {per_rank} threads > {len(available)} cores")
        return []
    cores = available[local_rank * per_rank : (local_rank + 1) * per_rank]
    os.sched_setaffinity(0, cores)
    return cores


# ----------------------------------------------------------------------------------- distributed
class Dist:
    """The process group of a torchrun launch (or a lone process), and who is who."""

    def __init__(self, backend: str | None, timeout_s: float, need_group: bool = True, pin: str = "off") -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)))
        self.backend = backend or "gloo"
        if self.backend not in ("gloo", "nccl"):
            raise CollectorError(f"--backend {self.backend!r}: expected gloo or nccl")
        # Before the process group exists, so that gloo's threads inherit the affinity.
        self.cores = pin_cores(self.local_rank, self.local_world_size, pin if self.backend == "gloo" else "off")
        if self.backend == "nccl":
            if not torch.cuda.is_available():
                raise CollectorError("--backend nccl needs CUDA GPUs; use --backend gloo on CPUs")
            visible = torch.cuda.device_count()
            if self.local_rank >= visible:  # NCCL runs one rank per GPU ("Duplicate GPU detected" otherwise)
                raise CollectorError(f"--backend nccl: {self.local_world_size} ranks on this node but {visible} "
                                     f"visible GPU(s); NCCL needs one GPU per rank: launch at most {visible} "
                                     "rank(s) per node")
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        self.timeout_s = timeout_s
        self.active = False
        if need_group and (self.world_size > 1 or "MASTER_ADDR" in os.environ):
            kwargs: dict[str, Any] = {"timeout": dt.timedelta(seconds=timeout_s)}
            if self.backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
                kwargs["device_id"] = self.device  # torch >= 2.3: eager NCCL init, bound to this GPU
            dist.init_process_group(self.backend, **kwargs)
            self.active = True
        self.hosts = self.all_gather_object(socket.gethostname())
        self.num_nodes = len(dict.fromkeys(self.hosts))
        if self.world_size % self.num_nodes:
            raise CollectorError(f"{self.world_size} ranks on {self.num_nodes} hosts: ranks per host must be equal")
        self.ranks_per_node = self.world_size // self.num_nodes

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            if self.backend == "nccl":
                dist.barrier(device_ids=[self.local_rank])
            else:
                dist.barrier()

    def max_over_ranks(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum over ranks (the slowest rank's time for each repeat)."""
        return self.reduce_over_ranks(values, dist.ReduceOp.MAX)

    def row_of_slowest_rank(self, values: Sequence[float], key: int = -1) -> list[float]:
        """The ``values`` of the rank whose ``values[key]`` is largest (ties: the lowest rank)."""
        if not self.active:
            return [float(v) for v in values]
        mine = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        rows = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(rows, mine)
        slowest = max(range(self.world_size), key=lambda r: (float(rows[r][key]), -r))
        return [float(v) for v in rows[slowest].cpu()]

    def mean_over_ranks(self, values: Sequence[float]) -> list[float]:
        out = self.reduce_over_ranks(values, dist.ReduceOp.SUM)
        return [v / self.world_size for v in out]

    def reduce_over_ranks(self, values: Sequence[float], op: Any) -> list[float]:
        if not self.active:
            return [float(v) for v in values]
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return [float(v) for v in t.cpu()]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()
            self.active = False


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + " (CPU)"
    except OSError:
        pass
    import platform

    return (platform.processor() or platform.machine()) + " (CPU)"


def run_info(d: Dist, started_at: str) -> RunInfo:
    nccl = None
    if d.device.type == "cuda":
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # NCCL missing from this build
            nccl = None
    return RunInfo(
        world_size=d.world_size,
        num_nodes=d.num_nodes,
        ranks_per_node=d.ranks_per_node,
        backend=d.backend if d.active else "none",
        device="cuda" if d.device.type == "cuda" else "cpu",
        hosts=d.hosts,
        device_names=d.all_gather_object(device_name(d.device)),
        torch_version=torch.__version__,
        nccl_version=nccl,
        num_threads=torch.get_num_threads(),
        pinned_cores=[c for c in d.all_gather_object(d.cores) if c] or [],
        started_at=started_at,
        argv=list(sys.argv),
        load_average_1m=[_load_average()],
    )


def _load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0


def finished(info: RunInfo) -> RunInfo:
    """``info`` with the load average at the end of the run appended."""
    return info.model_copy(update={"load_average_1m": [*info.load_average_1m[:1], _load_average()]})


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------- timing
class Timer:
    """Wall-clock timing that waits for the device: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed_s(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3
        return float(end - start)


# ------------------------------------------------------------------------------ progress, failure
class Progress:
    """One line per measurement on rank 0's stderr."""

    def __init__(self, enabled: bool, total: int | None = None) -> None:
        self.enabled, self.total, self.done, self.start = enabled, total, 0, time.perf_counter()

    def __call__(self, message: str) -> None:
        self.done += 1
        if self.enabled:
            of = f"/{self.total}" if self.total else ""
            elapsed = time.perf_counter() - self.start
            print(f"[{self.done}{of} {elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        if self.enabled:
            print(message, file=sys.stderr, flush=True)


class Watchdog:
    """Ends the process if :meth:`beat` is not called for ``timeout_s`` seconds (a hung rank or peer)."""

    def __init__(self, timeout_s: float, on_timeout: Callable[[str], None]) -> None:
        self.timeout_s, self.on_timeout = timeout_s, on_timeout
        self.last = time.monotonic()
        self.what = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="simddp-watchdog", daemon=True)
        self._thread.start()

    def beat(self, what: str) -> None:
        self.last, self.what = time.monotonic(), what

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            if time.monotonic() - self.last > self.timeout_s:
                self.on_timeout(f"no progress for {self.timeout_s:.0f} s during {self.what} (a rank hung or died)")
                return


class Collector:
    """Runs a collector body with partial saving, SIGTERM handling and a watchdog.

    ``snapshot(error, complete)`` returns the measurement file as it stands; only rank 0 writes it: to
    ``<out>.partial.json`` while running or after a failure, to ``out`` (removing the partial file) once
    complete.
    """

    def __init__(self, d: Dist, out: Path, snapshot: Callable[[str | None, bool], BaseModel], timeout_s: float,
                 inputs: Sequence[str | Path] = ()) -> None:
        self.d, self.out, self._snapshot, self.inputs = d, out, snapshot, list(inputs)
        self.partial = safeio.partial_path(out)
        self._lock = threading.RLock()  # a signal handler may run fail() inside save_partial on this thread
        self._finished = False
        self._failing = False  # fail() has started (on any thread): a signal then must not re-enter it
        self._measurements = 0
        self.watchdog = Watchdog(timeout_s, self._fail_hard)
        if d.is_main and self.partial.exists():  # an earlier run's, which the docs ask to send back: a re-run
            # replaced it at its first measurement (22 measurements became 1)
            previous = self.partial.with_name(f"{self.partial.stem}.previous{self.partial.suffix}")
            try:
                os.replace(self.partial, previous)
                print(f"calibration: an earlier run's partial results moved to {previous}", file=sys.stderr,
                      flush=True)
            except OSError as err:
                print(f"calibration: warning: an earlier run's partial results in {self.partial} will be replaced "
                      f"({one_line(err)})", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, self._on_signal)
        # Ctrl-C reaches every rank (the terminal signals the whole group): the partial file records why it stopped
        # (it said "error": null, and each rank printed a KeyboardInterrupt traceback).
        signal.signal(signal.SIGINT, self._on_signal)

    def save_partial(self) -> None:
        """Called after every measurement, on every rank; rank 0 rewrites the file."""
        with self._lock:
            if self.d.is_main and not self._finished:
                self._save(None, False)
        self._measurements += 1
        self._maybe_inject_fault()

    def _maybe_inject_fault(self) -> None:
        """Test hook: ``SIMDDP_CALIBRATION_FAULT=exit:RANK:N`` (or ``hang:RANK:N``) kills (or hangs) RANK
        after its N-th measurement, to check that the others stop with partial results in time."""
        spec = os.environ.get(FAULT_ENV)
        if not spec:
            return
        kind, rank, after = spec.split(":")
        if int(rank) == self.d.rank and int(after) == self._measurements:
            print(f"calibration: injected fault {kind!r} on rank {rank} ({FAULT_ENV})", file=sys.stderr, flush=True)
            if kind == "exit":
                # The fault follows the N-th measurement on every rank: let the others read this rank's last sends
                # and record that measurement first. Exiting at once raced them: on a loaded host rank 0 could lose
                # the measurement both had just made (a connection reset, or torchrun's SIGTERM, before its save),
                # and a test expecting N saved measurements found none.
                time.sleep(1.0)
                os._exit(17)
            self.watchdog.stop()
            while True:
                time.sleep(3600)

    def _save(self, error: str | None, complete: bool) -> None:
        write_json(self._snapshot(error, complete), self.out if complete else self.partial, self.inputs)
        if complete:
            self.partial.unlink(missing_ok=True)

    def beat(self, what: str) -> None:
        self.watchdog.beat(what)

    def finish(self) -> None:
        with self._lock:
            self.watchdog.stop()
            if self.d.is_main:
                self._save(None, True)
            self._finished = True

    def fail(self, message: str) -> int:
        """Record the error, keep partial results, say so on stderr; returns the exit status."""
        self._failing = True
        where = f" partial results in {self.partial}" if self.d.is_main else ""
        with self._lock:
            self.watchdog.stop()
            if self.d.is_main and not self._finished:
                try:
                    self._save(message, False)
                except Exception as err:  # e.g. the disk filled up: say so, in the same line
                    where = f" partial results could not be written to {self.partial} ({one_line(err)})"
            self._finished = True
        print(f"calibration: error on rank {self.d.rank}: {message};{where}", file=sys.stderr, flush=True)
        return EXIT_PARTIAL

    def _fail_hard(self, message: str) -> None:
        self.fail(message)
        os._exit(EXIT_PARTIAL)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._failing:
            # fail() is under way (perhaps on this very thread, holding the lock the handler would wait for
            # forever): let it save and print its one line.
            return
        self.fail(f"stopped by signal {signal.Signals(signum).name} (another rank failed, or the run was killed)")
        os._exit(EXIT_PARTIAL)


def exit_worker(status: int) -> NoReturn:
    """End a torchrun worker with ``status`` once its results are written, without the interpreter's teardown.

    At interpreter exit, Gloo's C++ worker threads may still hold work objects whose tensors refer to Python
    objects; tearing those down while the interpreter finalizes can abort the process (``terminate called
    without an active exception``, SIGABRT) after a run that succeeded, and torchrun then reports the run as
    failed (pytorch/pytorch#179291 describes the race; this project's CPU test of the three collectors saw it
    after ``destroy_process_group`` about once in six CI runs). Everything a worker writes is written and
    closed by then (``write_json``), so only the standard streams need flushing before leaving at once."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said there
            pass
    os._exit(status)


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def add_common_args(parser: Any, default_timeout_s: float = 300.0) -> None:
    from simddp.cli import non_negative_int, positive_float, positive_int

    parser.add_argument("--out", required=True, type=Path, help="output JSON file (written by rank 0)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads per rank")
    parser.add_argument(
        "--timeout", type=positive_float, default=default_timeout_s,
        help="seconds without progress (or inside one collective) before giving up with partial results",
    )
    parser.add_argument("--pin", choices=("auto", "on", "off"), default="off",
                        help="CPU only: pin each rank to its own cores (auto: when there are enough); default off")
    parser.add_argument("--warmup", type=non_negative_int, default=None, help="warm-up iterations per measurement")
    parser.add_argument("--repeats", type=positive_int, default=None, help="timed repeats per measurement")


__all__ = [
    "EXIT_PARTIAL",
    "EXIT_USAGE",
    "Collector",
    "CollectorError",
    "Dist",
    "Progress",
    "Timer",
    "Watchdog",
    "add_common_args",
    "build_model",
    "check_out",
    "count_autograd_nodes",
    "device_name",
    "dtype_name",
    "finished",
    "load_factory",
    "make_optimizer",
    "model_file",
    "one_line",
    "pin_cores",
    "run_info",
    "scalar_loss",
    "set_threads",
    "trainable_parameters",
    "usage_error",
    "utc_now",
]
