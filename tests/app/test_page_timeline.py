"""Timeline page: Gantt of backward per layer against bucket all-reduces, bucket table, pipeline rows."""

from __future__ import annotations

from apptest_helpers import assert_clean, default_result, figure, metric, open_page, start

import simddp
from simddp import sweeps, units


def test_gantt_of_the_default_step() -> None:
    at = open_page(start(), "timeline")
    ref = default_result()
    assert metric(at, "Buckets") == str(len(ref.buckets))
    assert metric(at, "All communication") == units.fmt_time(ref.comm_time_s)
    fig = figure(at, "step")
    rows = {y for trace in fig["data"] for y in trace["y"]}
    assert rows == {"compute", "comm"}
    names = {t["name"] for t in fig["data"]}
    assert {"backward per layer", "bucket all-reduce / reduce-scatter"} <= names
    comm = next(t for t in fig["data"] if t["name"].startswith("bucket"))
    assert len(comm["x"]) == len(ref.buckets)
    table = at.main.dataframe[0].value
    assert len(table) == len(ref.buckets)


def test_zoom_toggle_and_a_change_of_bucket_cap() -> None:
    at = open_page(start(), "timeline")
    assert figure(at, "step")["layout"]["xaxis"].get("range")
    at.toggle(key="timeline_zoom").set_value(False).run()
    assert not figure(at, "step")["layout"]["xaxis"].get("range")
    before = metric(at, "Buckets")
    at.session_state["scenario"] = sweeps.set_value(at.session_state["scenario"], "ddp.bucket_cap_mb", 500.0)
    at.run()
    expected = simddp.simulate(at.session_state["scenario"], trace=False)
    assert metric(at, "Buckets") == str(len(expected.buckets)) != before


def test_pipeline_schedule_rows() -> None:
    at = start()
    data = sweeps.with_values(at.session_state["scenario"], {"parallelism.pp": 4})
    at.session_state["scenario"] = data
    at = open_page(at, "timeline")
    result = simddp.simulate(data)
    assert result.trace is not None
    fig = figure(at, "step")
    rows = {y for trace in fig["data"] for y in trace["y"]}
    assert rows == {s.stream for s in result.trace.spans}
    assert len(rows) >= 4  # rows per pipeline stage
    assert any(t["name"] == "forward of a micro-batch (pipeline)" and any(t.get("text", [])) for t in fig["data"])


def test_banner_first_when_the_layout_does_not_fit() -> None:
    at = start()
    at.selectbox(key="w:parallelism.zero_stage").set_value(0).run()  # plain DDP: 16 B/param on every GPU
    at.switch_page("app_pages/timeline.py").run()
    assert_clean(at, errors_allowed=True)
    (banner,) = at.error
    assert banner.value.startswith("**DOES NOT FIT: needs 133.8 GiB per GPU, 79.6 GiB available (54.2 GiB over)**")
