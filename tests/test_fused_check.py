"""System check I001 (issue 26): with the fused transport named, the path each unique job's
dispatch takes; silent without it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from dedup_jobs import checks_fused
from tests.fused_app import fused_app, keep_default_app

pytestmark = pytest.mark.redis


@pytest.fixture(autouse=True)
def _default_app() -> Iterator[None]:
    with keep_default_app():
        yield


def _messages(monkeypatch: Any, jobs: list[Any]) -> list[str]:
    monkeypatch.setattr(checks_fused, "registered_jobs", lambda: jobs)
    found = checks_fused.check_fused()
    assert {m.id for m in found} <= {"dedup_jobs.I001"}
    return [m.msg for m in found]


def test_each_unique_job_is_told_its_path(monkeypatch: Any) -> None:
    counter = redis.Redis.from_url(settings.REDIS_URL)
    same = fused_app(f"{settings.REDIS_URL}/12", counter)
    other = fused_app("redis://127.0.0.1:1/0", counter)  # another server (nothing listens)
    try:
        assert _messages(monkeypatch, [same.unique]) == [
            f"{same.unique.name}: fused: the lock and the message in one round trip; "
            f"dispatch_many: one round trip per batch."]
        [message] = _messages(monkeypatch, [other.unique])
        assert message.startswith(f"{other.unique.name}: two round trips per dispatch: "
                                  f"the broker (127.0.0.1:1) and its store 'redis' (")
        assert message.endswith(") are different Redis servers.")
        same.unique.on_duplicate = "replace"
        assert _messages(monkeypatch, [same.unique]) == [
            f"{same.unique.name}: two round trips per dispatch: on_duplicate = 'replace'."]
    finally:
        same.app.close()
        other.app.close()


def test_silent_without_the_transport(monkeypatch: Any) -> None:
    from tests.faults.jobs import fault_unique  # a job of the test app: kombu's own transport

    assert _messages(monkeypatch, [fault_unique]) == []
