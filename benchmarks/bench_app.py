"""Dashboard timings: simulate cached and uncached, every page's AppTest run, and a what-if change.

    python benchmarks/bench_app.py            # prints a markdown table
    python benchmarks/bench_app.py --write    # also puts it into docs/dashboard.md (between the markers)

Times are medians of ``--repeat`` runs on the machine that runs it. "cached" is a hit of the app's
``st.cache_data`` around simddp.simulate (what a re-render of an unchanged scenario costs); a what-if
change re-renders the What-if page with a slider moved to a value not seen before (uncached simulate,
uncached bucket-cap sweep of 10 caps) and then back (cached).
"""

from __future__ import annotations

import argparse
import logging
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "dashboard.md"
START, END = "<!-- bench_app:start -->", "<!-- bench_app:end -->"
PAGES = ["planner", "timeline", "scaling", "memory", "whatif", "calibration", "compare"]


def _median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def measure(repeat: int) -> list[tuple[str, str]]:
    import streamlit.logger
    from streamlit.testing.v1 import AppTest

    streamlit.logger.set_log_level(logging.ERROR)

    import simddp
    from simddp_app import state

    data = state.default_scenario_dict()
    key = state.to_json(data)
    rows: list[tuple[str, str]] = []
    from simddp import engine_caches

    simddp.simulate(data)  # warm imports

    def fresh(trace: bool) -> object:
        """A simulation with every engine cache emptied first (a new scenario, not a repeated one)."""
        engine_caches.clear()
        return simddp.simulate(data, trace=trace)

    rows.append(("simulate, default 128-GPU scenario, trace on (uncached, engine caches cleared)",
                 _ms(_median_s(lambda: fresh(True), repeat))))
    rows.append(("simulate, trace off (what sweeps use; engine caches cleared)",
                 _ms(_median_s(lambda: fresh(False), repeat))))
    state._simulate(key)
    rows.append(("simulate through the app's st.cache_data (cache hit)",
                 _ms(_median_s(lambda: state._simulate(key), repeat))))

    app = str(ROOT / "app" / "streamlit_app.py")
    at = AppTest.from_file(app, default_timeout=120)
    t = time.perf_counter()
    at.run()
    rows.append(("AppTest: first run of the Planner (cold caches)", _ms(time.perf_counter() - t)))
    for page in PAGES:  # first visit fills the caches
        at.switch_page(f"app_pages/{page}.py").run()
    for page in PAGES:
        at.switch_page(f"app_pages/{page}.py")
        rows.append((f"AppTest: {page} page re-render (warm)", _ms(_median_s(at.run, repeat))))
    assert not at.exception, [e.value for e in at.exception]

    at.switch_page("app_pages/whatif.py").run()
    slider = "wi:nic_gbit"
    values = [25.0, 50.0, 100.0, 200.0, 800.0, 1600.0]
    times = []
    for v in values[:repeat]:
        t = time.perf_counter()
        at.select_slider(key=slider).set_value(v).run()
        times.append(time.perf_counter() - t)
    rows.append(("AppTest: what-if slider to a new value (uncached simulate + bucket sweep)",
                 _ms(statistics.median(times))))
    times = []
    for v in values[:repeat]:
        t = time.perf_counter()
        at.select_slider(key=slider).set_value(v).run()
        times.append(time.perf_counter() - t)
    rows.append(("AppTest: what-if slider back to a value seen before (cached)", _ms(statistics.median(times))))
    at.switch_page("app_pages/planner.py").run()
    times = []
    for n in (2, 4, 8, 32, 64, 128)[:repeat]:
        t = time.perf_counter()
        at.number_input(key="w:cluster.num_nodes").set_value(n).run()
        times.append(time.perf_counter() - t)
    rows.append(("AppTest: planner number of nodes to a new value (uncached)", _ms(statistics.median(times))))
    assert not at.exception, [e.value for e in at.exception]
    return rows


def table(rows: list[tuple[str, str]], repeat: int) -> str:
    lines = [f"Measured with `python benchmarks/bench_app.py --write` (median of {repeat}; {platform.machine()}, "
             f"{_cpu_count()} CPUs, Python {platform.python_version()}). AppTest runs the real pages without a "
             "browser; the browser adds its rendering on top.", "", "| what | time |", "|---|---|"]
    lines += [f"| {what} | {t} |" for what, t in rows]
    return "\n".join(lines)


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write", action="store_true", help=f"update the table in {DOC.relative_to(ROOT)}")
    args = parser.parse_args()
    text = table(measure(args.repeat), args.repeat)
    print(text)
    if args.write:
        doc = DOC.read_text()
        if START not in doc:
            raise SystemExit(f"{DOC}: markers {START} / {END} not found")
        DOC.write_text(re.sub(f"{re.escape(START)}.*?{re.escape(END)}", f"{START}\n{text}\n{END}", doc,
                              flags=re.DOTALL))


if __name__ == "__main__":
    main()
