"""D9, A2: ``clear_stale_locks`` lists and removes debounce bursts whose message is lost (not
run by their due time plus LEASE_SECONDS), never a burst still waiting for its message."""

from __future__ import annotations

import io
from typing import Any

import pytest
from celery import states
from django.core.management import call_command

from dedup_jobs import clock
from tests import admin_helpers
from tests import jobs_debounce as jobs

listed_store = admin_helpers.listed_store_workers  # django-redis and SQLite; the rest: -m matrix

pytestmark = [pytest.mark.redis]

#: LEASE_SECONDS' default, plus debounce_record's max_wait (3 s) and some
LATER = 60 + 3 + 10


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("clear_stale_locks", *args, "--inspect-timeout", "0.3", "-v", "2", stdout=out)
    return out.getvalue()


def burst(item: int) -> Any:
    return jobs.debounce_record.store().get_debounce(jobs.debounce_record.job_key((item, 0), {}))


def test_overdue_burst_is_listed_and_removed(
    app: Any, listed_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D9: a burst whose message was purged is overdue once its due time plus LEASE_SECONDS
    passed: --dry-run lists it (job, id, message, why) and keeps it; the command removes
    it and its dispatches end REVOKED. A burst dispatched since is kept."""
    lost = [jobs.debounce_record.delay(41, value) for value in (1, 2)]
    app.control.purge()  # the burst's message is lost
    real = clock.now
    monkeypatch.setattr(clock, "now", lambda: real() + LATER)
    waiting = jobs.debounce_record.delay(42, 1)
    app.control.purge()
    listed = run("--dry-run")
    assert (f"would remove debounce burst tests.debounce_record[item=41] in {listed_store!r}, "
            f"message {lost[0].id}: overdue") in listed, listed
    assert "item=42" not in listed
    assert "2 pending debounce bursts scanned: would remove 1 overdue." in listed
    assert burst(41) is not None
    removed = run()
    assert "removed debounce burst tests.debounce_record[item=41]" in removed, removed
    assert burst(41) is None and burst(42) is not None
    assert [r.state for r in lost] == [states.REVOKED] * 2
    assert waiting.state == states.PENDING
