"""S7/W4 on the Redis family and the database store: the worker's checks under the "late"
fate (the call reaches the server after its caller gave up, so the caller already ran W4 or
deferred, W7; issue 21: START, START_EXCLUSIVE; the database store's start and
start_exclusive, on SQLite, PostgreSQL, MariaDB and its row-locking path). A late check
changes nothing (it carries its caller's deadline, as ACQUIRE does): whatever the check should
have taken is taken by the re-send the reconciliation (W4) or the deferred copy (W7) sends
with a deadline of its own. (The claim record under a re-send is proved on every store in
tests/test_idempotent_stores.py.) Found by tests/test_fates_property.py's minimal
examples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import running_key
from dedup_jobs.stores.database import statements
from tests.conftest import ALL_STORE_PARAMS, store_fixture
from tests.fates_model import past_deadline

pytestmark = pytest.mark.django_db(databases="__all__")

LOCK = build_key("unique", "tests.start_fates", "item=1")
LEASE = 30.0


store_name = store_fixture([
    *ALL_STORE_PARAMS,
    # the row-locking path on SQLite too (portable.py; ALL_STORE_PARAMS has it on PostgreSQL)
    pytest.param("database", id="database-sqlite-portable"),
])


@pytest.fixture
def store(store_name: str, request: pytest.FixtureRequest,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Every store of the store-facing suites (tests/conftest.py ALL_STORE_PARAMS), with a
    lease of 60 s."""
    if request.node.callspec.id.endswith("-portable"):
        monkeypatch.setattr(statements, "dialect", lambda connection: None)
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "LEASE_SECONDS": 60}):
        yield get_store(settings.DEDUP_JOBS["STORE"])


def _late(store: Any, call: Any) -> str:
    """Run ``call`` as if it reached the server past its caller's deadline (the way
    tests/fates_model.py lands a late call): refused, what it raised."""
    with past_deadline(store):
        try:
            answer = call()
        except StoreUnavailable as exc:
            return str(exc)
    raise AssertionError(f"a check past its caller's deadline ran: {answer}")


def test_late_start_exclusive_takes_no_running_marker(store: Any) -> None:
    """R2/W4/S7: "the late START_EXCLUSIVE g3 left X:run held by g3, which is not running" —
    a START_EXCLUSIVE the server runs after its caller gave up (the message was deferred for
    the store, W7, and its copy re-sent the check, ran and released) takes no running marker
    and leaves the queued lock as it is."""
    assert store.acquire(LOCK, "g3", LEASE, now=clock.now()).acquired
    _late(store, lambda: store.start_exclusive(
        LOCK, running_key(LOCK), "g3", LEASE, now=clock.now(), delivery="n1"))
    assert store.get(running_key(LOCK)) is None
    lock = store.get(LOCK)
    assert (lock.owner, lock.state) == ("g3", "queued")
    # the re-send with a deadline of its own (the deferred copy, same nonce) does take it
    again = store.start_exclusive(LOCK, running_key(LOCK), "g3", LEASE, now=clock.now(),
                                  delivery="n1")
    assert again.run and again.released and store.get(running_key(LOCK)).owner == "g3"


def test_late_start_takes_no_lock_for_a_run_that_ended(store: Any) -> None:
    """W4/S7: a plain START the server runs after its caller gave up (the body ran under W4,
    its reconciliation's re-send took the lock, the run released it) takes no lock: else a
    lock of a finished run would hold the key, and dispatches be deduplicated onto it."""
    _late(store, lambda: store.start(LOCK, "g1", LEASE, now=clock.now(), release=False,
                                           delivery="n1"))
    assert store.get(LOCK) is None


def test_late_until_processing_start_changes_nothing(store: Any) -> None:
    """P1/W4/S7: an until-processing START past its caller's deadline changes nothing (its
    reconciliation's re-send releases the lock), and a re-send in time still releases it."""
    assert store.acquire(LOCK, "p1", LEASE, now=clock.now()).acquired
    _late(store, lambda: store.start(LOCK, "p1", LEASE, now=clock.now(), release=True,
                                           delivery="n1"))
    assert store.get(LOCK).owner == "p1"
    again = store.start(LOCK, "p1", LEASE, now=clock.now(), release=True, delivery="n1")
    assert again.run and again.released and store.get(LOCK) is None


def test_a_resent_start_past_its_deadline_changes_nothing(store: Any) -> None:
    """W5/S7: a re-send of a START that ran (same nonce), landing late, is refused too (the
    reconciliation asks again), and the lock stays as the first left it."""
    assert store.start(LOCK, "g1", LEASE, now=clock.now(), release=False, delivery="n1").took
    _late(store, lambda: store.start(LOCK, "g1", LEASE, now=clock.now(), release=False,
                                           delivery="n1"))
    lock = store.get(LOCK)
    assert (lock.owner, lock.state) == ("g1", "running")
