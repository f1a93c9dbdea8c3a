"""S7 for a debounce dispatch whose reply is lost (issue 21, case 7): the DEBOUNCE ran, the
dispatch raised StoreUnavailable. A private redis-server behind tests/faults/proxy.py holds back
both replies of that one dispatch (its try and its one re-send, matched by its task id) past
the client's timeout, while other dispatches of the same id go through; a real worker runs
the burst. Required: a dispatch that raised StoreUnavailable is never the burst's message and
never the source of the arguments that run; no dispatch is absorbed onto an id that will not
run; every result becomes ready."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import shared_task
from celery.utils import uuid

from dedup_jobs import DebouncedJob
from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores import get_store
from tests.faults.jobs import DEBOUNCE_FOR, _body, bodies, fault_debounced, fault_unique
from tests.faults.proxy import Proxy
from tests.faults.servers import free_port
from tests.faults.store import FAULTY, burst_of, faulty_store, until
from tests.guard_support import token
from tests.workers import thread_worker

pytestmark = [pytest.mark.redis, pytest.mark.worker]

#: longer than the store call's whole budget (STORE_TIMEOUT 1 s): the replies come too late
HELD = 3.0
#: the long job's debounce_for: its burst is due well after the failed dispatch gave up and
#: its undo landed, also on a loaded machine (the undo cannot reach a burst due before it)
LONG = 6.0


@shared_task(bind=True, base=DebouncedJob, debounce_for=LONG, debounce_on=("token",),
             name="tests.faults.debounced_long")
def long_debounced(self: DebouncedJob, token: str, value: int = 0) -> int:
    """A DebouncedJob whose burst is due later than a failed dispatch's undo lands (its
    debounce_for is above STORE_TIMEOUT)."""
    _body(self, token, 0.0, "", value)
    return value


def _failing_dispatch(proxy: Proxy, t: str, value: int, job: Any = fault_debounced,
                      ) -> tuple[threading.Thread, list[Any]]:
    """Dispatch ``job(t, value)`` in a thread, both of its replies held back: it runs at
    the server (twice: the try and the re-send) and raises StoreUnavailable."""
    task_id = uuid()
    for _ in range(2):
        proxy.delay_next_reply(HELD, match=task_id.encode())
    outcome: list[Any] = []

    def dispatch() -> None:
        try:
            outcome.append(job.apply_async((t, value), task_id=task_id))
        except StoreUnavailable as exc:
            outcome.append(exc)

    thread = threading.Thread(target=dispatch)
    thread.start()
    return thread, outcome


def test_lost_reply_of_a_bursts_first_dispatch(app: Any, store_proxy: Proxy) -> None:
    """S7, case 7: the first dispatch's lost reply started a burst with its never-published
    id as message; two dispatches are absorbed into it before the dispatch raises. They run
    (once, with the last arguments) and their results are ready; nothing runs with the
    failed dispatch's arguments."""
    with faulty_store(store_proxy.url()), thread_worker(app):
        assert fault_debounced.delay(token(), 0).get(timeout=10) == 0  # scripts loaded
        t = token()
        thread, outcome = _failing_dispatch(store_proxy, t, 1)
        assert until(lambda: burst_of(fault_debounced, t) is not None, 5)[0]
        absorbed = [fault_debounced.delay(t, value) for value in (2, 3)]
        thread.join(10)
        assert outcome and isinstance(outcome[0], StoreUnavailable), outcome
        ready = until(lambda: all(r.ready() for r in absorbed), DEBOUNCE_FOR + 20)[0]
        states = [(r.id, r.state, r.result) for r in absorbed]
        ran = [b["value"] for b in bodies(t)]
    assert ready and ran == [3], f"bodies ran with {ran}; results {states}"
    assert [r.result for r in absorbed] == [3, 3], states


def test_lost_reply_of_an_absorbed_dispatch(app: Any, store_proxy: Proxy) -> None:
    """S7, case 7's mirror: a dispatch absorbed into a live burst raised StoreUnavailable
    (its lost reply made it the burst's latest): the undo withdraws it, and the burst runs
    with the arguments of the dispatch before it, never with the failed one's. (The undo
    lands once the dispatch gave up, STORE_TIMEOUT after it: here before the burst is due.)"""
    with faulty_store(store_proxy.url()), thread_worker(app):
        assert fault_debounced.delay(token(), 0).get(timeout=10) == 0  # scripts loaded
        t = token()
        first = long_debounced.delay(t, 1)
        thread, outcome = _failing_dispatch(store_proxy, t, 2, long_debounced)
        thread.join(10)
        assert outcome and isinstance(outcome[0], StoreUnavailable), outcome
        ready = until(first.ready, LONG + 20)[0]
        ran = [b["value"] for b in bodies(t)]
    assert ready and ran == [1] and first.result == 1, (
        f"bodies ran with {ran}; first {first.state} {first.result}")


def test_an_undo_on_a_store_that_is_gone_holds_up_no_other(app: Any, store_proxy: Proxy) -> None:
    """S7 across stores: a release left pending on a store that is gone (an earlier store
    of the same alias, its server stopped) never holds up the undo of a failed dispatch on
    the store that answers: the burst still runs with the last published arguments."""
    with faulty_store(f"redis://127.0.0.1:{free_port()}"):  # nothing listens there
        gone = get_store(FAULTY)
        key = fault_unique.job_key((token(),), {})
        fault_unique._finish(gone, key, "finished-owner", FAULTY, "success")  # cannot release
    assert rollbacks.pending() >= 1
    test_lost_reply_of_a_bursts_first_dispatch(app, store_proxy)
