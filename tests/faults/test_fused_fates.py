"""The fused dispatch under the three fates of its one call (issue 26): the broker is a
private redis-server, reached directly; the store is the same server behind the proxy of
tests/faults/proxy.py, so only the store's call misbehaves. The fused script takes the lock
and pushes the message together or not at all, so each fate leaves both or neither; the
caller's result resolves either way (the job's result, or REVOKED when its message was taken
back). The store's client gives up after 0.5 s, STORE_TIMEOUT 1 s (tests/faults/store.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores.redis.scripts import SHA
from tests.faults.proxy import Proxy
from tests.faults.servers import RedisServer, busy
from tests.faults.store import LEASE_SECONDS, faulty_store, lock_of, until
from tests.faults.test_dispatch_fates import LATE
from tests.fused_app import FusedApp, fused_app, keep_default_app
from tests.guard_support import token
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


@pytest.fixture(autouse=True)
def _default_app() -> Iterator[None]:
    with keep_default_app():
        yield

BROKER_DB = 2
FUSED = SHA["FUSED"].encode()


@pytest.fixture
def fapp(private_redis: RedisServer) -> Iterator[FusedApp]:
    made = fused_app(private_redis.url(BROKER_DB), private_redis.new_client(BROKER_DB))
    yield made
    made.app.close()


def _warm(fapp: FusedApp) -> None:
    """The script loaded, the servers compared: the faults hit the dispatch itself."""
    with thread_worker(fapp.app):
        t = token()
        assert fapp.unique.delay(t, 0).get(timeout=10) == 0
        wait_for(lambda: lock_of(fapp.unique, t, 0) is None, timeout=10)


def test_a_lost_reply_is_resent_and_the_message_runs_once(
    fapp: FusedApp, store_proxy: Proxy
) -> None:
    with faulty_store(store_proxy.url()):
        _warm(fapp)
        t = token()
        cut = store_proxy.drop_next_reply(match=FUSED)
        result = fapp.unique.delay(t, 1)
        assert cut.wait(0), "the proxy lost no reply"
        assert result.deduplicated is False
        assert fapp.counter.llen(fapp.queue) == 1
        with thread_worker(fapp.app):
            assert result.get(timeout=10) == 1
            wait_for(lambda: lock_of(fapp.unique, t, 0) is None, timeout=10)
    assert fapp.runs(t) == 1


def test_a_resend_after_the_run_ended_pushes_nothing_again(
    fapp: FusedApp, store_proxy: Proxy
) -> None:
    # the reply is lost, and before the client re-sends, the worker has run the message and
    # released its lock: the re-send finds the key free, and the receipt answers it
    with faulty_store(store_proxy.url()):
        _warm(fapp)
        t = token()
        with thread_worker(fapp.app):
            def run_first() -> None:
                assert until(lambda: fapp.runs(t) == 1, 10)[0]
                assert until(lambda: lock_of(fapp.unique, t, 0) is None, 10)[0]
                store_proxy.drop_connections()  # the reply is lost with its connection

            hook = store_proxy.before_next_reply(run_first, match=FUSED)
            result = fapp.unique.delay(t, 1)
            # (the callback's drop_connections() lets the client re-send before the proxy's
            # thread marks the hook fired: wait for it)
            assert hook.wait(5) and hook.error is None, hook.error
            assert result.get(timeout=10) == 1
            assert not until(lambda: fapp.runs(t) > 1, 1.0)[0]
    assert fapp.runs(t) == 1 and fapp.counter.llen(fapp.queue) == 0


def test_a_late_reply_raises_and_the_undo_takes_back_message_and_lock(
    fapp: FusedApp, store_proxy: Proxy
) -> None:
    with faulty_store(store_proxy.url()):
        _warm(fapp)
        t = token()
        undos = rollbacks.pending()
        late = store_proxy.delay_next_reply(LATE, match=FUSED)
        with pytest.raises(StoreUnavailable):
            fapp.unique.delay(t, 1)
        assert late.wait(0)
        wait_for(lambda: rollbacks.pending() <= undos, timeout=LEASE_SECONDS + LATE + 2)
        assert fapp.counter.llen(fapp.queue) == 0
        assert lock_of(fapp.unique, t, 0) is None
        # nothing of it left: the key is free, and a new dispatch runs
        again = fapp.unique.delay(t, 2)
        with thread_worker(fapp.app):
            assert again.get(timeout=10) == 2
    assert fapp.runs(t) == 1


def test_a_request_the_server_runs_late_changes_nothing(
    fapp: FusedApp, store_proxy: Proxy, private_redis: RedisServer
) -> None:
    with faulty_store(store_proxy.url()):
        _warm(fapp)
        t = token()
        # the script waits behind a stall: past its deadline
        with busy(private_redis, LATE), pytest.raises(StoreUnavailable):
            fapp.unique.delay(t, 1)
        assert until(lambda: private_redis.answers(), 10)[0]
        assert fapp.counter.llen(fapp.queue) == 0
        assert lock_of(fapp.unique, t, 0) is None


def test_a_request_never_sent_leaves_nothing(fapp: FusedApp, store_proxy: Proxy) -> None:
    with faulty_store(store_proxy.url()):
        _warm(fapp)
        t = token()
        store_proxy.blackhole()  # read and never forwarded
        with pytest.raises(StoreUnavailable):
            fapp.unique.delay(t, 1)
        store_proxy.pass_through()
        assert fapp.counter.llen(fapp.queue) == 0
        assert lock_of(fapp.unique, t, 0) is None
        with thread_worker(fapp.app):
            assert fapp.unique.delay(t, 2).get(timeout=10) == 2
    assert fapp.runs(t) == 1


def test_another_server_takes_the_two_round_trip_path(
    private_redis: RedisServer, caplog: Any
) -> None:
    import logging

    from django.conf import settings

    caplog.set_level(logging.INFO, logger="dedup_jobs")
    # broker on the private server, store on the test Redis: not one server
    other = fused_app(private_redis.url(BROKER_DB), private_redis.new_client(BROKER_DB))
    try:
        t = token()
        first = other.unique.delay(t, 1)
        assert other.unique.delay(t, 2).id == first.id
        assert "different Redis servers" in caplog.text
        assert other.counter.llen(other.queue) == 1
        assert other.unique.store_alias() == settings.DEDUP_JOBS["STORE"]
        with thread_worker(other.app):
            assert first.get(timeout=10) == 1
    finally:
        other.app.close()
