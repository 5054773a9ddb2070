"""simddp.safeio: reading whose cost is bounded on any input, writing that destroys nothing."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from simddp import safeio
from simddp.errors import InternalError, ScenarioError


# ------------------------------------------------------------------------------------------- reading
def test_reads_a_regular_file_and_refuses_everything_else(tmp_path: Path) -> None:
    good = tmp_path / "a.yaml"
    good.write_text("a: 1\n")
    assert safeio.read_mapping(good) == {"a": 1}
    with pytest.raises(ScenarioError, match="no such file"):
        safeio.read_bytes(tmp_path / "missing.yaml")
    with pytest.raises(ScenarioError, match="is a directory"):
        safeio.read_bytes(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ScenarioError, match="is a FIFO"):  # and it returns at once: nothing writes to it
        safeio.read_bytes(fifo)
    with pytest.raises(ScenarioError, match="is a character device"):
        safeio.read_bytes("/dev/zero")


def test_file_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safeio, "MAX_INPUT_BYTES", 100)
    p = tmp_path / "big.yaml"
    p.write_text("a: " + "x" * 98)
    with pytest.raises(ScenarioError, match="101 bytes is over the 100-byte input limit"):
        safeio.read_bytes(p)
    p.write_text("a: " + "x" * 97)
    assert safeio.read_mapping(p) == {"a": "x" * 97}
    with pytest.raises(ScenarioError, match="over the 100-byte input limit"):
        safeio.decode(b"x" * 101, "upload.yaml")


def test_libyaml_is_used_where_pyyaml_has_it() -> None:
    if yaml.__with_libyaml__:
        assert issubclass(safeio.StrictLoader, yaml.CSafeLoader)
    assert issubclass(safeio.StrictLoader, yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


@pytest.mark.parametrize("text, problem", [
    ("a: 1\na: 2\n", "duplicate key 'a' at line 2 column 1"),
    ("a: {b: 1, b: 2}\n", "duplicate key 'b'"),
    ("a: " + "[" * 40 + "]" * 40, "nesting deeper than 32 levels at line 1"),
    ("- " * 40 + "1", "nesting deeper than 32 levels"),
    ("a: &x [*x]", "alias *x refers to its own anchor"),
    ("a: &x " + "[" * 20 + "]" * 20 + "\nb: " + "[" * 20 + "*x" + "]" * 20,
     "nesting deeper than 32 levels (through alias *x)"),
    ("a: " + "9" * 5000, "unreadable YAML value"),
    ("a: !!python/object/apply:os.system ['true']", "malformed YAML"),
    ("a: [1, 2\n", "malformed YAML at line 2"),
])
def test_yaml_hazards_are_one_line_errors(text: str, problem: str) -> None:
    with pytest.raises(ScenarioError) as err:
        safeio.parse_yaml(text, "x.yaml")
    assert problem in str(err.value) and str(err.value).startswith("x.yaml: ") and "\n" not in str(err.value)


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    rows = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    rows += [f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join(['*' + chr(96 + i)] * 10)}]" for i in range(1, 9)]
    with pytest.raises(ScenarioError, match="more than 4,000,000 values"):
        safeio.parse_yaml("\n".join(rows), "bomb.yaml")
    # A few aliases are fine, and merge keys still override.
    assert safeio.parse_yaml("a: &a {x: 1}\nb: *a\nc: {<<: *a, x: 2}", "ok.yaml") == {
        "a": {"x": 1}, "b": {"x": 1}, "c": {"x": 2}}


def test_collection_length_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safeio, "MAX_ITEMS", 3)
    assert safeio.parse_yaml("[1, 2, 3]", "x") == [1, 2, 3]
    with pytest.raises(ScenarioError, match="a list of more than 3 entries"):
        safeio.parse_yaml("[1, 2, 3, 4]", "x")
    with pytest.raises(ScenarioError, match="a mapping of more than 3 entries"):
        safeio.parse_yaml("{a: 1, b: 2, c: 3, d: 4}", "x")
    with pytest.raises(ScenarioError, match="a list of 4 entries is over the limit of 3"):
        safeio.parse_json("[1, 2, 3, 4]", "x.json")


@pytest.mark.parametrize("text, problem", [
    ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ("[" * 100_000 + "]" * 100_000, "nesting deeper than 32 levels"),
    ("[" * 40 + "]" * 40, "nesting deeper than 32 levels"),
    ('{"a": 1', "malformed JSON at line 1"),
    ("9" * 5000, "unreadable JSON value"),
])
def test_json_hazards_are_one_line_errors(text: str, problem: str) -> None:
    with pytest.raises(ScenarioError, match=problem.replace("(", r"\(")):
        safeio.parse_json(text, "x.json")


def test_check_shape_bounds_api_dicts(monkeypatch: pytest.MonkeyPatch) -> None:
    deep: dict = {}
    node = deep
    for _ in range(40):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(ScenarioError, match="nesting deeper than 32 levels"):
        safeio.check_shape(deep)
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ScenarioError, match="nesting deeper"):
        safeio.check_shape(loop)
    shared = list(range(1000))
    safeio.check_shape({"a": [shared] * 1000})  # 1,001,002 values: under the cap
    with pytest.raises(ScenarioError, match="more than 4,000,000 values"):
        safeio.check_shape({"a": [shared] * 4000})  # shared lists count each time they appear


# ------------------------------------------------------------------------------------------- messages
def test_one_line_strips_escapes_joins_lines_and_caps() -> None:
    assert safeio.one_line("\x1b[31mred\x1b[0m\nnext\tline\x07") == "red next line"
    assert safeio.strip_control("a\x1b]0;title\x07b\x9bc") == "abc"
    long = safeio.one_line("x" * 5000)
    assert long.startswith("x" * 2000) and long.endswith("... (3,000 more characters)")


def test_join_capped_counts_the_rest() -> None:
    parts = [f"p{i}" for i in range(100_000)]
    text = safeio.join_capped(parts)
    assert text.startswith("p0; p1;") and text.endswith("; ... and 99,990 more") and text.count(";") == 10
    assert safeio.join_capped(["a", "b"]) == "a; b"


def test_json_text_is_strict() -> None:
    assert json.loads(safeio.json_text({"a": [1.5, 2]})) == {"a": [1.5, 2]}
    with pytest.raises(InternalError, match=r"result field a\.1\.b is inf"):
        safeio.json_text({"a": [0, {"b": float("inf")}]})
    with pytest.raises(InternalError, match="is nan"):
        safeio.json_text([float("nan")])


# ------------------------------------------------------------------------------------------- writing
def test_write_text_replaces_atomically_and_keeps_the_mode(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "out.json"
    safeio.write_text(out, "one")
    assert out.read_text() == "one" and stat.S_IMODE(out.stat().st_mode) == 0o666 & ~safeio._UMASK
    out.chmod(0o640)
    safeio.write_text(out, "two")
    assert out.read_text() == "two" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.json"]  # no temporary file left


def test_an_input_is_never_an_output(tmp_path: Path) -> None:
    src = tmp_path / "comm.json"
    src.write_text("input")
    link = tmp_path / "link.json"
    link.symlink_to(src)
    for target in (src, tmp_path / "." / "comm.json", link):
        with pytest.raises(ScenarioError, match="is also an input of this command"):
            safeio.write_text(target, "output", inputs=[src], flag="--out")
    assert src.read_text() == "input"


def test_special_files_are_never_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ScenarioError, match="is a FIFO; refusing to replace it"):
        safeio.write_text(fifo, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(ScenarioError, match="is a character device"):
        safeio.check_output("/dev/null")
    with pytest.raises(ScenarioError, match="is a directory"):
        safeio.write_text(tmp_path, "x")
    with pytest.raises(ScenarioError, match="cannot write here"):
        safeio.write_text("/proc/simddp-test/out.json", "x")
    to_null = tmp_path / "null.json"
    to_null.symlink_to("/dev/null")
    with pytest.raises(ScenarioError, match="character device"):
        safeio.write_text(to_null, "x")


def test_a_planted_temp_symlink_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in ("out.json.tmp", ".out.json.tmp"):
        (tmp_path / name).symlink_to(victim)
    safeio.write_text(tmp_path / "out.json", "result")
    assert victim.read_text() == "precious"
    assert (tmp_path / "out.json").read_text() == "result" and not (tmp_path / "out.json").is_symlink()


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.json"
    out.write_text("old")

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(ScenarioError, match=r"^--out .*out\.json: cannot write \(No space left on device\)$"):
        safeio.write_text(out, "new", flag="--out")  # the flag and the file named (a probe got Errno 28 alone)
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_outputs_written_together_replace_none_when_one_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe filled the disk under `sweep --csv good.csv --html x.html`: the command failed on the HTML after
    it had replaced good.csv. Within writes_together, every output is put in place only once all are written."""
    csv, html = tmp_path / "good.csv", tmp_path / "x.html"
    csv.write_text("old csv")
    html.write_text("old html")
    real_fsync, calls = os.fsync, []

    def full_on_second(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_on_second)
    with pytest.raises(ScenarioError, match=r"--html .*x\.html: cannot write"), safeio.writes_together():
        safeio.write_text(csv, "new csv", flag="--csv")
        safeio.write_text(html, "new html", flag="--html")
    assert (csv.read_text(), html.read_text()) == ("old csv", "old html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.csv", "x.html"]  # no temporary file left
    monkeypatch.setattr(os, "fsync", real_fsync)
    with safeio.writes_together():
        safeio.write_text(csv, "new csv")
        assert csv.read_text() == "old csv"  # written beside it, put in place when the block ends
        safeio.write_text(html, "new html")
    assert (csv.read_text(), html.read_text()) == ("new csv", "new html")
    with pytest.raises(KeyError), safeio.writes_together():  # an error of the command itself: nothing replaced
        safeio.write_text(csv, "third")
        raise KeyError("later")
    assert csv.read_text() == "new csv" and sorted(p.name for p in tmp_path.iterdir()) == ["good.csv", "x.html"]


def test_a_symlinked_output_is_written_through(tmp_path: Path) -> None:
    """A probe's `--csv link.csv` (link.csv -> real.csv) replaced the link with a file and left real.csv as it
    was; as root, `--csv /dev/stdout` with standard output sent to a file replaced the system's /dev/stdout."""
    real = tmp_path / "real.csv"
    real.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to("real.csv")
    (tmp_path / "sub").mkdir()
    relative = tmp_path / "sub" / "rel.csv"
    relative.symlink_to("../link.csv")  # a chain of two, the first relative to its own directory
    assert safeio.write_text(link, "new") == real
    assert link.is_symlink() and real.read_text() == "new"
    assert safeio.write_text(relative, "newer") == real and relative.is_symlink() and real.read_text() == "newer"
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to("made/out.csv")
    assert safeio.write_text(dangling, "made") == tmp_path / "made" / "out.csv" and dangling.read_text() == "made"
    for through_proc in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"):
        if os.path.exists(through_proc) and os.path.islink(through_proc):
            with pytest.raises(ScenarioError, match="leads to a process's open file"):
                safeio.check_output(through_proc)
    mine = tmp_path / "out"
    mine.symlink_to("/proc/self/fd/1")
    with pytest.raises(ScenarioError, match=r"out: leads to a process's open file \(/proc/self/fd/1\)"):
        safeio.write_text(mine, "x")
    assert mine.is_symlink()
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    with pytest.raises(ScenarioError, match="cannot write here"):
        safeio.write_text(tmp_path / "loop1", "x")


def test_partial_path() -> None:
    assert safeio.partial_path("runs/comm.json") == Path("runs/comm.partial.json")
    assert safeio.partial_path("out") == Path("out.partial")


def test_an_over_long_integer_is_said_in_the_users_terms() -> None:
    """Python's own message told the reader to call sys.set_int_max_str_digits() (found by a probe)."""
    from simddp import safeio

    with pytest.raises(ScenarioError, match="--set x: unreadable YAML value: an integer of more than 4,300 digits"):
        safeio.parse_yaml("9" * 5000, "--set x")
