"""The django-redis store's EVALSHA fast path (S1): scripts loaded on demand, a dropped
connection recovered, still one round trip per decision, and the connections the store keeps
between decisions never shared by two callers, never reused after a failure, never used by a
forked child, and handed back when the store is dropped."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from celery.utils import uuid
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores import get_store
from dedup_jobs.stores.redis import MAX_IDLE
from tests import jobs

pytestmark = pytest.mark.redis


def _store() -> Any:
    return get_store("redis")


def test_scripts_are_loaded_again_after_script_flush(redis_client: Any) -> None:
    """S1: after SCRIPT FLUSH (or a server restart) the next decision loads its script and
    answers; nothing is left unlocked or double-locked."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        key = jobs.unique_sleep.job_key((1,), {})
        first = uuid()
        assert store.acquire(key, first, 60, now=clock.now()).acquired
        redis_client.script_flush()
        second = store.acquire(key, uuid(), 60, now=clock.now())
        assert not second.acquired and second.holder == first
        redis_client.script_flush()
        assert store.release(key, first)
        assert store.get(key) is None


def _kill_lock_database_clients(client: Any) -> int:
    """CLIENT KILL every connection on the lock store's database (9) but ``client``'s own:
    the store's, not the Celery app's broker and result connections of this process (on
    databases 10 and 11), which the next test would find closed."""
    me = client.client_id()
    return sum(client.client_kill_filter(_id=int(info["id"]))
               for info in client.client_list()
               if info["db"] == "9" and int(info["id"]) != me)


def test_a_killed_connection_is_replaced(redis_client: Any) -> None:
    """S1: when the server drops the store's connections, the next decision reconnects and
    answers instead of failing or reusing a broken connection."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        key = jobs.unique_sleep.job_key((2,), {})
        owner = uuid()
        assert store.acquire(key, owner, 60, now=clock.now()).acquired
        assert _kill_lock_database_clients(redis_client) >= 1  # the store's kept connection
        again = store.acquire(key, uuid(), 60, now=clock.now())
        assert not again.acquired and again.holder == owner
        _kill_lock_database_clients(redis_client)
        assert store.release(key, owner)
        assert store.get(key) is None


def test_one_kept_connection_serves_sequential_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """S1: a hundred decisions one after another use the one connection the store keeps: no
    pool checkout (with its lock and its "unread data?" poll of the socket) per decision.
    Only a connection the server closed (S9: the store drops its kept ones and re-sends on a
    fresh one) costs a checkout, one per loss; CI saw one such loss in 100 decisions once,
    with the suite's processes sharing 2 cores, so losses are counted, not ruled out."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        warm = jobs.unique_sleep.job_key(("warm",), {})
        assert store.acquire(warm, "w", 60, now=clock.now()).acquired
        (kept,) = store._idle
        pool = store.client.connection_pool
        checkouts: list[int] = []
        losses: list[int] = []
        checkout, discard = pool.get_connection, store._discard_kept

        def counted(*args: Any, **kwargs: Any) -> Any:
            checkouts.append(1)
            return checkout(*args, **kwargs)

        def lost(*args: Any, **kwargs: Any) -> Any:
            losses.append(1)
            return discard(*args, **kwargs)

        monkeypatch.setattr(pool, "get_connection", counted)
        monkeypatch.setattr(store, "_discard_kept", lost)
        for n in range(100):
            key = jobs.unique_sleep.job_key((n,), {})
            owner = uuid()
            assert store.acquire(key, owner, 60, now=clock.now()).acquired
            assert store.release(key, owner)
        assert len(losses) <= 1, f"{len(losses)} kept connections lost in 100 decisions"
        assert len(checkouts) == len(losses)
        assert len(store._idle) == 1 and (losses or store._idle == [kept])
        assert store.release(warm, "w")


def test_threads_never_share_a_connection_or_a_reply(redis_client: Any) -> None:
    """S1: 8 threads deciding at once each read their own answer: every acquire of a
    thread's own key returns that thread's owner, every duplicate the one holder."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        shared = jobs.unique_sleep.job_key(("shared",), {})
        holder = uuid()
        assert store.acquire(shared, holder, 60, now=clock.now()).acquired
        wrong: list[str] = []
        start = threading.Barrier(8)

        def work(worker: int) -> None:
            start.wait()
            for n in range(150):
                key = jobs.unique_sleep.job_key((f"{worker}-{n}",), {})
                mine = uuid()
                got = store.acquire(key, mine, 60, now=clock.now())
                if not got.acquired or got.holder != mine:
                    wrong.append(f"{worker}-{n}: {got}")
                dup = store.acquire(shared, mine, 60, now=clock.now())
                if dup.acquired or dup.holder != holder:
                    wrong.append(f"shared from {worker}-{n}: {dup}")
                if not store.release(key, mine):
                    wrong.append(f"release {worker}-{n}")

        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        assert wrong == []
        assert 1 <= len(store._idle) <= MAX_IDLE
        assert store.release(shared, holder)


def test_a_reply_error_keeps_the_connection(redis_client: Any) -> None:
    """S1: an error reply (here WRONGTYPE: the lock key holds a plain string) is reported as
    StoreUnavailable, and the connection, which read the whole reply, is kept."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        key = jobs.unique_sleep.job_key(("wrongtype",), {})
        redis_client.set(store.physical(key.key), "not a lock")
        with pytest.raises(StoreUnavailable, match="WRONGTYPE"):
            store.acquire(key, uuid(), 60, now=clock.now())
        kept = list(store._idle)
        assert len(kept) == 1
        other = jobs.unique_sleep.job_key(("fine",), {})
        owner = uuid()
        assert store.acquire(other, owner, 60, now=clock.now()).acquired
        assert store._idle == kept
        assert store.release(other, owner)


def test_an_interrupted_decision_never_reuses_its_connection(redis_client: Any) -> None:
    """S1: a decision interrupted between sending and reading (KeyboardInterrupt, a worker's
    time limit) drops that connection: a later decision must not read the stale reply."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        key = jobs.unique_sleep.job_key(("interrupted",), {})
        first = uuid()
        assert store.acquire(key, first, 60, now=clock.now()).acquired
        (conn,) = store._idle

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            raise KeyboardInterrupt

        conn.read_response = interrupted
        with pytest.raises(KeyboardInterrupt):
            store.acquire(key, uuid(), 60, now=clock.now())
        del conn.read_response
        assert conn not in store._idle
        # the unread reply ("0" + first) is not read by the next, different decision
        other = jobs.unique_sleep.job_key(("after",), {})
        mine = uuid()
        answer = store.acquire(other, mine, 60, now=clock.now())
        assert answer.acquired and answer.holder == mine
        assert store.release(other, mine)
        assert store.release(key, first)


def test_dropping_the_store_hands_its_connections_back(redis_client: Any) -> None:
    """A store dropped on a settings change gives its kept connections back to the
    django-redis pool instead of holding them for ever."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        key = jobs.unique_sleep.job_key(("closing",), {})
        owner = uuid()
        assert store.acquire(key, owner, 60, now=clock.now()).acquired
        (kept,) = store._idle
        pool = store.client.connection_pool
    # leaving override_settings sends setting_changed: the store is dropped and closed
    assert store._idle == []
    again = pool.get_connection()
    try:
        assert again is kept
    finally:
        pool.release(again)
    # a dropped store still answers (a caller may hold it), but keeps nothing any more
    assert store.get(key) is not None
    other = jobs.unique_sleep.job_key(("after-close",), {})
    assert store.acquire(other, "late", 60, now=clock.now()).acquired
    assert store._idle == []
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        assert _store() is not store
        assert _store().release(key, owner)
        assert _store().release(other, "late")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_uses_the_parents_connection(redis_client: Any) -> None:
    """A prefork worker child inherits the parent's store: it must open its own connection
    (two processes reading one socket would read each other's replies), and must leave the
    parent's connection working."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        key = jobs.unique_sleep.job_key(("parent",), {})
        owner = uuid()
        assert store.acquire(key, owner, 60, now=clock.now()).acquired
        (parent_conn,) = store._idle
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            code = 1
            try:
                if store._idle == []:
                    code = 2
                    mine = uuid()
                    child_key = jobs.unique_sleep.job_key(("child",), {})
                    got = store.acquire(child_key, mine, 60, now=clock.now())
                    dup = store.acquire(key, mine, 60, now=clock.now())
                    if (
                        got.acquired
                        and got.holder == mine
                        and not dup.acquired
                        and dup.holder == owner
                        and parent_conn not in store._idle
                        and store.release(child_key, mine)
                    ):
                        code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # the parent's kept connection still answers
        assert store._idle == [parent_conn]
        again = store.acquire(key, uuid(), 60, now=clock.now())
        assert not again.acquired and again.holder == owner
        assert store._idle == [parent_conn]
        assert store.release(key, owner)
