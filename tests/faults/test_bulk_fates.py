"""L3 under the fates of its one store call (issue 26): ``dispatch_many``'s batch of ACQUIREs
is one pipelined round trip through the proxy of tests/faults/proxy.py to a private
redis-server. Its reply cut in the middle of the batch (the first answers arrive, then the
connection drops): the client re-sends the batch, which the idempotent script answers as the
first time, and every call is published once. Its reply late: StoreUnavailable, nothing
published, every lock the batch took undone (S7)."""

from __future__ import annotations

from typing import Any

import pytest

from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores.redis.scripts import SHA
from tests.faults.jobs import bodies, fault_unique
from tests.faults.proxy import Proxy
from tests.faults.store import LEASE_SECONDS, faulty_store, lock_of, until
from tests.faults.test_dispatch_fates import LATE, published  # noqa: F401 (a fixture)
from tests.guard_support import token
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

BATCH = 40


def test_a_batch_whose_reply_is_cut_midway_is_published_once(
    app: Any, store_proxy: Proxy, published: list[str]  # noqa: F811
) -> None:
    with faulty_store(store_proxy.url()), thread_worker(app):
        assert fault_unique.delay(token(), 0).get(timeout=10) == 0  # scripts loaded
        published.clear()
        tokens = [token() for _ in range(BATCH)]
        cut = store_proxy.cut_next_reply(match=SHA["ACQUIRE"].encode())
        results = fault_unique.dispatch_many([((t, n), {}) for n, t in enumerate(tokens)])
        assert cut.wait(0), "the proxy cut no reply"
        done = until(lambda: all(r.ready() for r in results), 20)[0]
        runs = {t: [b["value"] for b in bodies(t)] for t in tokens}
    assert [r.deduplicated for r in results] == [False] * BATCH
    assert sorted(published) == sorted(r.id for r in results)
    assert done and [r.result for r in results] == list(range(BATCH))
    assert runs == {t: [n] for n, t in enumerate(tokens)}


def test_a_batch_whose_reply_is_late_publishes_nothing_and_leaves_no_lock(
    app: Any, store_proxy: Proxy, published: list[str]  # noqa: F811
) -> None:
    with faulty_store(store_proxy.url()):
        with thread_worker(app):
            assert fault_unique.delay(token(), 0).get(timeout=10) == 0  # scripts loaded
        published.clear()
        tokens = [token() for _ in range(BATCH)]
        late = store_proxy.delay_next_reply(LATE, match=SHA["ACQUIRE"].encode())
        undos = rollbacks.pending()
        with pytest.raises(StoreUnavailable):
            fault_unique.dispatch_many([((t, n), {}) for n, t in enumerate(tokens)])
        assert late.wait(0)
        # the undo of every request of the batch ran (tried as soon as the store answers)
        wait_for(lambda: rollbacks.pending() <= undos, timeout=LEASE_SECONDS + LATE + 2)
        left = [t for t in tokens if lock_of(fault_unique, t) is not None]
        again = fault_unique.dispatch_many([((t, 100 + n), {}) for n, t in enumerate(tokens)])
        with thread_worker(app):
            done = until(lambda: all(r.ready() for r in again), 20)[0]
        runs = {t: [b["value"] for b in bodies(t)] for t in tokens}
    assert left == [], f"locks of a batch that raised StoreUnavailable: {left}"
    assert [r.deduplicated for r in again] == [False] * BATCH
    assert sorted(published) == sorted(r.id for r in again)
    assert done and runs == {t: [100 + n] for n, t in enumerate(tokens)}
