"""Every hostile input of the corpus ends in a valid result or one clean error line, in bounded time,
with every input file unchanged and nothing outside the case's folder touched (see robustness_corpus).

CLI and API cases run in this process (``simddp.cli.main`` under a time bound); the dashboard and
``simddp app`` cases in their own process. The collector cases need torchrun and are covered by
tests/calibration/test_calibration_torch.py; ``python tests/robustness/robustness_probe.py`` runs them all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from robustness_corpus import Case, cases
from robustness_probe import make_fixtures, run_case

CASES = [c for c in cases() if not c.torch]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fixtures(tmp_path_factory.mktemp("fixtures"), in_process=True)


def test_the_corpus_covers_every_item_of_the_issue() -> None:
    names = " ".join(c.name for c in cases()).lower()
    for topic in ("is an input", "device node", "fifo", "temp symlink", "quadratic", "num-gpus 1e9", "20 mib",
                  "alias bomb", "500 deep", "preset is a list", "calibration is a number", "median_s 0",
                  "port -5", ".inf", ".nan", "nan timings", "--z", "one measurement point", "no all-reduce",
                  "4-rank compute", "mixed num_ranks", "another model", "server path", "shared folder",
                  "ansi escape", "duplicate yaml key", "true where an integer", "unwritable --out",
                  "failed re-run"):
        assert topic in names, topic
    assert len(cases()) >= 180


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_ends_cleanly(case: Case, fixtures: Path, tmp_path: Path) -> None:
    problem, outcome = run_case(case, tmp_path, fixtures, in_process=True)
    assert problem is None, (f"{problem}\nexit {outcome.returncode} after {outcome.elapsed_s:.1f} s\n"
                             f"stdout: {outcome.stdout[-1500:]}\nstderr: {outcome.stderr[-1500:]}")
