"""S8 on a real server that stops answering: no store call waits longer than
``DEDUP_JOBS["STORE_TIMEOUT"]``, also when the cache itself sets no socket timeout at all (a
django-redis cache with no OPTIONS: its own calls would wait forever)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores import get_store
from tests import jobs
from tests.faults.proxy import Proxy
from tests.faults.servers import RedisServer, paused

pytestmark = [pytest.mark.redis]

STORE_TIMEOUT = 1.0
#: scheduling and connection set-up on a loaded 2-core machine
SLACK = 0.5


@pytest.mark.parametrize("fault", ["sigstop", "blackhole"])
def test_a_silent_store_fails_within_store_timeout(
    private_redis: RedisServer, store_proxy: Proxy, fault: str
) -> None:
    """S8/S4/W4: with the server stopped (SIGSTOP) or its replies never coming (a proxy that
    swallows them), every decision — dispatch, worker start, release, renew, a read — raises
    StoreUnavailable within STORE_TIMEOUT, though the cache sets no socket timeout."""
    location = store_proxy.url(0) if fault == "blackhole" else private_redis.url(0)
    caches = {**settings.CACHES,
              "silent": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location}}
    options = {**settings.DEDUP_JOBS, "STORE": "silent", "STORE_TIMEOUT": STORE_TIMEOUT}
    with override_settings(CACHES=caches, DEDUP_JOBS=options):
        store = get_store("silent")
        key = jobs.unique_sleep.job_key((5,), {})
        assert store.get(key) is None  # connected, and the store answers
        stall = None
        if fault == "blackhole":
            store_proxy.blackhole()
        else:
            stall = paused(private_redis, len(CALLS) * (STORE_TIMEOUT + SLACK) + 1)
        try:
            for name, call in CALLS.items():
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    call(store, key)
                took = time.monotonic() - started
                assert took < STORE_TIMEOUT + SLACK, f"{name} waited {took:.2f}s"
        finally:
            if stall is not None:
                stall.wait()
            store_proxy.pass_through()


def _dispatch(store: Any, key: Any) -> Any:
    return jobs.unique_sleep.delay(5)


CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "dispatch": _dispatch,
    "start": lambda store, key: store.start(key, "a", 30, now=clock.now(), release=False,
                                            delivery="d1"),
    "release": lambda store, key: store.release(key, "a"),
    "renew": lambda store, key: store.renew(key, "a", 30, now=clock.now()),
    "get": lambda store, key: store.get(key),
}
