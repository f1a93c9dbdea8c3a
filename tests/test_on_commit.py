"""U7: delay_on_commit / apply_async_on_commit take the lock and publish only when the
transaction commits; a rollback (or a rolled-back savepoint) leaves no lock and no message."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from tests import jobs_guard as jg
from tests.guard_support import QUEUE, lock_of, token
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


class Rollback(Exception):
    pass


def queued(app: Any) -> int:
    """Messages waiting in the test queue of the test app's own (Redis) broker."""
    with app.connection_for_write() as conn:
        return int(app.amqp.queues[QUEUE](conn.default_channel).queue_declare().message_count)


@pytest.mark.parametrize("how", ["delay_on_commit", "apply_async_on_commit"])
def test_rollback_leaves_no_lock_and_no_message(app: Any, how: str) -> None:
    """U7: dispatched on commit inside a transaction that rolls back: no lock is taken, none
    is left, nothing is published."""
    t = token()
    with pytest.raises(Rollback), transaction.atomic():
        if how == "delay_on_commit":
            jg.guard_gated.delay_on_commit(t, 1)
        else:
            jg.guard_gated.apply_async_on_commit((t, 1))
        assert lock_of(jg.guard_gated, t, 1) is None
        raise Rollback
    assert lock_of(jg.guard_gated, t, 1) is None
    assert queued(app) == 0


def test_rolled_back_savepoint_leaves_no_lock(app: Any) -> None:
    """U7: a dispatch in a savepoint that rolls back is dropped, while a dispatch of another
    key in the committed outer transaction locks and publishes."""
    t = token()
    with transaction.atomic():
        jg.guard_gated.delay_on_commit(t, 2)
        with pytest.raises(Rollback), transaction.atomic():
            jg.guard_gated.delay_on_commit(t, 1)
            raise Rollback
    assert lock_of(jg.guard_gated, t, 1) is None
    assert lock_of(jg.guard_gated, t, 2) is not None
    assert queued(app) == 1


def test_commit_locks_and_publishes_once(app: Any) -> None:
    """U7/U2: three on-commit dispatches of one key in a committed transaction: nothing is
    locked before the commit; at commit the first locks and publishes, the others are
    deduplicated: one message, one execution, and the lock is released after it."""
    t = token()
    with transaction.atomic():
        jg.guard_gated.delay_on_commit(t, 1)
        jg.guard_gated.delay_on_commit(t, item=1)
        jg.guard_gated.apply_async_on_commit(kwargs={"token": t, "item": 1})
        assert lock_of(jg.guard_gated, t, 1) is None
        assert queued(app) == 0
    assert lock_of(jg.guard_gated, t, 1) is not None
    assert queued(app) == 1
    with thread_worker(app):
        wait_for(lambda: jg.runs(t) and lock_of(jg.guard_gated, t, 1) is None)
    assert jg.runs(t) == ["1"]
