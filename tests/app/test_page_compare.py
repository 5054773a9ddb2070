"""Compare page: saved and uploaded scenarios side by side."""

from __future__ import annotations

import pytest
import yaml
from apptest_helpers import assert_clean, figure, open_page, start

import simddp
from simddp import units


def test_empty_then_examples_side_by_side() -> None:
    at = open_page(start(), "compare")
    assert at.main.info
    at.button(key="compare_examples").click().run()
    assert_clean(at)
    table = at.main.dataframe[0].value
    assert list(table["scenario"]) == ["planner", "ZeRO-1", "100 MiB buckets", "100 Gbit/s NICs", "no overlap"]
    saved = at.session_state["saved_scenarios"]
    steps = [simddp.simulate(saved[n], trace=False).step_time_s / units.MS for n in table["scenario"]]
    assert list(table["step time (ms)"]) == pytest.approx(steps, rel=1e-9)  # traced (simpy) vs fast engine
    assert table["step time (ms)"][4] > table["step time (ms)"][0]  # no overlap is slower
    assert figure(at, "Step time by scenario")


def test_save_from_the_sidebar_and_load_into_the_planner() -> None:
    at = start()
    at.number_input(key="w:cluster.num_nodes").set_value(4).run()
    at.sidebar.text_input(key="save_name").set_value("four nodes").run()
    at.sidebar.button(key="save_for_compare").click().run()
    assert list(at.session_state["saved_scenarios"]) == ["four nodes"]
    at.sidebar.button(key="reset_default").click().run()
    assert at.session_state["scenario"]["cluster"]["num_nodes"] == 16
    at = open_page(at, "compare")
    assert list(at.main.dataframe[0].value["GPUs"]) == [32]
    at.button(key="compare_load").click().run()
    assert at.session_state["scenario"]["cluster"]["num_nodes"] == 4


def test_upload_scenarios_good_and_bad() -> None:
    at = open_page(start(), "compare")
    good = yaml.safe_dump({"name": "gpt2-on-a100", "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
                           "model": {"preset": "gpt2"}, "training": {"micro_batch_size": 8, "seq_len": 1024}})
    bad = yaml.safe_dump({"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2}, "model": {"preset": "gpt2"},
                          "parallelism": {"tp": 3}})
    at.file_uploader(key="compare_upload").set_value([("good.yaml", good.encode(), "application/x-yaml"),
                                                      ("bad.yaml", bad.encode(), "application/x-yaml")]).run()
    assert_clean(at, errors_allowed=True)
    assert len(at.error) == 1 and "bad.yaml" in at.error[0].value and "tp(3)" in at.error[0].value
    table = at.main.dataframe[0].value
    assert list(table["scenario"]) == ["gpt2-on-a100"]
    assert list(table["GPUs"]) == [16]


def test_uploads_of_one_name_are_kept_apart() -> None:
    """Two different files that both say `name: same` are two rows (the second replaced the first silently); the
    same file twice is one."""
    at = open_page(start(), "compare")
    doc = {"name": "same", "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2}, "model": {"preset": "gpt2"},
           "training": {"micro_batch_size": 8, "seq_len": 1024}}
    other = {**doc, "ddp": {"bucket_cap_mb": 100}}
    at.file_uploader(key="compare_upload").set_value([
        ("a.yaml", yaml.safe_dump(doc).encode(), "application/x-yaml"),
        ("b.yaml", yaml.safe_dump(other).encode(), "application/x-yaml"),
        ("a2.yaml", yaml.safe_dump(doc).encode(), "application/x-yaml")]).run()
    assert_clean(at, errors_allowed=False)
    table = at.main.dataframe[0].value
    assert list(table["scenario"]) == ["same", "same (b.yaml)"]
    assert len(at.info) == 1 and "saved as 'same (b.yaml)'" in at.info[0].value
    steps = {n: simddp.simulate(d, trace=False).step_time_s for n, d in (("same", doc), ("same (b.yaml)", other))}
    assert list(table["step time (ms)"]) == pytest.approx([steps[n] / units.MS for n in table["scenario"]], rel=1e-9)
