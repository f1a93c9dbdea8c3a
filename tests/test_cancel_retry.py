"""L2 (cancel_running) with retries: a run asked to stop ends cancelled (REVOKED, naming the
dispatch that asked), also when its body raises an error that autoretry_for turns into a
retry: the retry is not sent (it ran again after the dispatch that cancelled it). From a
red-team of the flow control; failed before the fix."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import override_settings

from tests import jobs_flow
from tests.test_cancel_running import _env
from tests.test_flow import _records
from tests.workers import process_worker, wait_for

pytestmark = [pytest.mark.redis]


@pytest.mark.worker
def test_a_cancelled_run_whose_body_raises_under_autoretry_is_not_run_again() -> None:
    """A cooperative body that raises when asked to stop, on a task with autoretry_for
    (countdown 2 s): the cancelled run is neither retried nor run again; its result is
    REVOKED."""

    def started(tag: int) -> list[Any]:
        return [r for r in _records("cancel_autoretry") if r[:3] == (77, tag, "start")]

    def stopped() -> list[Any]:
        return [r for r in _records("cancel_autoretry") if r[:3] == (77, 0, "stopped")]

    dedup, env = _env("redis")
    with override_settings(DEDUP_JOBS=dedup), process_worker(concurrency=2, env=env):
        task = jobs_flow.cancel_autoretry
        first = task.delay(77, tag=0, seconds=60)
        wait_for(lambda: started(0), 30)
        second = task.delay(77, tag=1, seconds=0.2)
        assert second.get(timeout=30) == 1
        wait_for(stopped, 30)
        wait_for(lambda: first.state == "REVOKED", 30)
        # past the countdown a retry would have had (2 s), with room
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            runs = _records("cancel_autoretry")
            assert len(started(0)) == 1, f"the cancelled run ran again: {runs}"
            time.sleep(0.1)
    assert first.state == "REVOKED"
