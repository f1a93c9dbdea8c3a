"""W2/W3 on two more entry paths, with the real prefork worker of tests/test_entry_paths.py:
a chain whose first link is skipped and whose rest is a group (its members end REVOKED, so
the caller's GroupResult does not wait forever), and Task.replace() by a signature of the same
job and key (the replacement, same id, keeps the lock: it was released by the replaced run's
Ignore). From a red-team of the worker guard; both failed before their fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import chain, group, states
from celery.exceptions import TaskRevokedError

from tests import jobs_guard as jg
from tests.guard_support import (
    BROKERS,
    guard_worker,
    lock_of,
    publishing_to,
    reset_queue,
    token,
)
from tests.test_entry_paths import LEASE_SECONDS, hold, runs_of
from tests.workers import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """One prefork worker on the Redis broker for the module (tests/test_entry_paths.py runs
    every entry path on RabbitMQ too)."""
    from tests.celery_app import app

    reset_queue(app, BROKERS["redis"])
    env = {"DEDUP_JOBS_TEST_LEASE_SECONDS": str(LEASE_SECONDS)}
    with guard_worker(app, "redis", env=env), publishing_to(app, BROKERS["redis"]):
        yield "redis"


def test_chain_into_a_group_whose_first_link_is_skipped(broker: str) -> None:
    """The group after a skipped first link never runs: its members end REVOKED and the
    caller's get() raises instead of waiting (they stayed PENDING)."""
    t = token()
    holder = hold(t, 1)
    result: Any = chain(jg.guard_gated.si(t, 1),
                        group(jg.guard_gated.si(t, 2), jg.guard_gated.si(t, 3))).apply_async()
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert [r.state for r in result.results] == [states.REVOKED, states.REVOKED]
    jg.open_gate(t)
    assert holder.get(timeout=20) == 1
    assert runs_of(t) == ["1"]


def test_replace_by_the_same_key_keeps_the_lock_for_the_replacement(
        broker: str) -> None:
    """Task.replace() gives the replacement the running task's id; with the same key, the
    lock is handed over (as to a retry) and a dispatch meanwhile is deduplicated onto it."""
    t = token()
    result = jg.guard_replace_page.delay(t, 0, gate=t)
    wait_for(lambda: runs_of(t) == ["0"])
    # page 0's run is over (replaced: page 1 waits for its countdown, not active)
    def page_0_over() -> bool:
        active = jg.guard_replace_page.app.control.inspect(timeout=1.0).active() or {}
        return not any(task["id"] == result.id for tasks in active.values() for task in tasks)

    wait_for(page_0_over, 10)
    held = lock_of(jg.guard_replace_page, t)
    assert held is not None and held.owner == result.id, held
    dup = jg.guard_replace_page.delay(t, 7)
    assert dup.deduplicated is True and dup.id == result.id
    jg.open_gate(t)
    assert result.get(timeout=30) == 1
    assert runs_of(t) == ["0", "1"]
