"""A fused batch (L3 with issue 26's fused dispatch, ``jobs/fused_many.py``) under the fates of
its one call: the broker is a private redis-server, reached directly; the store is the same
server behind the proxy of tests/faults/proxy.py, so only the store's call misbehaves. Every
FUSED script of the batch takes its lock and pushes its message together or not at all; the
batch's reply cut midway is re-sent and answered as the first time (each message pushed
once); a late reply, or a request never sent, raises StoreUnavailable and leaves neither lock
nor message once the undo has run. The store's client gives up after 0.5 s, STORE_TIMEOUT 1 s
(tests/faults/store.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores import get_store
from tests.faults.proxy import Proxy
from tests.faults.servers import RedisServer
from tests.faults.store import LEASE_SECONDS, faulty_store, lock_of
from tests.faults.test_dispatch_fates import LATE
from tests.faults.test_fused_fates import FUSED, _warm
from tests.fused_app import FusedApp, fused_app, keep_default_app
from tests.guard_support import token
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

BROKER_DB = 2
BATCH = 30


@pytest.fixture(autouse=True)
def _default_app() -> Iterator[None]:
    with keep_default_app():
        yield


@pytest.fixture
def fapp(private_redis: RedisServer) -> Iterator[FusedApp]:
    made = fused_app(private_redis.url(BROKER_DB), private_redis.new_client(BROKER_DB))
    yield made
    made.app.close()


def _batch(fapp: FusedApp, tokens: list[str], base: int = 0) -> list[Any]:
    return list(fapp.unique.dispatch_many([((t, base + n), {}) for n, t in enumerate(tokens)]))


def _no_trace(fapp: FusedApp, tokens: list[str]) -> None:
    """Neither a message nor a lock of ``tokens`` left, once every undo has run."""
    assert fapp.counter.llen(fapp.queue) == 0
    left = [t for t in tokens if lock_of(fapp.unique, t, 0) is not None]
    assert left == [], f"locks of a batch that raised StoreUnavailable: {left}"


def _runs_once(fapp: FusedApp, tokens: list[str], base: int) -> None:
    """A batch of ``tokens`` dispatched now runs, each message once, with its own value."""
    again = _batch(fapp, tokens, base)
    assert [r.deduplicated for r in again] == [False] * len(tokens)
    with thread_worker(fapp.app):
        assert [r.get(timeout=15) for r in again] == [base + n for n in range(len(tokens))]
    assert [fapp.runs(t) for t in tokens] == [1] * len(tokens)


def test_a_batch_whose_reply_is_cut_midway_pushes_each_message_once(
    fapp: FusedApp, store_proxy: Proxy
) -> None:
    with faulty_store(store_proxy.url()):
        _warm(fapp)
        tokens = [token() for _ in range(BATCH)]
        cut = store_proxy.cut_next_reply(match=FUSED)
        results = _batch(fapp, tokens)
        assert cut.wait(0), "the proxy cut no reply"
        assert [r.deduplicated for r in results] == [False] * BATCH
        assert fapp.counter.llen(fapp.queue) == BATCH  # the re-send pushed nothing again
        with thread_worker(fapp.app):
            assert [r.get(timeout=15) for r in results] == list(range(BATCH))
            wait_for(lambda: all(lock_of(fapp.unique, t, 0) is None for t in tokens),
                     timeout=10)
    assert [fapp.runs(t) for t in tokens] == [1] * BATCH


def test_a_batch_whose_reply_is_late_raises_and_the_undo_takes_back_everything(
    fapp: FusedApp, store_proxy: Proxy
) -> None:
    with faulty_store(store_proxy.url()):
        _warm(fapp)
        tokens = [token() for _ in range(BATCH)]
        undos = rollbacks.pending()
        late = store_proxy.delay_next_reply(LATE, match=FUSED)
        with pytest.raises(StoreUnavailable):
            _batch(fapp, tokens)
        assert late.wait(0)
        # the undo of every call of the batch ran (tried as soon as the store answers)
        wait_for(lambda: rollbacks.pending() <= undos, timeout=LEASE_SECONDS + LATE + 2)
        _no_trace(fapp, tokens)
        _runs_once(fapp, tokens, 100)


def test_a_batch_never_sent_leaves_nothing(
    fapp: FusedApp, store_proxy: Proxy, monkeypatch: Any
) -> None:
    with faulty_store(store_proxy.url()) as alias:
        _warm(fapp)
        tokens = [token() for _ in range(BATCH)]
        undos = rollbacks.pending()
        store = get_store(alias)
        batches: list[int] = []  # the fused batch's calls (no other path makes them)
        real = store.acquire_fused_many
        monkeypatch.setattr(store, "acquire_fused_many",
                            lambda calls: (batches.append(len(calls)), real(calls))[1])
        store_proxy.blackhole()  # read and never forwarded
        with pytest.raises(StoreUnavailable):
            _batch(fapp, tokens)
        store_proxy.pass_through()
        assert batches == [BATCH]
        wait_for(lambda: rollbacks.pending() <= undos, timeout=LEASE_SECONDS + 2)
        _no_trace(fapp, tokens)
        _runs_once(fapp, tokens, 200)
