"""Caches of pure cost functions the engine calls many times with the same arguments (a bucket size repeats
hundreds of times per step; a sweep asks the same collectives again). Every cached function is a pure
function of hashable, frozen arguments, so a cached answer is the answer; :func:`clear` empties them all
(benchmarks clear them before each timing, so speed comes from the engine, not from repeated requests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY: list[Any] = []


def cached(maxsize: int = 65536) -> Callable[[F], F]:
    """``functools.lru_cache`` that :func:`clear` can empty."""

    def wrap(fn: F) -> F:
        wrapped = functools.lru_cache(maxsize=maxsize)(fn)
        _REGISTRY.append(wrapped)
        return wrapped  # type: ignore[return-value]

    return wrap


def clear() -> None:
    """Empty every engine cache."""
    for fn in _REGISTRY:
        fn.cache_clear()


__all__ = ["cached", "clear"]
