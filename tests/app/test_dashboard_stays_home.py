"""The dashboard stays home: uploads cannot name server-side files, are parsed in memory within simddp's
caps (nothing written to disk), and hostile uploads end in an inline message, never a traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from apptest_helpers import assert_clean, open_page, start
from calibration_data import write_all

from simddp_app import state

SCENARIO = "cluster: {preset: dgx-a100-80gb, num_nodes: 2}\nmodel: {preset: gpt2}\n"


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system temporary directory, replaced by an empty one to see whether anything lands there."""
    folder = tmp_path / "systmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _upload_scenario(text: str | bytes) -> list[str]:
    at = open_page(start(), "compare")
    content = text.encode() if isinstance(text, str) else text
    at.file_uploader(key="compare_upload").set_value(("up.yaml", content, "application/x-yaml")).run()
    assert_clean(at, errors_allowed=True)
    assert "up.yaml" not in (at.session_state["saved_scenarios"] if "saved_scenarios" in at.session_state else {})
    return [e.value for e in at.error]


@pytest.mark.parametrize("path", ["/etc/passwd", "/root", "/nonexistent/profile.json", "profile.json"])
def test_an_uploaded_scenario_cannot_name_a_server_path(path: str) -> None:
    errors = _upload_scenario(f"calibration: {path}\n{SCENARIO}")
    assert len(errors) == 1
    assert "cannot name a file on the server" in errors[0]
    assert "malformed" not in errors[0] and "is a directory" not in errors[0] and "no such file" not in errors[0]


@pytest.mark.parametrize("text, problem", [
    ("x: " + "[" * 500 + "]" * 500 + "\n" + SCENARIO, "nesting deeper than 32 levels"),
    (SCENARIO + "model: {preset: gpt2-xl}\n", "duplicate key 'model'"),
    (SCENARIO + "name: &a [*a]\n", "refers to its own anchor"),
    (SCENARIO + "cluster_x: !!python/object/apply:os.system ['true']\n", "malformed YAML"),
    (SCENARIO.replace("num_nodes: 2", "num_nodes: .inf"), "finite number"),
    (bytes(range(256)), "not a text file"),
])
def test_hostile_uploads_end_in_one_inline_message(text: str | bytes, problem: str) -> None:
    errors = _upload_scenario(text)
    assert len(errors) == 1 and errors[0].startswith("up.yaml: ") and problem in errors[0], errors


def test_a_planner_scenario_naming_a_file_is_refused_inline() -> None:
    at = start()
    data = dict(at.session_state["scenario"])
    data["calibration"] = "/etc/passwd"
    at.session_state["scenario"] = data
    at.run()
    assert_clean(at, errors_allowed=True)
    assert any("cannot name a file on the server" in e.value for e in at.error)


def test_calibration_uploads_are_never_written_to_disk(private_tmp: Path, tmp_path: Path) -> None:
    files = write_all(tmp_path / "files")
    at = open_page(start(), "calibration")
    at.file_uploader(key="cal_profile").set_value(("profile.json", files["profile"].read_bytes(),
                                                   "application/json")).run()
    at.file_uploader(key="cal_ddp").set_value(("ddp.json", files["ddp"].read_bytes(), "application/json")).run()
    assert_clean(at)
    assert list(private_tmp.iterdir()) == []


def test_calibration_upload_errors_name_the_upload_not_a_path(tmp_path: Path) -> None:
    at = open_page(start(), "calibration")
    nested = json.dumps({"kind": "simddp-profile", "version": 1, "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]
                                                                              ]]]]]]]]]]]]]]]]]]]]]]]]}).encode()
    at.file_uploader(key="cal_profile").set_value(("mine.json", nested, "application/json")).run()
    assert_clean(at, errors_allowed=True)
    assert len(at.error) == 1 and "mine.json: nesting deeper than 32 levels" in at.error[0].value
    assert str(tmp_path) not in at.error[0].value and "/tmp" not in at.error[0].value


def test_state_parses_uploads_in_memory() -> None:
    assert state.parse_scenario_upload("a.yaml", SCENARIO.encode())["model"] == {"preset": "gpt2"}
    with pytest.raises(state.simddp.ScenarioError, match=r"a\.yaml: calibration: a scenario in the dashboard"):
        state.parse_scenario_upload("a.yaml", (SCENARIO + "calibration: p.json\n").encode())
    with pytest.raises(state.simddp.ScenarioError, match="over the 20,971,520-byte input limit"):
        state.parse_scenario_upload("a.yaml", b" " * (20 * 2**20 + 1))
