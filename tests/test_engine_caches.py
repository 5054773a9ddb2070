"""The engine's keyed caches: bounded, least recently used out first, emptied by clear(), safe across threads."""

from __future__ import annotations

import threading

from simddp import engine_caches
from simddp.engine_caches import KeyedCache


def test_a_keyed_cache_computes_once_per_key_and_keeps_the_most_recent() -> None:
    cache = KeyedCache(maxsize=2)
    calls: list[str] = []

    def value(key: str) -> str:
        calls.append(key)
        return key.upper()

    assert cache.get("a", lambda: value("a")) == "A"
    assert cache.get("b", lambda: value("b")) == "B"
    assert cache.get("a", lambda: value("a")) == "A"  # kept; now the most recent
    assert cache.get("c", lambda: value("c")) == "C"  # evicts b, the least recent
    assert cache.get("a", lambda: value("a")) == "A"
    assert cache.get("b", lambda: value("b")) == "B"
    assert calls == ["a", "b", "c", "b"]
    engine_caches.clear()
    assert cache.get("a", lambda: value("a")) == "A"
    assert calls[-1] == "a"


def test_a_keyed_cache_stays_consistent_across_threads() -> None:
    cache = KeyedCache(maxsize=8)
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(2000):
                key = (i + offset) % 13
                assert cache.get(key, lambda key=key: key * 2) == key * 2
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(cache.data) <= 8
