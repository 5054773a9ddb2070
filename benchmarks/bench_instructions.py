"""CPU instructions per evaluation, counted by valgrind: a measure a busy host does not move.

On a shared 2-core machine the same code's wall-clock times swing 1.5-2x between minutes, so a change of 5-10%
cannot be seen in timings; instruction counts repeat to 0.1%. The child's string hashing is seeded alike
(``PYTHONHASHSEED=0``): with random seeds the same code's counts moved by up to 1% between runs (sets and dicts of
strings lay out and probe differently). Each case runs in a child process under
``valgrind --tool=callgrind`` twice, once with ``n`` evaluations and once with none (imports, presets and the
first evaluation's warm-up); the difference over ``n`` is one evaluation's count. Every engine cache is cleared
before each evaluation, as in ``bench_engine.py``. Needs valgrind (Debian: ``apt-get install valgrind``); about
a minute per case.

    python benchmarks/bench_instructions.py [--cases default,gpt3,1t,sweep,3d]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name -> (the bench_engine case it runs, evaluations counted, what one unit is)
CASES = {
    "default": ("default", 5, "evaluation"),
    "gpt3": ("GPT-3", 2, "evaluation"),
    "1t": ("1T", 1, "evaluation"),
    "sweep": ("sweep", 1, "200 points of bench_engine's sweep"),
    "3d": ("GPT-3 175B 3D", 2, "evaluation"),  # bench_engine's EXTRA: dp 16 pp 8 v2, overlapped reduction
    "fsdp": ("Llama-2-70B FSDP", 2, "evaluation"),  # bench_engine's EXTRA: ZeRO-3, the fluid engine
}

_CHILD = """
import sys
sys.path.insert(0, "benchmarks")
import bench_engine as b, simddp
case, n = sys.argv[1], int(sys.argv[2])
if case == "sweep":
    scenarios = [simddp.as_scenario(c) for c in b.sweep_configs()[:200]]
    simddp.simulate(scenarios[0], trace=False)
    b.clear_caches()
    for _ in range(n):
        for s in scenarios:
            simddp.simulate(s, trace=False)
else:
    cases = {**b.CASES, **b.EXTRA}
    scenario = b.scenario_of(cases[next(k for k in cases if k.startswith(case))])
    simddp.simulate(scenario, trace=False)
    for _ in range(n):
        b.clear_caches()
        simddp.simulate(scenario, trace=False)
"""


def instructions(case: str, n: int) -> int:
    """Instructions callgrind counts for the child running ``n`` units of ``case``."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                           _CHILD, case, str(n)], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"valgrind printed no instruction count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("bench_instructions.py: valgrind is not installed (apt-get install valgrind)")
    print("| case | instructions per unit | unit |\n|---|---|---|")
    for name in args.cases.split(","):
        if name not in CASES:
            raise SystemExit(f"--cases: unknown case {name!r}; valid: {', '.join(CASES)}")
        case, n, unit = CASES[name]
        per = (instructions(case, n) - instructions(case, 0)) / n
        print(f"| {name} | {per / 1e6:,.1f} M | {unit} |", flush=True)


if __name__ == "__main__":
    main()
