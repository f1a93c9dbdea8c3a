"""The fused dispatch (issue 26, docs/semantics.md#fused): with the broker on kombu's Redis
transport through dedup_jobs' channel, on the store's own Redis server, a unique dispatch is
one round trip: one EVALSHA takes the lock and pushes the message. Real Redis, a real worker
(in-process) of an app of the test's own (tests/fused_app.py); its broker on the test Redis,
in another database than the store's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from dedup_jobs.jobs import fused
from dedup_jobs.stores import get_store
from tests.fused_app import BROKER_DB, FusedApp, keep_default_app, prefixed
from tests.guard_support import token
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


@pytest.fixture(autouse=True)
def _default_app() -> Iterator[None]:
    with keep_default_app():
        yield



def _queued(fapp: FusedApp, priority: int = 0) -> int:
    key = fapp.queue if not priority else f"{fapp.queue}\x06\x16{priority}"
    return int(fapp.counter.llen(key))


def _commands_about(words: list[str], dispatch: Any) -> list[str]:
    """The commands (not those a script runs) that mention any of ``words``, as MONITOR saw
    them while ``dispatch()`` ran; other clients of the server may talk meanwhile."""
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    monitor = redis.Redis.from_url(settings.REDIS_URL)

    def watch() -> None:
        with monitor.monitor() as m:
            ready.set()
            for command in m.listen():
                seen.append(command)
                if "STOP-WATCHING" in command["command"]:
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(5)
    # the MONITOR is on once it reports a marker of ours (polled, not slept on)
    wait_for(lambda: monitor.get("START-WATCHING") is None
             and any("START-WATCHING" in c["command"] for c in list(seen)), timeout=10)
    dispatch()
    monitor.get("STOP-WATCHING")
    thread.join(5)
    return [c["command"].split(" ")[0] for c in seen
            if c.get("client_type") != "lua" and any(w in c["command"] for w in words)]


def test_a_fused_dispatch_is_one_command_and_a_duplicate_pushes_nothing(fapp: FusedApp) -> None:
    fapp.quiet.delay(token(), 0)  # the script loaded, the channel's server known
    tokens = [token() for _ in range(5)]

    def dispatch() -> None:
        for t in tokens:
            fapp.quiet.delay(t, 1)
            fapp.quiet.delay(t, 2)  # a duplicate

    commands = _commands_about([fapp.queue, *tokens], dispatch)
    assert commands == ["EVALSHA"] * 10
    assert _queued(fapp) == 6  # the warm-up's message and one per token


def test_the_two_round_trip_path_for_contrast(fapp: FusedApp, monkeypatch: Any) -> None:
    # the same dispatches with the fused path refused: a lock call and a push each
    monkeypatch.setattr(fused, "why_not_fused", lambda *a: "switched off")
    fapp.quiet.delay(token(), 0)
    tokens = [token() for _ in range(3)]
    commands = _commands_about([fapp.queue, *tokens],
                               lambda: [fapp.quiet.delay(t, 1) for t in tokens])
    assert sorted(commands) == ["EVALSHA"] * 3 + ["LPUSH"] * 3


def test_a_duplicate_returns_the_holder_and_the_worker_runs_the_message_once(
    fapp: FusedApp,
) -> None:
    t = token()
    first = fapp.unique.delay(t, 1)
    again = fapp.unique.delay(t, 2)
    assert (first.deduplicated, again.deduplicated, again.id) == (False, True, first.id)
    key = fapp.unique.job_key((t, 0), {})
    store = get_store(fapp.unique.store_alias())
    lock = store.get(key)
    assert lock is not None and lock.owner == first.id and lock.state == "queued"
    assert _queued(fapp) == 1
    with thread_worker(fapp.app):
        assert first.get(timeout=10) == 1
        wait_for(lambda: store.get(key) is None, timeout=10)
        assert fapp.unique.delay(t, 3).get(timeout=10) == 3  # the key is free again
    assert fapp.runs(t) == 2


def test_the_message_keeps_its_priority(fapp: FusedApp) -> None:
    t = token()
    result = fapp.unique.apply_async((t, 7), priority=6)
    assert (_queued(fapp), _queued(fapp, 6)) == (0, 1)
    with thread_worker(fapp.app):
        assert result.get(timeout=10) == 7


def test_the_store_keeps_its_own_database(fapp: FusedApp) -> None:
    # the script switches to the broker's database to push, and back
    store = get_store(fapp.unique.store_alias())
    assert store.fused_database() != BROKER_DB
    tokens = [token() for _ in range(3)]
    results = [fapp.unique.delay(t, n) for n, t in enumerate(tokens)]
    assert _queued(fapp) == 3
    for t, r in zip(tokens, results, strict=True):
        lock = store.get(fapp.unique.job_key((t, 0), {}))
        assert lock is not None and lock.owner == r.id


def test_a_message_that_cannot_be_fused_goes_the_two_round_trip_way(
    fapp: FusedApp, caplog: Any
) -> None:
    # kombu's global key prefix: the queue's key is the transport's business; not fused
    caplog.set_level(logging.INFO, logger="dedup_jobs")
    with prefixed(fapp) as other:
        t = token()
        first = other.unique.delay(t, 1)
        again = other.unique.delay(t, 2)
        assert "global_keyprefix" in caplog.text
        assert (first.deduplicated, again.deduplicated) == (False, True)
        assert fapp.counter.llen(f"pfx:{other.queue}") == 1
        with thread_worker(other.app):
            assert first.get(timeout=10) == 1


def test_a_job_of_mostly_duplicates_takes_two_round_trips_until_it_stops(
    fapp: FusedApp, monkeypatch: Any
) -> None:
    """A fused duplicate has Celery build the message it throws away; on the other path a
    duplicate builds none. Once most recent dispatches of a job are duplicates, its dispatches
    take two round trips; once they are mostly first dispatches again, one."""
    store = get_store(fapp.quiet.store_alias())
    calls: list[str] = []
    for name in ("acquire", "acquire_fused"):
        real = getattr(store, name)
        monkeypatch.setattr(store, name, lambda *a, _n=name, _r=real, **k: (
            calls.append(_n), _r(*a, **k))[1])
    t = token()
    fapp.quiet.delay(t, 0)
    for _ in range(20):
        assert fapp.quiet.delay(t, 1).deduplicated
    assert calls[0] == "acquire_fused" and calls[-1] == "acquire", calls
    assert "duplicates" in fused.why_not_fused(fapp.quiet, store, {})
    calls.clear()
    for _ in range(80):
        assert not fapp.quiet.delay(token(), 1).deduplicated
    assert calls[0] == "acquire" and calls[-1] == "acquire_fused", calls
    assert _queued(fapp) == 81
