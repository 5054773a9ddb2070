"""torchrun, ending with a worker's own exit status and message: ``python -m simddp_calibration.launch ...``.

``simddp calibrate collect`` runs the collectors through this module. It is ``python -m
torch.distributed.run`` (torchrun) itself, with the same options, except for how a failed run ends:
torchrun raises ``ChildFailedError`` and prints its traceback and a failure table; here the run ends
with the collectors' documented exit status (2: a bad argument, nothing measured; 3: stopped early,
partial results kept), and the one-line message the worker printed is the only error shown. torchrun's own
warnings are quieted (``LOGLEVEL=ERROR`` unless set), and so are its failure logs.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence


def worker_status(exit_codes: Sequence[int]) -> int:
    """The collectors' documented status from the failed workers' codes: 2 when every failed worker refused
    its arguments (nothing was measured), else 3 (a rank stopped, crashed or was killed: the run ended early
    and rank 0 kept what was measured in the partial file). A worker ended by SIGTERM (-15) beside one that failed
    on its own is torchrun stopping the others after the first failure, not a cause: a bad argument refused by one
    rank while torchrun stopped the other read as 3, about half the time."""
    causes = [c for c in exit_codes if c != -signal.SIGTERM] or list(exit_codes)
    return 2 if causes and all(c == 2 for c in causes) else 3


def nproc_problem(args: Sequence[str]) -> str | None:
    """What is wrong with the launcher's ``--nproc-per-node``, or None: torchrun starts that many processes at
    once, so a count beyond :data:`~simddp.limits.MAX_NPROC_PER_NODE` (more than any node's GPUs or cores)
    would fork until the machine runs out of memory. Only a number is judged (torchrun's gpu/cpu/auto stay)."""
    from simddp.limits import MAX_NPROC_PER_NODE

    for k, arg in enumerate(args):
        if arg == "-m":  # the collector's own options follow
            break
        name, eq, value = arg.partition("=")
        if name not in ("--nproc-per-node", "--nproc_per_node"):
            continue
        value = value if eq else (args[k + 1] if k + 1 < len(args) else "")
        if value.strip().isdigit() and int(value) > MAX_NPROC_PER_NODE:
            return (f"--nproc-per-node({int(value):,}) is over the limit of {MAX_NPROC_PER_NODE:,} ranks per node "
                    "(simddp.limits.MAX_NPROC_PER_NODE)")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    problem = nproc_problem(args)
    if problem:
        print(f"simddp calibrate collect: error: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("LOGLEVEL", "ERROR")
    # Until torchrun installs its own handlers (while torch imports, a few seconds), a SIGTERM ended this process
    # with 143 and no word: it is the same stop as later.
    signal.signal(signal.SIGTERM, _stopped)
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun
    except _Stopped:
        return _say_stopped(signal.SIGTERM, args)
    except KeyboardInterrupt:
        return _say_stopped(signal.SIGINT, args)

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        torchrun(args)
    except ChildFailedError as err:
        return worker_status([f.exitcode for _, f in sorted(err.failures.items())])
    except SignalException as err:  # the launcher was stopped (Ctrl-C, SIGTERM), and its ranks with it
        return _say_stopped(err.sigval, args)
    except _Stopped:
        return _say_stopped(signal.SIGTERM, args)
    except KeyboardInterrupt:
        return _say_stopped(signal.SIGINT, args)
    return 0


class _Stopped(Exception):
    """SIGTERM before torchrun's own handler was in place."""


def _stopped(signum: int, frame: object) -> None:
    raise _Stopped


def _say_stopped(sig: int, args: Sequence[str]) -> int:
    """One line for a run stopped by a signal, saying where what was measured is, or that nothing was (the line
    claimed a partial file when the ranks had not started); the collectors' status 3."""
    from simddp.safeio import partial_path, shown_path

    out = next((a.split("=", 1)[1] for a in args if a.startswith("--out=")), None) or next(
        (args[k + 1] for k, a in enumerate(args[:-1]) if a == "--out"), None)
    partial = partial_path(out) if out else None
    kept = (f"what was measured is in {shown_path(partial)}" if partial is not None and partial.exists()
            else "nothing was measured")
    print(f"simddp calibrate collect: stopped by {signal.Signals(sig).name}; {kept}", file=sys.stderr)
    return 3


if __name__ == "__main__":
    raise SystemExit(main())
