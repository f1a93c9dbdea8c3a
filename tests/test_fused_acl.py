"""The fused dispatch with a store user that may not write Celery's queue (an ACL split of
one Redis): the server refuses the FUSED script before it runs (NOPERM), and the job takes
two round trips, each as its own connection's user, instead of failing every dispatch (or,
with ON_STORE_ERROR = "enqueue", publishing every one without a lock). From a red-team of the
fused transport; the first and third tests failed before the fix."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from django.conf import settings

from tests.fused_app import BROKER_DB, fused_app, keep_default_app
from tests.guard_support import token

pytestmark = [pytest.mark.redis]


@pytest.fixture(autouse=True)
def _default_app() -> Iterator[None]:
    with keep_default_app():
        yield


@pytest.fixture
def store_keys_only_user() -> Iterator[str]:
    """A store URL on the broker's own server, as an ACL user limited to the store's keys
    (a cache user that may not touch Celery's queues: a common split of one Redis)."""
    admin = redis.Redis.from_url(settings.REDIS_URL)
    user, password = f"store-{token()}", "pw-store"
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*dedup_jobs:*",
                          "&*", "+@all")
    host = settings.REDIS_URL.split("://", 1)[1]
    yield f"redis://{user}:{password}@{host}/9"
    admin.execute_command("ACL", "DELUSER", user)


@contextmanager
def as_store_user(url: str, **dedup: Any) -> Iterator[tuple[Any, Any]]:
    """A fused app on the test Redis, its store reached as the user of ``url``: yields the
    app and a client of the broker's database; the queue emptied at the end."""
    from tests.faults.store import faulty_store

    counter = redis.Redis.from_url(f"{settings.REDIS_URL}/{BROKER_DB}")
    made = fused_app(f"{settings.REDIS_URL}/{BROKER_DB}", counter)
    try:
        with faulty_store(url, store_timeout=2.0, socket_timeout=2.0, **dedup):
            yield made, counter
    finally:
        counter.delete(made.queue)
        made.app.close()


def test_a_store_user_that_may_not_write_the_queue_still_dispatches(
        store_keys_only_user: str) -> None:
    """The fused path runs the LPUSH as the store's user, which the server refuses (NOPERM):
    every unique dispatch raised StoreUnavailable (the channel checked only that the servers
    are the same). Now the job falls back to two round trips (ACQUIRE as the store's user,
    LPUSH as the broker's)."""
    with as_store_user(store_keys_only_user) as (made, counter):
        t = token()
        first = made.unique.delay(t, 1)
        again = made.unique.delay(t, 2)
        assert (first.deduplicated, again.deduplicated) == (False, True)
        assert counter.llen(made.queue) == 1


def test_the_same_user_on_the_two_round_trip_path_dispatches(
        store_keys_only_user: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the same user and app with the fused path switched off."""
    from dedup_jobs.jobs import unique

    monkeypatch.setattr(unique, "try_fused", lambda *a, **k: None)
    test_a_store_user_that_may_not_write_the_queue_still_dispatches(store_keys_only_user)


def test_with_enqueue_a_store_user_that_may_not_write_the_queue_never_deduplicates(
        store_keys_only_user: str) -> None:
    """ON_STORE_ERROR = "enqueue": every dispatch is published without a lock."""
    with as_store_user(store_keys_only_user, ON_STORE_ERROR="enqueue") as (made, counter):
        t = token()
        results = [made.unique.delay(t, n) for n in range(3)]
        assert [r.deduplicated for r in results] == [False, True, True]
        assert counter.llen(made.queue) == 1


def test_a_fused_batch_with_a_store_user_that_may_not_write_the_queue_still_dispatches(
        store_keys_only_user: str) -> None:
    """The same for dispatch_many: the batch's FUSED pipeline is refused as a whole before
    any script runs; the batch takes two round trips."""
    with as_store_user(store_keys_only_user) as (made, counter):
        t = token()
        results = made.unique.dispatch_many([((t, 1), {}), ((t, 2), {}),
                                             ((token(), 3), {})])
        assert [r.deduplicated for r in results] == [False, True, False]
        assert results[1].id == results[0].id
        assert counter.llen(made.queue) == 2
