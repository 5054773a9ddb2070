"""The engine's keyed caches: bounded, least recently used out first, emptied by clear(), safe across threads."""

from __future__ import annotations

import threading

import simddp
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


def test_the_collector_pause_restores_the_collector_as_it_was_after_nested_and_failing_uses() -> None:
    import gc

    import pytest

    from simddp.engine_caches import collector_paused

    was = gc.isenabled()
    try:
        gc.enable()
        with collector_paused():
            assert not gc.isenabled()
            with collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the outer use still runs
        assert gc.isenabled()
        with pytest.raises(ZeroDivisionError), collector_paused():
            1 / 0  # noqa: B018
        assert gc.isenabled()
        gc.disable()  # a caller that turned it off keeps it off
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()


def test_the_collector_resumes_when_the_last_of_concurrent_evaluations_ends() -> None:
    import gc
    from pathlib import Path

    import simddp

    default = Path(simddp.__file__).parent / "default_scenario.yaml"
    was = gc.isenabled()
    gc.enable()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                simddp.simulate(default, trace=False)
        except BaseException as err:  # reported below
            errors.append(err)

    try:
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert gc.isenabled()
    finally:
        if not was:
            gc.disable()


def test_what_an_evaluation_leaves_alive_skips_the_young_collections_and_cycles_are_still_freed() -> None:
    import gc
    import weakref

    from simddp.engine_caches import collector_paused

    class Node:
        pass

    was = gc.isenabled()
    try:
        gc.enable()
        gc.collect()
        with collector_paused():
            kept = [[i] for i in range(2000)]  # survivors, as a result's records
            cycle = Node()
            cycle.self = cycle  # type: ignore[attr-defined]
            probe = weakref.ref(cycle)
            del cycle
        assert gc.get_count()[0] < 100  # no young collection due: they are in the oldest generation
        assert all(gc.is_tracked(x) for x in kept[:10])
        young = {id(o) for o in gc.get_objects(generation=0)} | {id(o) for o in gc.get_objects(generation=1)}
        assert id(kept[0]) not in young
        assert probe() is not None  # a cycle waits for a full collection, which still finds it
        gc.collect()
        assert probe() is None
        # A process that froze objects of its own keeps them frozen (an unfreeze would release them).
        gc.freeze()
        frozen = gc.get_freeze_count()
        with collector_paused():
            more = [[i] for i in range(1000)]
        assert gc.get_freeze_count() == frozen
        assert id(more[0]) not in {id(o) for o in gc.get_objects(generation=2)}  # young, as without the pause
    finally:
        gc.unfreeze()
        if not was:
            gc.disable()


def test_memo_put_keeps_the_latest_entries_of_each_kind() -> None:
    from simddp.sim.plan import MEMO_KIND_LIMIT, memo_put

    memo: dict = {}
    for k in range(3 * MEMO_KIND_LIMIT):
        memo_put(memo, ("bucket plans", k), [k])
        memo_put(memo, ("param sync", k), None)
    for kind in ("bucket plans", "param sync"):
        kept = sorted(key[1] for key in memo if key[0] == kind)
        assert kept == list(range(2 * MEMO_KIND_LIMIT, 3 * MEMO_KIND_LIMIT))
    memo_put(memo, ("bucket plans", 999), [1])
    memo_put(memo, ("bucket plans", 999), [2])  # put again: still one entry, the latest value
    assert memo[("bucket plans", 999)] == [2]


def test_a_sweep_over_many_cluster_sizes_gives_the_same_steps_after_its_memo_drops_entries() -> None:
    """Bucket plans depend on the data-parallel group: a sweep over cluster sizes once kept every size's in
    the workload's memo (34 KB a point). Now only the latest few are kept; the dropped ones, asked again,
    are computed again to the same numbers."""
    from simddp.sim.plan import MEMO_KIND_LIMIT

    base = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "gpt2"},
            "training": {"global_batch_size": None, "micro_batch_size": 2, "seq_len": 1024}}
    sizes = list(range(1, 2 * MEMO_KIND_LIMIT + 3))

    def steps() -> list[float]:
        return [simddp.simulate({**base, "cluster": {**base["cluster"], "num_nodes": n}}, trace=False).step_time_s
                for n in sizes]

    first = steps()
    assert steps() == first  # the early sizes' plans were dropped and built again
    engine_caches.clear()
    assert steps() == first
