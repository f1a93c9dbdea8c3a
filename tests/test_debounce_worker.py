"""DebouncedJob with a real worker on the real Redis broker, on every store (D1–D7)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.result import AsyncResult
from django.core.cache import caches

from dedup_jobs.signals import job_debounced
from dedup_jobs.stores.database.models import PendingDebounce
from tests import jobs_debounce as jobs
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


@pytest.fixture(autouse=True)
def _empty_locmem() -> None:
    caches["locmem"].clear()


@pytest.fixture
def debounced() -> Iterator[list[dict[str, Any]]]:
    """Every job_debounced signal sent during the test."""
    sent: list[dict[str, Any]] = []

    def on_debounced(sender: Any, **kwargs: Any) -> None:
        sent.append({"sender": sender, **kwargs})

    job_debounced.connect(on_debounced, weak=False)
    yield sent
    job_debounced.disconnect(on_debounced)


def test_burst_runs_once_with_last_arguments(
    app: Any, store_name: str, debounced: list[dict[str, Any]]
) -> None:
    """D1/D3/D4: five dispatches of one id run the job once, debounce_for after the last,
    with the last arguments; every dispatch has its own id whose result (also rebuilt from
    the id alone) is the run's; each superseded dispatch sent job_debounced once."""
    with thread_worker(app):
        results = [jobs.debounce_record.delay(7, value) for value in range(5)]
        last_at = time.time()
        other = jobs.debounce_record.delay(8, 100)  # another id: a burst of its own
        assert len({r.id for r in results}) == 5
        assert [r.get(timeout=15) for r in results] == [4] * 5
        assert [AsyncResult(r.id, app=app).get(timeout=5) for r in results] == [4] * 5
        assert other.get(timeout=15) == 100
    assert sorted(v for v in jobs.values("record")) == [[7, 4], [8, 100]]
    (started, _), = [r for r in jobs.runs("record") if r[1] == [7, 4]]
    assert started >= last_at + 1.0 - 0.05
    assert [(d["superseded_id"], d["by_id"]) for d in debounced] == [
        (results[i].id, results[i + 1].id) for i in range(4)
    ]
    assert {d["debounce_id"] for d in debounced} == {"item=7"}
    assert all(d["sender"] is type(app.tasks["tests.debounce_record"]) for d in debounced)
    assert all(d["key"].endswith(":debounce:tests.debounce_record:item=7") for d in debounced)
