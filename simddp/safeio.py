"""Safe input and output: reading whose cost is bounded on any input, writing that destroys nothing.

Reading (scenarios, calibration files, dashboard uploads, ``--set`` values):

* only regular files are read, opened without blocking (a FIFO or a device is refused, never waited
  on), and at most :data:`MAX_INPUT_BYTES` of them;
* YAML goes through libyaml's C parser where PyYAML has it (the pure-Python one is about 50x slower).
  A first pass over the parser's events refuses, before any object is built, nesting deeper than
  :data:`MAX_DEPTH`, a list or mapping of more than :data:`MAX_ITEMS` entries, more than
  :data:`MAX_NODES` values once aliases are expanded (the "billion laughs"), and an alias inside its
  own anchor (a recursive structure);
* a duplicate mapping key is an error, in YAML and in JSON, not "the last one wins";
* a dict handed to the API gets the same depth and size checks (:func:`check_shape`).

Writing (profiles, traces, HTML reports, collector files), through :func:`write_text`:

* an output that is one of the command's inputs is refused, and so is an existing non-regular file (a
  directory, a FIFO, a device such as /dev/null);
* the data go to a temporary file created exclusively, with an unpredictable name, in the target's
  directory (:func:`tempfile.mkstemp` opens with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so a planted
  symlink is never followed), are flushed to disk, and the file is renamed over the target: a reader
  sees the old file or the new one, never half of one.

Messages: :func:`one_line` strips terminal control sequences, joins lines and caps the length;
:func:`join_capped` keeps the first :data:`MAX_ERRORS_SHOWN` of many errors ("... and 99,990 more").
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from simddp.errors import InternalError, ScenarioError
from simddp.units import MiB

#: Largest input file read, bytes (scenarios, calibration files, uploads).
MAX_INPUT_BYTES = 20 * MiB
#: Deepest nesting of lists and mappings in an input (a scenario needs 5 levels, a profile 6).
MAX_DEPTH = 32
#: What libyaml says when its own nesting limit trips (see :func:`parse_yaml`).
_LIBYAML_DEPTH = "exceeded maximum nesting depth"
#: Most entries of one list or mapping in an input.
MAX_ITEMS = 1_000_000
#: Most values in one input, aliases expanded.
MAX_NODES = 4_000_000
#: Most errors listed in one message; the rest are counted.
MAX_ERRORS_SHOWN = 10
#: Longest message printed, characters.
MAX_MESSAGE_CHARS = 2_000

_UMASK = os.umask(0o022)
os.umask(_UMASK)


# ------------------------------------------------------------------------------------------ messages
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_control(text: str) -> str:
    """``text`` without terminal escape sequences and control characters (tabs and newlines kept)."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def shown_path(path: object) -> str:
    """A file name as a message shows it: control characters (an escape sequence, a newline) written as ``\\xNN``,
    so the name reads as it is and the terminal does not act on it."""
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", str(path))


def one_line(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A message safe to print as one terminal line: no control characters, no newlines, capped length."""
    flat = " ".join(strip_control(str(text)).split())
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit]}... ({len(flat) - limit:,} more characters)"


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a 10 MB string in an error message helps nobody)."""
    text = repr(value) if not isinstance(value, str) or len(value) <= 4 * limit else repr(value[: 4 * limit])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def join_capped(parts: Sequence[str], sep: str = "; ", limit: int = MAX_ERRORS_SHOWN) -> str:
    """The first ``limit`` parts joined, and a count of the rest."""
    shown = sep.join(parts[:limit])
    return shown if len(parts) <= limit else f"{shown}{sep}... and {len(parts) - limit:,} more"


def first_non_finite(data: Any, path: str = "") -> tuple[str, float] | None:
    """The dotted path and value of the first NaN or infinity in nested dicts and lists, if any."""
    stack: list[tuple[str, Any]] = [(path, data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "value", value
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}.{i}" if where else str(i), v) for i, v in reversed(list(enumerate(value))))
    return None


def json_text(data: Any, indent: int | None = None) -> str:
    """Strict JSON (RFC 8259): a NaN or infinity is an :class:`InternalError`, never ``NaN`` in the output."""
    bad = first_non_finite(data)
    if bad is not None:
        raise InternalError(f"result field {bad[0]} is {bad[1]}, not a finite number")
    return json.dumps(data, indent=indent, allow_nan=False)


# ------------------------------------------------------------------------------------------- reading
def _value_problem(err: Exception) -> str:
    """What is wrong with a value the parser could not convert, in the user's terms (Python's own message for
    an over-long integer tells the reader to call sys.set_int_max_str_digits())."""
    text = str(err)
    if "integer string conversion" in text:
        return "an integer of more than 4,300 digits (far beyond any size or count simddp takes)"
    return one_line(text, 200)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str | Path, what: str = "a YAML or JSON file") -> bytes:
    """At most :data:`MAX_INPUT_BYTES` of a regular file; every problem is a one-line :class:`ScenarioError`."""
    p = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such file") from None
    except PermissionError:
        raise ScenarioError(f"{p}: permission denied") from None
    except OSError as err:
        raise ScenarioError(f"{p}: cannot open ({err.strerror})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ScenarioError(f"{p}: is a directory, expected {what}")
        if not stat.S_ISREG(st.st_mode):
            raise ScenarioError(f"{p}: is {_kind(st.st_mode)}, expected {what}")
        if st.st_size > MAX_INPUT_BYTES:
            raise ScenarioError(f"{p}: {st.st_size:,} bytes is over the {MAX_INPUT_BYTES:,}-byte input limit")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise ScenarioError(f"{p}: over the {MAX_INPUT_BYTES:,}-byte input limit")
    return data


def decode(data: bytes, source: str, what: str = "UTF-8 YAML or JSON") -> str:
    """UTF-8 text of an input, capped at :data:`MAX_INPUT_BYTES`."""
    if len(data) > MAX_INPUT_BYTES:
        raise ScenarioError(f"{source}: {len(data):,} bytes is over the {MAX_INPUT_BYTES:,}-byte input limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{source}: not a text file (expected {what})") from None


class MalformedInput(ScenarioError):
    """The text is not well-formed YAML or JSON (as opposed to well-formed but over a cap)."""


_SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, mark: Any) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.problem, self.problem_mark = f"duplicate key {short_repr(key)}", mark


class StrictLoader(_SafeLoader):  # type: ignore[misc,valid-type]
    """PyYAML's safe loader (libyaml's C parser where available) that refuses duplicate mapping keys."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<' merges are meant to be overridden
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable: the base class reports it
            if duplicate:
                raise _DuplicateKey(key, key_node.start_mark)
        return super().construct_mapping(node, deep)


# Numbers as YAML 1.2's core schema reads them, not YAML 1.1 (PyYAML's): "0100" is 100, not octal 64, "1:30" is
# text, not the base-60 number 90 (a hostile-input probe's `--vary training.seq_len=1:10` ran one point at seq_len
# 70), and "1e3" is 1000.0, not text; PyYAML's "_" separators and 0b binaries are kept. StrictDumper writes with the
# same rules, so a string such as "08" is quoted and reads back as the string it was.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_NUMBER_RESOLVERS = [
    (_INT, re.compile(r"^(?:[-+]?[0-9][0-9_]*|0b[01][01_]*|0o[0-7][0-7_]*|0x[0-9a-fA-F][0-9a-fA-F_]*)$"),
     list("-+0123456789")),
    (_FLOAT, re.compile(r"""^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?
                         |[-+]?\.(?:inf|Inf|INF)
                         |\.(?:nan|NaN|NAN))$""", re.X), list("-+0123456789.")),
]
_IMPLICIT = {first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
             for first, resolvers in _SafeLoader.yaml_implicit_resolvers.items()}  # type: ignore[attr-defined]
StrictLoader.yaml_implicit_resolvers = _IMPLICIT
for _tag, _rx, _first in _NUMBER_RESOLVERS:
    StrictLoader.add_implicit_resolver(_tag, _rx, _first)


def _construct_int(loader: Any, node: Any) -> int:
    """An integer in base 10 (leading zeros allowed), or with a 0b, 0o or 0x prefix."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    digits = text.lstrip("+-")
    return int(text, 0) if digits[:2].lower() in ("0b", "0o", "0x") else int(text, 10)


StrictLoader.add_constructor(_INT, _construct_int)


class StrictDumper(yaml.SafeDumper):
    """PyYAML's safe dumper deciding what needs quotes by :class:`StrictLoader`'s number rules."""


StrictDumper.yaml_implicit_resolvers = StrictLoader.yaml_implicit_resolvers  # the loader's, numbers included


def dump_yaml(data: Any, **options: Any) -> str:
    """``data`` as YAML text that :func:`parse_yaml` reads back to the same values."""
    return str(yaml.dump(data, Dumper=StrictDumper, **options))


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""


def _scan_events(text: str, source: str) -> None:
    """Refuse deep nesting, long collections, alias bombs and recursive aliases from the event stream.

    Events come one at a time from the parser, so this pass needs no recursion and builds no objects.
    Each open collection keeps [is mapping, entries, values below it (aliases expanded), height].
    """
    anchors: dict[str, tuple[int, int]] = {}
    open_anchors: set[str] = set()
    stack: list[list[Any]] = []

    def fail(problem: str, mark: Any) -> None:
        raise ScenarioError(f"{source}: {problem}{_where(mark)}")

    def add(size: int, height: int, mark: Any) -> None:
        if not stack:
            return
        top = stack[-1]
        top[1] += 1
        if top[1] > MAX_ITEMS * (2 if top[0] else 1):
            fail(f"a {'mapping' if top[0] else 'list'} of more than {MAX_ITEMS:,} entries", mark)
        top[2] += size
        top[3] = max(top[3], height + 1)
        if top[2] > MAX_NODES:
            fail(f"more than {MAX_NODES:,} values (aliases expanded)", mark)

    for event in yaml.parse(text, Loader=StrictLoader):
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            if len(stack) >= MAX_DEPTH:
                fail(f"nesting deeper than {MAX_DEPTH} levels", event.start_mark)
            if event.anchor:
                open_anchors.add(event.anchor)
            stack.append([isinstance(event, yaml.MappingStartEvent), 0, 1, 1, event.anchor])
        elif isinstance(event, yaml.CollectionEndEvent):
            _, _, size, height, anchor = stack.pop()
            if anchor:
                anchors[anchor] = (size, height)
                open_anchors.discard(anchor)
            add(size, height, event.start_mark)
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                fail(f"alias *{event.anchor} refers to its own anchor (a recursive structure)", event.start_mark)
            size, height = anchors.get(event.anchor, (1, 0))  # an unknown alias: the loader reports it
            if len(stack) + height > MAX_DEPTH:
                fail(f"nesting deeper than {MAX_DEPTH} levels (through alias *{event.anchor})", event.start_mark)
            add(size, height, event.start_mark)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor:
                anchors[event.anchor] = (1, 0)
            add(1, 0, event.start_mark)


def too_deep(source: str) -> ScenarioError:
    """The one refusal of nesting past :data:`MAX_DEPTH`, whichever check or parser finds it."""
    return ScenarioError(f"{source}: nesting deeper than {MAX_DEPTH} levels")


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as Python data, within the caps; one-line :class:`ScenarioError` otherwise."""
    try:
        _scan_events(text, source)
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except _DuplicateKey as e:
        raise ScenarioError(f"{source}: {e.problem}{_where(e.problem_mark)}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or (str(e).splitlines() or ["?"])[0]
        if problem == _LIBYAML_DEPTH:
            # libyaml's scanner looks ahead for a simple key's ':' across a whole flow collection, so its own
            # depth limit (1,000 since PyYAML 6.0.4's wheels) can trip before the scan above reaches 32 levels:
            # the same input, the same answer, whichever libyaml parses it.
            raise too_deep(source) from None
        raise MalformedInput(f"{source}: malformed YAML{_where(mark)}: {problem}") from None
    except (ValueError, OverflowError) as e:  # e.g. an integer of more than 4300 digits
        if isinstance(e, ScenarioError):
            raise
        raise ScenarioError(f"{source}: unreadable YAML value: {_value_problem(e)}") from None


class _DuplicateJSONKey(ValueError):
    pass


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateJSONKey(key)
            seen.add(key)
    return out


def parse_json(text: str, source: str) -> Any:
    """JSON text as Python data, within the caps; one-line :class:`ScenarioError` otherwise."""
    try:
        data = json.loads(text, object_pairs_hook=_pairs_without_duplicates)
    except json.JSONDecodeError as e:
        raise MalformedInput(f"{source}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except _DuplicateJSONKey as e:
        raise ScenarioError(f"{source}: duplicate key {short_repr(e.args[0])}") from None
    except RecursionError:
        raise too_deep(source) from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ScenarioError(f"{source}: unreadable JSON value: {_value_problem(e)}") from None
    check_shape(data, source)
    return data


def check_shape(data: Any, source: str = "scenario") -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH`, collections longer than :data:`MAX_ITEMS` and more than
    :data:`MAX_NODES` values (shared sub-structures counted each time they appear; a cycle is too deep)."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ScenarioError(f"{source}: more than {MAX_NODES:,} values")
        if isinstance(value, dict | list | tuple):
            if depth >= MAX_DEPTH:
                raise too_deep(source)
            if len(value) > MAX_ITEMS:
                raise ScenarioError(f"{source}: a {'mapping' if isinstance(value, dict) else 'list'} of "
                                    f"{len(value):,} entries is over the limit of {MAX_ITEMS:,}")
            children: Iterable[Any] = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def parse_mapping(text: str, source: str, fmt: str = "yaml") -> dict[str, Any]:
    """A mapping from YAML (``fmt="yaml"``, a superset of JSON) or JSON text."""
    data = parse_json(text, source) if fmt == "json" else parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def read_mapping(path: str | Path, what: str = "a YAML or JSON file") -> dict[str, Any]:
    """A YAML or JSON file (by its suffix) as a dict, within every cap above."""
    p = Path(path)
    text = decode(read_bytes(p, what), str(p))
    return parse_mapping(text, str(p), "json" if p.suffix.lower() == ".json" else "yaml")


# ------------------------------------------------------------------------------------------- writing
def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _output_target(path: str | Path, flag: str, empty: str) -> tuple[Path, os.stat_result | None]:
    """An output path, refused when empty (``--csv ''``; ``empty`` says what to give), and what is there now
    (None: nothing yet)."""
    if not str(path).strip():
        raise ScenarioError(f"{flag} {str(path)!r}: empty {empty}")
    p = Path(path)
    try:
        return p, os.stat(p)
    except FileNotFoundError:
        return p, None
    except OSError as err:
        raise ScenarioError(f"{p}: cannot write here ({err.strerror})") from None


def _link_target(link: Path) -> Path:
    """The file the symlink ``link`` leads to, its directory resolved (a ScenarioError for a link through
    ``/proc``, or one of more than 40 hops: the kernel's own limit)."""
    at = link
    for _ in range(40):
        where = Path(os.path.realpath(at.parent))
        if where.parts[1:2] == ("proc",):
            raise ScenarioError(f"{link}: leads to a process's open file ({at}), not a file; give a file name to "
                                "write")
        if not os.path.islink(where / at.name):
            return where / at.name
        try:
            hop = Path(os.readlink(where / at.name))
        except OSError as err:
            raise ScenarioError(f"{link}: cannot write here ({err.strerror})") from None
        at = hop if hop.is_absolute() else where / hop
    raise ScenarioError(f"{link}: cannot write here (too many levels of symbolic links)")


def check_output(path: str | Path, inputs: Iterable[str | Path] = (), flag: str = "output") -> Path:
    """Check, before any work, that ``path`` can be written safely; returns it as a :class:`Path`.

    Refused: one of ``inputs`` (the same file under any name), an existing directory, FIFO, device or
    socket (a symlink is judged by what it points to), and a directory where no file can be created (the
    check creates and removes a temporary file there). Missing parent directories are created.

    A symlink is written through: the path returned is the file it leads to, which the write replaces, and the
    link stays (replacing the link itself left its target as it was and turned the link into a file; as root,
    ``--csv /dev/stdout`` with standard output sent to a file replaced the system's ``/dev/stdout``). A link
    that leads into ``/proc`` (``/dev/stdout``, ``/dev/fd/N``: a process's open file) is refused.
    """
    p, target = _output_target(path, flag, "file name; give a file name to write")
    if os.path.islink(p):
        p = _link_target(p)
    if target is not None and stat.S_ISDIR(target.st_mode):
        raise ScenarioError(f"{p}: is a directory; give a file name to write")
    if p.name in ("", ".", ".."):
        raise ScenarioError(f"{flag} {str(path)!r}: give a file name to write")
    if target is not None:
        if not stat.S_ISREG(target.st_mode):
            raise ScenarioError(f"{p}: is {_kind(target.st_mode)}; refusing to replace it with a file")
        for source in inputs:
            with contextlib.suppress(OSError):
                if _same_file(target, os.stat(source)):
                    raise ScenarioError(f"{p}: is also an input of this command ({source}); write the {flag} "
                                        "to another file")
    for d in (p.parent, *p.parent.parents):
        if os.path.islink(d) and not d.exists():  # mkdir would say "File exists" (a probe's dangling --csv link)
            raise ScenarioError(f"{d}: is a symbolic link to {os.readlink(d)}, which does not exist; make that "
                                f"directory or give the {flag} another place")
    try:
        missing = [d for d in (p.parent, *p.parent.parents) if not d.exists()]
        p.parent.mkdir(parents=True, exist_ok=True)
        created = _CREATED_DIRS.get()
        if created is not None:  # inside a CLI command: what it undoes when the command fails
            created.extend(missing)
        fd, probe = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ScenarioError(f"{p}: cannot write here ({err.strerror or err})") from None
    return p


#: Directories :func:`check_output` created for outputs while :func:`undo_created_dirs_on_error` watches (per
#: thread and task, as a context variable; None outside it, so API calls keep no record).
_CREATED_DIRS: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("created_dirs", default=None)


@contextlib.contextmanager
def undo_created_dirs_on_error() -> Iterator[None]:
    """Within it, a command that raises removes the output directories :func:`check_output` created for it that
    are still empty, deepest first (a refused command leaves nothing behind; one that wrote keeps them)."""
    token = _CREATED_DIRS.set([])
    try:
        yield
    except BaseException:
        for d in sorted(_CREATED_DIRS.get() or [], key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):  # not empty (something was written), or already gone
                d.rmdir()
        raise
    finally:
        _CREATED_DIRS.reset(token)


def check_output_dir(path: str | Path, names: Sequence[str], inputs: Iterable[str | Path] = (),
                     flag: str = "output") -> list[Path]:
    """Check, before any work, that the files ``names`` can be written into the directory ``path``; returns
    their paths. A missing directory is created and an existing one written into; an existing file (or
    anything else that is not a directory) is refused, and each file is checked as :func:`check_output`
    checks it (none may be an input)."""
    p, target = _output_target(path, flag, "directory name; give a directory to write into")
    if target is not None and not stat.S_ISDIR(target.st_mode):
        raise ScenarioError(f"{flag} {p}: exists and is not a directory; give a directory to write "
                            f"{', '.join(names)} into")
    inputs = list(inputs)
    return [check_output(p / name, inputs, flag) for name in names]


def check_distinct(outputs: Iterable[tuple[str, str | Path]]) -> None:
    """Refuse two outputs of one command (``(flag, path)`` pairs) that are the same file under any name: the
    second write would replace the first."""
    seen: dict[object, str] = {}
    for flag, path in outputs:
        p = Path(path)
        try:
            st = os.stat(p)
            key: object = (st.st_dev, st.st_ino)
        except OSError:
            key = p.resolve()
        if key in seen:
            raise ScenarioError(f"{flag} {p}: the same file as {seen[key]}; give each output its own file")
        seen[key] = f"{flag} {p}"


#: The files :func:`write_bytes` has written but not yet put in place, (temporary file, target, flag), while
#: :func:`writes_together` holds them (per thread and task; None outside it: each write is put in place at once).
_STAGED: contextvars.ContextVar[list[tuple[str, Path, str]] | None] = contextvars.ContextVar("staged", default=None)


@contextlib.contextmanager
def writes_together() -> Iterator[None]:
    """Within it, :func:`write_bytes` writes each file next to its target and puts them all in place only when
    the block ends without an error: a command with two outputs (``--csv`` and ``--html``) that fails on the
    second (a full disk) replaces neither, where it replaced the first. Not for a collector's partial results,
    which must land as they come."""
    staged: list[tuple[str, Path, str]] = []
    token = _STAGED.set(staged)
    try:
        yield
    except BaseException:
        for tmp, _, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        _STAGED.reset(token)
    for k, (tmp, target, flag) in enumerate(staged):
        try:
            os.replace(tmp, target)
        except OSError as err:
            for left, _, _ in staged[k:]:
                with contextlib.suppress(OSError):
                    os.unlink(left)
            raise ScenarioError(f"{flag} {target}: cannot write ({err.strerror or err})") from None


def write_bytes(path: str | Path, data: bytes, inputs: Iterable[str | Path] = (), flag: str = "output") -> Path:
    """Write ``data`` to ``path`` atomically after :func:`check_output`; nothing else is ever touched. A write
    that fails (a full disk, a quota) leaves the old file as it was, no temporary file, and a
    :class:`ScenarioError` naming ``flag`` and the path; within :func:`writes_together`, the file is put in place
    when the block ends."""
    inputs = list(inputs)
    p = check_output(path, inputs, flag)
    try:
        mode = stat.S_IMODE(os.stat(p).st_mode)
    except OSError:
        mode = 0o666 & ~_UMASK
    staged = _STAGED.get()
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if staged is None:
            os.replace(tmp, p)
        else:
            staged.append((tmp, p, flag))
    except BaseException as err:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(err, OSError):
            raise ScenarioError(f"{flag} {p}: cannot write ({err.strerror or err})") from None
        raise
    return p


def titled_html(html: str, title: str) -> str:
    """A full HTML page (plotly's ``to_html``) with a ``<title>``, which HTML5 requires and plotly leaves out; the
    title escaped (a scenario's name is user text)."""
    import html as markup

    return html.replace("<head>", f"<head>\n    <title>{markup.escape(title)}</title>", 1)


def write_text(path: str | Path, text: str, inputs: Iterable[str | Path] = (), flag: str = "output") -> Path:
    """:func:`write_bytes` of UTF-8 text."""
    return write_bytes(path, text.encode("utf-8"), inputs, flag)


def partial_path(path: str | Path) -> Path:
    """Where a collector keeps results while it runs: ``comm.json`` -> ``comm.partial.json``."""
    p = Path(path)
    if p.name in ("", ".", ".."):
        return p / "partial"
    return p.with_name(f"{p.stem}.partial{p.suffix}" if p.suffix else f"{p.name}.partial")


__all__ = [
    "MAX_DEPTH",
    "MAX_ERRORS_SHOWN",
    "MAX_INPUT_BYTES",
    "MAX_ITEMS",
    "MAX_MESSAGE_CHARS",
    "MAX_NODES",
    "MalformedInput",
    "StrictLoader",
    "check_distinct",
    "check_output",
    "check_output_dir",
    "check_shape",
    "decode",
    "first_non_finite",
    "join_capped",
    "json_text",
    "one_line",
    "parse_json",
    "parse_mapping",
    "parse_yaml",
    "partial_path",
    "read_bytes",
    "read_mapping",
    "short_repr",
    "strip_control",
    "titled_html",
    "too_deep",
    "undo_created_dirs_on_error",
    "write_bytes",
    "write_text",
    "writes_together",
]
