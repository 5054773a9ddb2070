"""Every command shown in README.md and docs/ runs, so a documented example can never fail again.

Commands are read from the fenced code blocks of the Markdown files:

* ``bash``/``sh``/``shell`` blocks run as scripts (``set -eo pipefail``), one per block, in document order,
  in one scratch directory per file that mirrors the repository (so ``examples/...`` resolves and what one
  block writes, the next can read); ``simddp``, ``python`` and ``.venv/bin/...`` are this environment's.
* ``console`` blocks (and untagged blocks of ``$ `` lines) run each ``$`` command alone and check what the
  block shows after it: documented ``simddp: error:`` lines must be the command's exact stderr, with exit
  code 2; otherwise the exit code must be 0 and every row label shown (the text before the figures) must
  appear in the real output, so renamed or missing rows fail while numbers may move.
* Server commands (``simddp app``) are started, must answer on their port, and are stopped; they get a
  free port (``--port``) and run headless, as CI has neither the documented port nor a browser.
* An untagged block that starts with a command fails: tag it (``bash``, ``console``) or mark it ``text``.

A command that cannot run here is listed in ``NOT_RUN`` with the reason; an entry that no longer matches a
documented command fails, so the list stays true. Entries marked slow run with ``SIMDDP_DOCS_SLOW=1``.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPT_LANGS = {"bash", "sh", "shell"}
COMMAND_WORDS = ("simddp", "python", "python3", ".venv/", "torchrun", "streamlit", "pip", "$ ")
RUN_SLOW = os.environ.get("SIMDDP_DOCS_SLOW") == "1"
CPU_CALIBRATION = ("the CPU calibration run takes about 2 minutes of torchrun on 2 cores; "
                   "tests/calibration/test_calibration_torch.py runs the same collectors, fit and validate with "
                   "the tiny model")

#: Documented commands that do not run in the test suite, with the reason. Keys are the command as shown
#: (continuation lines joined, whitespace collapsed, trailing comment dropped). ``slow`` ones run with
#: SIMDDP_DOCS_SLOW=1; the others cannot run here.
NOT_RUN: dict[str, tuple[str, bool]] = {
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/simddp simulate":
        ("creates a virtual environment and installs the package from the index: CI's own setup (.ci/run) does "
         "it; `simddp simulate` itself runs below", False),
    'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/python -m pytest':
        ("installs the package and runs this test suite: that is CI itself (.ci/run)", False),
    ".venv/bin/python -m pytest": ("the whole test suite, from inside it", False),
    ".venv/bin/python -m pytest tests/parity": ("part of this test suite, from inside it", False),
    "python -m pytest tests/app tests/test_sweeps.py": ("part of this test suite, from inside it", False),
    "SIMDDP_SCREENSHOT_DIR=docs/img python -m pytest tests/app/test_browser.py":
        ("rewrites the committed screenshots and needs Chromium; the browser test itself runs in the suite",
         False),
    ".venv/bin/mypy simddp": ("CI runs it itself (.ci/run); about a minute from a cold cache", False),
    "export OMP_NUM_THREADS=1": (CPU_CALIBRATION, True),
    "M=calibration/models/small_transformer.py:factory": (CPU_CALIBRATION, True),
    "simddp calibrate collect comm --nproc-per-node 2 --backend gloo --threads 1 --out comm.json":
        (CPU_CALIBRATION, True),
    "simddp calibrate collect compute --nproc-per-node 2 --model $M --device cpu --threads 1 --out compute.json":
        (CPU_CALIBRATION, True),
    "simddp calibrate fit comm.json compute.json --out profile.json": (CPU_CALIBRATION, True),
    "simddp calibrate collect ddp --nproc-per-node 2 --model $M --threads 1 --bucket-cap-mb 0.25 1 4 25 "
    "--out ddp.json": (CPU_CALIBRATION, True),
    "simddp calibrate validate profile.json ddp.json --extrapolate 2,8,32,128": (CPU_CALIBRATION, True),
    "simddp calibrate collect comm --nproc-per-node 8 --backend nccl --out comm.json":
        ("needs a node with 8 NVIDIA GPUs (NCCL)", False),
    "simddp calibrate collect compute --model my_model.py:factory --device cuda --optimizer adam "
    "--out compute.json": ("needs a CUDA GPU and the user's own model file", False),
    "simddp calibrate collect ddp --nproc-per-node 8 --model my_model.py:factory --optimizer adam "
    "--bucket-cap-mb 5 25 100 default --out ddp.json": ("needs a node with 8 NVIDIA GPUs (NCCL)", False),
    "simddp calibrate validate profile.json ddp.json": ("validates the GPU measurements of the lines above", False),
    "simddp plan examples/gpt3-175b-3d-1024xA100.yaml --gpus 1024 --top 5 --jobs 2 --json > gpt3-plan.json":
        ("searches 25,596 GPT-3 layouts: 10-25 s on 2 cores (benchmarks/bench_planner.py times it)", True),
    "python benchmarks/bench_engine.py":
        ("times issue 10's cases 15 times each and three 1,000-point sweeps: a few minutes (figures in "
         "docs/performance.md)", True),
    "python benchmarks/bench_instructions.py":
        ("runs each case under valgrind, which CI need not have: about ten minutes", True),
    "python benchmarks/bench_inputs.py":
        ("times the worst cases within the input caps: about two minutes (figures in docs/safety.md; "
         "tests/test_config_inputs.py and tests/robustness check the caps)", True),
    "python tests/robustness/robustness_probe.py":
        ("every hostile input in its own process: about two minutes; tests/robustness/test_corpus.py runs the "
         "same cases in-process", True),
    "simddp calibrate collect comm --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 "
    "--backend nccl --out comm.json": ("needs two GPU hosts and a rendezvous host", False),
}


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    lines: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        name = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file."""
    out: list[Block] = []
    current: Block | None = None
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        fence = re.match(r"^```\s*([\w-]*)", text)
        if fence and current is None:
            current = Block(path, number, fence.group(1).lower())
        elif text.startswith("```") and current is not None:
            out.append(current)
            current = None
        elif current is not None:
            current.lines.append(text)
    return out


def logical_lines(lines: list[str]) -> list[str]:
    """Lines with backslash continuations joined."""
    out: list[str] = []
    pending = ""
    for text in lines:
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1].rstrip() + " "
            continue
        out.append(pending + text.strip() if pending else text)
        pending = ""
    return out


def normalise(command: str) -> str:
    """The command as NOT_RUN keys it: a trailing ``  # comment`` dropped, whitespace collapsed."""
    return " ".join(re.sub(r"\s+#\s.*$", "", command.strip()).split())


def is_console(block: Block) -> bool:
    return block.lang == "console" or (block.lang == "" and any(t.startswith("$ ") for t in block.lines))


def script_commands(block: Block) -> list[str]:
    return [normalise(t) for t in logical_lines(block.lines) if t.strip() and not t.strip().startswith("#")]


@dataclass
class ConsoleCommand:
    command: str
    shown: list[str]


def console_commands(block: Block) -> list[ConsoleCommand]:
    out: list[ConsoleCommand] = []
    lines = list(block.lines)
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            text = lines[i][2:]
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1].rstrip() + " " + lines[i].strip()
            out.append(ConsoleCommand(normalise(text), []))
        elif out:
            out[-1].shown.append(lines[i])
        i += 1
    return out


def documented_commands() -> set[str]:
    found: set[str] = set()
    for path in DOCS:
        for block in blocks(path):
            if block.lang in SCRIPT_LANGS:
                found |= set(script_commands(block))
            elif is_console(block):
                found |= {c.command for c in console_commands(block)}
    return found


# --------------------------------------------------------------------------------------------- running
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVE = r'''
_serve() {  # start a server command, wait until its port answers, stop it
  local port=$1; shift
  "$@" > _serve.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do
    if python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" \
         "http://127.0.0.1:$port/_stcore/health" 2>/dev/null; then
      kill $pid; wait $pid 2>/dev/null; return 0
    fi
    kill -0 $pid 2>/dev/null || { cat _serve.log >&2; return 1; }
    sleep 0.25
  done
  kill $pid; cat _serve.log >&2; return 1
}
'''


def server_command(command: str) -> str | None:
    """``simddp app ...`` as a ``_serve`` call on a free port, or None for other commands."""
    args = shlex.split(command)
    if len(args) < 2 or not args[0].endswith("simddp") or args[1] != "app":
        return None
    if "--port" in args:
        k = args.index("--port")
        del args[k:k + 2]
    port = free_port()
    return f"_serve {port} {shlex.join([*args, '--port', str(port)])}"


#: Repository entries a scratch directory does not link: git, the environment, tool caches.
SCRATCH_SKIPS = {".git", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", "__pycache__", ".hypothesis"}


def scratch(tmp: Path) -> Path:
    """A directory that looks like the repository (links to its files) plus .venv, to run commands in."""
    for entry in ROOT.iterdir():
        if entry.name not in SCRATCH_SKIPS:
            (tmp / entry.name).symlink_to(entry)
    (tmp / ".venv").symlink_to(Path(sys.prefix))
    return tmp


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["STREAMLIT_SERVER_HEADLESS"] = "true"
    env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    return env


def run_script(block: Block, cwd: Path) -> str | None:
    """Run a script block; the failure (command, exit code, output) or None."""
    body = []
    for text in logical_lines(block.lines):
        command = normalise(text)
        if command in NOT_RUN and not (RUN_SLOW and NOT_RUN[command][1]):
            body.append(f": not run: {shlex.quote(command)}")
        else:
            body.append(server_command(command) or text)
    script = "set -eo pipefail\n" + SERVE + "\n".join(body) + "\n"
    r = subprocess.run(["bash", "-x", "-c", script], cwd=cwd, env=environment(), capture_output=True, text=True,
                       timeout=900)
    if r.returncode == 0:
        return None
    return f"{block.where}: exit {r.returncode}\n--- stderr (bash -x) ---\n{r.stderr[-4000:]}\n--- stdout ---\n" \
           f"{r.stdout[-2000:]}"


def row_label(line: str) -> str:
    """The label of a shown output row: the text before its first figure or its first wide gap."""
    return re.split(r"\s{2,}|\d", line.strip(), maxsplit=1)[0].strip()


def run_console(block: Block, cwd: Path) -> list[str]:
    problems = []
    for c in console_commands(block):
        if c.command in NOT_RUN and not (RUN_SLOW and NOT_RUN[c.command][1]):
            continue
        r = subprocess.run(["bash", "-c", c.command], cwd=cwd, env=environment(), capture_output=True, text=True,
                           timeout=600)
        errors = [t for t in c.shown if t.startswith("simddp: error:")]
        where = f"{block.where}: $ {c.command}"
        if errors:
            if r.returncode != 2 or r.stderr.strip().splitlines() != errors:
                problems.append(f"{where}\n  documented: {errors}\n  got (exit {r.returncode}): {r.stderr.strip()}")
            continue
        if r.returncode != 0:
            problems.append(f"{where}\n  exit {r.returncode}: {r.stderr.strip()[-2000:]}")
            continue
        missing = [lab for lab in map(row_label, c.shown) if len(lab) >= 3 and lab not in r.stdout]
        if missing:
            problems.append(f"{where}\n  documented rows missing from the output: {missing}")
    return problems


# --------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_documented_commands_run(path: Path, tmp_path: Path) -> None:
    cwd = scratch(tmp_path)
    problems: list[str] = []
    for block in blocks(path):
        if block.lang in SCRIPT_LANGS:
            failure = run_script(block, cwd)
            problems += [failure] if failure else []
        elif is_console(block):
            problems += run_console(block, cwd)
    assert not problems, "\n\n".join(problems)


def test_every_command_block_is_tagged() -> None:
    """A command in an untagged block would go untested: it must say bash or console (or text)."""
    untagged = [b.where for path in DOCS for b in blocks(path)
                if b.lang == "" and not is_console(b) and any(t.strip().startswith(COMMAND_WORDS) for t in b.lines)]
    assert not untagged, f"tag these blocks bash or console (or text, if they only look like commands): {untagged}"


def test_not_run_list_matches_documented_commands() -> None:
    stale = sorted(set(NOT_RUN) - documented_commands())
    assert not stale, f"NOT_RUN lists commands no document shows any more: {stale}"


def test_readme_answers_the_planner_questions() -> None:
    """The six planner questions of issue 12 are answered in the README with commands that run above."""
    text = (ROOT / "README.md").read_text()
    commands = " ".join(documented_commands())
    for needle in ("--set model.preset=llama3-70b --set training.seq_len=8192 --set cluster.num_nodes=32 --fit-layout",
                   "--set cluster.preset=aws-p4d-24xlarge --set parallelism.zero_stage=0",
                   "--set cluster.inter_node.nic_bandwidth_bytes_per_s=200Gbit/s",
                   "examples/transformer-1.3b.yaml --set parallelism.zero_stage=$z",
                   "--trace step-trace.json --csv step-tables", "buckets --set cluster.num_nodes=32 --csv"):
        assert needle in commands, needle
    assert len(re.findall(r"^simddp: error: ", text, flags=re.MULTILINE)) >= 6  # six bad inputs, checked above


def test_the_runner_catches_failures(tmp_path: Path) -> None:
    """The checks above can fail: a failing script, a wrong documented error, a missing row."""
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\nsimddp simulate --set ddp.nope=1\n```\n"
                   "```console\n$ simddp simulate --set parallelism.tp=16\nsimddp: error: something else\n"
                   "$ simddp presets\nclusters:\nno such row here\n```\n")
    script, console = blocks(doc)
    (tmp_path / "run").mkdir()
    cwd = scratch(tmp_path / "run")
    failure = run_script(script, cwd)
    assert failure is not None and "ddp.nope: unknown key" in failure
    problems = run_console(console, cwd)
    assert len(problems) == 2
    assert "documented: ['simddp: error: something else']" in problems[0] and "tp(16) must divide" in problems[0]
    assert "documented rows missing from the output: ['no such row here']" in problems[1]
