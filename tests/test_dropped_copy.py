"""U4 with W5: a copy of a running message that the worker drops before it runs (expired or
revoked in the queue: a broker redelivery, a manual re-send, a copy put off by W5 that
keeps the first's expires) releases only a lock still queued, never the lock its running
delivery holds (it did: a dispatch made after it then ran beside the first). From a
red-team of the worker guard; failed before the fix."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests import jobs
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def test_an_expired_copy_of_a_running_message_leaves_its_lock(app: Any) -> None:
    task = jobs.unique_sleep
    store = task.store()
    key = task.job_key((901,), {"seconds": 3})

    def state() -> str:
        lock = store.get(key)
        return "" if lock is None else f"{lock.state} {lock.owner}"

    first = task.delay(901, seconds=3)
    with thread_worker(app, pool="threads", concurrency=2):
        wait_for(lambda: state() == f"running {first.id}", 15)
        # the same message again, already expired: the worker drops it when it comes
        app.send_task(task.name, args=(901,), kwargs={"seconds": 3}, task_id=first.id,
                      expires=datetime.now(timezone.utc) - timedelta(seconds=1))
        wait_for(lambda: first.state == "REVOKED", 15)  # Celery's mark of the dropped copy
        assert state() == f"running {first.id}"
        again = task.delay(901, seconds=3)
        assert again.deduplicated and again.id == first.id
