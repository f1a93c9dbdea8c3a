"""S8 on a real server that stops answering: no store call waits longer than
``DEDUP_JOBS["STORE_TIMEOUT"]``, also when the cache itself sets no socket timeout at all (a
cache with no OPTIONS: its own calls would wait forever) — on django-redis, on Django's own
RedisCache and on django-valkey with a real Valkey server."""

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
from tests.faults.servers import RedisServer, paused, redis_server, valkey_server_binary

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
    check_silent(caches, stall=None if fault == "blackhole" else private_redis,
                 proxy=store_proxy if fault == "blackhole" else None)


#: Django's own RedisCache and django-valkey's ValkeyCache: (BACKEND, LOCATION scheme)
OTHER_BACKENDS = {
    "django-cache-redis": ("django.core.cache.backends.redis.RedisCache", "redis"),
    "django-valkey": ("django_valkey.cache.ValkeyCache", "valkey"),
}


@pytest.mark.parametrize("backend", sorted(OTHER_BACKENDS))
def test_a_stopped_server_fails_within_store_timeout_on_every_backend(backend: str) -> None:
    """S1/S8/S4: the same on Django's own RedisCache (on a private redis-server) and on
    django-valkey (on a private valkey-server), neither with a socket timeout of its own:
    with the server stopped (SIGSTOP) every decision raises StoreUnavailable within
    STORE_TIMEOUT."""
    path, scheme = OTHER_BACKENDS[backend]
    binary = valkey_server_binary() if scheme == "valkey" else None
    with redis_server(binary=binary) as server:
        location = f"{scheme}://{server.host}:{server.port}/0"
        check_silent({**settings.CACHES, "silent": {"BACKEND": path, "LOCATION": location}},
                     stall=server, proxy=None, wait_for_end=False)


def check_silent(caches: dict[str, Any], *, stall: RedisServer | None,
                 proxy: Proxy | None, wait_for_end: bool = True) -> None:
    """Every call of CALLS on the "silent" alias of ``caches`` fails within STORE_TIMEOUT
    once ``stall`` is SIGSTOPped (or ``proxy`` swallows every reply). ``wait_for_end=False``:
    a server the caller stops right after is not waited for (its SIGCONT comes with its
    SIGTERM)."""
    options = {**settings.DEDUP_JOBS, "STORE": "silent", "STORE_TIMEOUT": STORE_TIMEOUT}
    with override_settings(CACHES=caches, DEDUP_JOBS=options):
        store = get_store("silent")
        key = jobs.unique_sleep.job_key((5,), {})
        assert store.get(key) is None  # connected, and the store answers
        paused_for = None
        if proxy is not None:
            proxy.blackhole()
        else:
            assert stall is not None
            paused_for = paused(stall, len(CALLS) * (STORE_TIMEOUT + SLACK) + 1)
        try:
            for name, call in CALLS.items():
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    call(store, key)
                took = time.monotonic() - started
                assert took < STORE_TIMEOUT + SLACK, f"{name} waited {took:.2f}s"
        finally:
            if paused_for is not None and wait_for_end:
                paused_for.wait()
            if proxy is not None:
                proxy.pass_through()


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
