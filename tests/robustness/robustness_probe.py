"""Run the robustness corpus and count clean and unclean outcomes.

    python tests/robustness/robustness_probe.py                 # this checkout, each case in its own process
    python tests/robustness/robustness_probe.py --root OLD --old  # an older checkout (git archive 90a9fe7)
    python tests/robustness/robustness_probe.py -k fifo --no-torch  # a subset

Each case runs in a fresh folder under a temporary directory (its working directory, HOME and TMPDIR),
with a "victim" file in a sibling folder; see :mod:`robustness_corpus` for what counts as clean. The
suite (``test_corpus.py``) runs the same cases in-process through :func:`run_case`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from robustness_corpus import Case, Outcome, cases, fingerprint, judge, write_fixtures

ROOT = Path(__file__).resolve().parents[2]
VICTIM = "the victim's content\n"
_CODE_WRAPPER = """
import sys
try:
    exec(compile(sys.argv[1], "<case>", "exec"), {"__name__": "__case__"})
except Exception as err:
    from simddp import ScenarioError
    if isinstance(err, ScenarioError):
        print(f"ScenarioError: {err}", file=sys.stderr)
        sys.exit(2)
    raise
"""


class Timeout(BaseException):
    """Raised by :func:`time_bound` in the main thread when the bound passes."""


def _snapshot(case_dir: Path) -> dict[str, str]:
    names = [p for p in case_dir.rglob("*") if not p.is_dir() or p.is_symlink()]
    out = {str(p.relative_to(case_dir)): fingerprint(p) for p in names}
    outside = case_dir.parent / "outside"
    for p in outside.iterdir():
        out[f"../outside/{p.name}"] = fingerprint(p)
    return out


def _fill(text: str, root: Path, python: str) -> str:
    return (text.replace("{python}", python).replace("{models}", str(root / "calibration" / "models"))
            .replace("{app}", str(root / "app")))


def _command(case: Case, root: Path, old: bool, python: str) -> list[str]:
    if case.code:
        return [python, "-c", _CODE_WRAPPER, _fill(case.code, root, python)]
    if old and case.old_argv is not None:
        return [_fill(a, root, python) for a in case.old_argv]
    return [python, "-m", "simddp.cli", *(_fill(a, root, python) for a in case.argv)]


def _env(case: Case, case_dir: Path, root: Path) -> dict[str, str]:
    tmp = case_dir.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, HOME=str(case_dir.parent), TMPDIR=str(tmp), OMP_NUM_THREADS="1",
               PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    env.pop("SIMDDP_CALIBRATION_FAULT", None)
    for tag in case.tags:
        if tag.startswith("fault:"):
            env["SIMDDP_CALIBRATION_FAULT"] = tag.removeprefix("fault:")
    return env


def _run_subprocess(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> Outcome:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return Outcome(proc.returncode, out, err, time.perf_counter() - start)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Outcome(None, out, err, time.perf_counter() - start)


@contextlib.contextmanager
def time_bound(seconds: float) -> Iterator[None]:
    """Raise :class:`Timeout` in this (main) thread if the block runs longer than ``seconds``."""

    def fire(signum: int, frame: object) -> None:
        raise Timeout

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run_in_process(case: Case, cwd: Path, root: Path) -> Outcome:
    """Run a CLI case (``simddp.cli.main``) or an API snippet in this process, under a time bound."""
    from simddp import ScenarioError
    from simddp.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    old_cwd = os.getcwd()
    rc: int | None
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), time_bound(case.timeout_s):
            if case.code:
                try:
                    exec(compile(_fill(case.code, root, sys.executable), "<case>", "exec"), {"__name__": "__case__"})
                    rc = 0
                except ScenarioError as err:
                    print(f"ScenarioError: {err}", file=sys.stderr)
                    rc = 2
            else:
                try:
                    rc = main([_fill(a, root, sys.executable) for a in case.argv])
                except SystemExit as exit_:
                    rc = exit_.code if isinstance(exit_.code, int) else 2
    except Timeout:
        rc = None
    except Exception as err:
        import traceback

        stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_exception(err)))
        rc = 1
    finally:
        os.chdir(old_cwd)
    return Outcome(rc, stdout.getvalue(), stderr.getvalue(), time.perf_counter() - start)


def prepare(case: Case, base: Path, fixtures: Path) -> Path:
    """A fresh case folder with its fixture copies, setup applied, and a victim beside it."""
    case_dir = base / "case"
    case_dir.mkdir(parents=True)
    (base / "outside").mkdir()
    (base / "outside" / "victim.txt").write_text(VICTIM)
    for name in case.copy:
        shutil.copy(fixtures / name, case_dir / name)
    if case.setup is not None:
        case.setup(case_dir)
    return case_dir


def run_case(case: Case, base: Path, fixtures: Path, root: Path = ROOT, old: bool = False,
             in_process: bool = False, python: str = sys.executable) -> tuple[str | None, Outcome]:
    """(the problem or None, the outcome) of one case, run in ``base``."""
    case_dir = prepare(case, base, fixtures)
    before = _snapshot(case_dir)
    if in_process and not case.subprocess:
        outcome = _run_in_process(case, case_dir, root)
    else:
        outcome = _run_subprocess(_command(case, root, old, python), case_dir, _env(case, case_dir, root),
                                  case.timeout_s)
    after = _snapshot(case_dir)
    return judge(case, outcome, before, after), outcome


def make_fixtures(folder: Path, root: Path = ROOT, in_process: bool = False, python: str = sys.executable) -> Path:
    def run_cli(argv: Sequence[str], cwd: Path) -> None:
        case = Case(name="fixtures", argv=tuple(argv), expect="ok")
        if in_process:
            outcome = _run_in_process(case, cwd, root)
        else:
            outcome = _run_subprocess(_command(case, root, False, python), cwd,
                                      dict(os.environ, PYTHONPATH=str(root)), 120)
        if outcome.returncode != 0:
            raise RuntimeError(f"fixtures: simddp {' '.join(argv)} failed: {outcome.stderr[-2000:]}")

    write_fixtures(folder, run_cli)
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=ROOT, help="checkout to probe (default: this one)")
    p.add_argument("--old", action="store_true", help="the checkout predates `simddp calibrate collect`")
    p.add_argument("-k", dest="keyword", default="", help="only cases whose name contains this")
    p.add_argument("--no-torch", action="store_true", help="skip the collector cases")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    selected = [c for c in cases() if args.keyword.lower() in c.name.lower() and not (args.no_torch and c.torch)]
    root = args.root.resolve()
    with tempfile.TemporaryDirectory(prefix="simddp-probe-") as tmp:
        fixtures = make_fixtures(Path(tmp) / "fixtures", root)

        def one(item: tuple[int, Case]) -> tuple[Case, str | None, Outcome]:
            k, case = item
            problem, outcome = run_case(case, Path(tmp) / f"{k:03d}", fixtures, root, args.old)
            return case, problem, outcome

        clean = 0
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for case, problem, outcome in pool.map(one, enumerate(selected)):
                clean += problem is None
                status = "clean  " if problem is None else "UNCLEAN"
                print(f"{status} {outcome.elapsed_s:6.1f}s  {case.name}" + (f": {problem}" if problem else ""),
                      flush=True)
    print(f"\n{clean} of {len(selected)} cases clean, {len(selected) - clean} unclean ({root})")
    return 0 if clean == len(selected) else 1


if __name__ == "__main__":
    raise SystemExit(main())
