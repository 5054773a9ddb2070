"""Caches of pure cost functions the engine calls many times with the same arguments (a bucket size repeats
hundreds of times per step; a sweep asks the same collectives again). Every cached function is a pure
function of hashable, frozen arguments, so a cached answer is the answer; :func:`clear` empties them all
(benchmarks clear them before each timing, so speed comes from the engine, not from repeated requests).
"""

from __future__ import annotations

import functools
import gc
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from operator import attrgetter
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_REGISTRY: list[Any] = []


def cached(maxsize: int = 65536) -> Callable[[F], F]:
    """``functools.lru_cache`` that :func:`clear` can empty."""

    def wrap(fn: F) -> F:
        wrapped = functools.lru_cache(maxsize=maxsize)(fn)
        _REGISTRY.append(wrapped)
        return wrapped  # type: ignore[return-value]

    return wrap


class KeyedCache:
    """A bounded map from a key to a value computed once (least recently used out first), for functions whose
    arguments are not all hashable but whose answer depends on a hashable part of them: the caller says
    which. :func:`clear` empties it."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.data: OrderedDict[Hashable, Any] = OrderedDict()
        self.lock = threading.Lock()  # the dashboard serves sessions from several threads
        _REGISTRY.append(self)

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value of ``key``, computed (outside the lock) if it is not kept."""
        with self.lock:
            if key in self.data:
                self.data.move_to_end(key)
                return self.data[key]  # type: ignore[no-any-return]
        value = compute()
        with self.lock:
            self.data[key] = value
            if len(self.data) > self.maxsize:
                self.data.popitem(last=False)
        return value

    def cache_clear(self) -> None:
        with self.lock:
            self.data.clear()


def clear() -> None:
    """Empty every engine cache."""
    for fn in _REGISTRY:
        fn.cache_clear()


_PAUSE_LOCK = threading.Lock()
_pauses = 0  # evaluations running with the cyclic collector paused (the dashboard runs several in threads)
_resume = False  # whether the collector was on when the first of them began


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body with Python's cyclic garbage collector paused, then restore it as it was.

    An evaluation builds tens of thousands of lists, tuples and records (one 1T pipeline: ~25 young
    collections and a few full ones) that all stay alive until it returns and form no reference cycles, so
    every collection the allocations trigger walks them, and in a full one the whole heap (a Streamlit
    process's included), and frees nothing: measured with ``gc.callbacks``, they collected 0 objects, and
    cost 12% of the default's instructions and 17% of the 1T pipeline's (``benchmarks/bench_instructions.py``
    with and without). Reference counting still frees everything at once, as before; only cycle detection
    waits until the evaluation ends. The simpy reference simulation (generators and events refer to each
    other) is not run inside it.

    What the evaluation leaves alive (its result, the workload and plan it keeps, 3,800-6,200 objects) would
    then be walked by the young collection due at the first allocation after it, and again by a middle one,
    before reaching the oldest generation, without freeing any of them (0.33 ms of the default's 5.5 ms,
    0.7 ms of the 1T pipeline's 21 ms, measured with and without the collector). ``gc.freeze()`` then
    ``gc.unfreeze()`` moves every young object straight into the oldest generation (two list splices, and
    the young count back to 0): full collections still walk them and find any cycle among them, as before.
    It is skipped where the process has frozen objects of its own (``gc.get_freeze_count()``), which an
    unfreeze would release.
    Nested and concurrent uses count: the collector resumes when the last one ends, and only if it was on.
    """
    global _pauses, _resume
    with _PAUSE_LOCK:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _PAUSE_LOCK:
            _pauses -= 1
            if _pauses == 0 and _resume:
                if not gc.get_freeze_count():  # never undo a freeze of the process's own
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()


def kept_fields_hash(self: Any) -> int:
    """A frozen dataclass's ``__hash__`` (its fields' hash, as the generated one) kept after the first call,
    for objects that key the engine's caches many times per evaluation: a :class:`simddp.zero.ZeroRule` (25
    fields, hashed 128 times by a 1T pipeline's 64 ranks). (A :class:`simddp.topology.CommGroup` hashes its
    shape alone, not its pydantic link tiers.)
    Assign it in the class body (``__hash__ = kept_fields_hash``; dataclass replaces an inherited one), with
    :func:`state_without_hash` as ``__getstate__``: a string's hash differs between processes, so the kept
    hash is never pickled."""
    got: int | None = self.__dict__.get("_hash")
    if got is None:
        values = _FIELD_VALUES.get(type(self))
        if values is None:  # the fields' values as one tuple, in C (fields() per call cost more than the hash)
            values = _FIELD_VALUES[type(self)] = attrgetter(*(f.name for f in fields(self)))
        got = hash(values(self))
        object.__setattr__(self, "_hash", got)
    return got


_FIELD_VALUES: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def state_without_hash(self: Any) -> dict[str, Any]:
    """``__getstate__`` of a class whose hash is :func:`kept_fields_hash`: its fields, not the kept hash."""
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def without_init(cls: type[T], values: dict[str, Any]) -> T:
    """An instance of dataclass ``cls`` holding ``values`` (one per field), made without its ``__init__``: what
    the constructor would make where no field has a check. A frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``; this sets them as one dict, which becomes the instance's ``__dict__``
    (a collective's cost: 3.1 -> 0.85 us; a group: 1.8 -> 0.9 us; a 1T pipeline's 61 twin ranks)."""
    made = object.__new__(cls)
    object.__setattr__(made, "__dict__", values)
    return made


__all__ = ["KeyedCache", "cached", "clear", "collector_paused", "kept_fields_hash", "state_without_hash",
           "without_init"]
