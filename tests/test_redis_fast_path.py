"""The django-redis store's EVALSHA fast path (S1): scripts loaded on demand, a dropped
connection recovered, and still one round trip per decision."""

from __future__ import annotations

from typing import Any

import pytest
from celery.utils import uuid
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.stores import get_store
from tests import jobs

pytestmark = pytest.mark.redis


def _store() -> Any:
    return get_store("redis")


def test_scripts_are_loaded_again_after_script_flush(redis_client: Any) -> None:
    """S1: after SCRIPT FLUSH (or a server restart) the next decision loads its script and
    answers; nothing is left unlocked or double-locked."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        key = jobs.unique_sleep.job_key((1,), {})
        first = uuid()
        assert store.acquire(key, first, 60, now=clock.now()).acquired
        redis_client.script_flush()
        second = store.acquire(key, uuid(), 60, now=clock.now())
        assert not second.acquired and second.holder == first
        redis_client.script_flush()
        assert store.release(key, first)
        assert store.get(key) is None


def test_a_killed_connection_is_replaced(redis_client: Any) -> None:
    """S1: when the server drops the store's connections, the next decision reconnects and
    answers instead of failing or reusing a broken connection."""
    with override_settings(DEDUP_JOBS={"STORE": "redis"}):
        store = _store()
        key = jobs.unique_sleep.job_key((2,), {})
        owner = uuid()
        assert store.acquire(key, owner, 60, now=clock.now()).acquired
        redis_client.client_kill_filter(_id=store.client.client_id())  # the pooled one
        again = store.acquire(key, uuid(), 60, now=clock.now())
        assert not again.acquired and again.holder == owner
        redis_client.client_kill_filter(_id=store.client.client_id())
        assert store.release(key, owner)
        assert store.get(key) is None
