"""Fixtures: real services (skip with a reason naming the service, or fail when
DEDUP_JOBS_REQUIRE_SERVICES=1), stores, and a real Celery worker."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import override_settings

from tests.celery_app import app as celery_app

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


@pytest.fixture(autouse=True)
def _services(request: pytest.FixtureRequest) -> None:
    for name in SERVICES:
        if request.node.get_closest_marker(name):
            need(name)


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
def _clean_redis(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with empty lock, broker, result and run-record databases."""
    if service_up("redis"):
        import redis

        for db in (9, 10, 11, 12):
            redis.Redis.from_url(f"{settings.REDIS_URL}/{db}").flushdb()
    from django.core.cache import caches

    from dedup_jobs.stores import _stores

    for alias in ("default", "locmem"):
        caches[alias].clear()
    _stores.clear()
    yield
    _stores.clear()


STORE_PARAMS = [
    pytest.param("redis", marks=pytest.mark.redis, id="django-redis"),
    pytest.param("locmem", id="locmem"),
    pytest.param("database", id="database-sqlite"),
    pytest.param("database-postgres", marks=pytest.mark.postgres, id="database-postgres"),
    pytest.param("database-mariadb", marks=pytest.mark.mariadb, id="database-mariadb"),
]
#: the database store on each database the suite runs (for tests of the database store alone)
DATABASE_STORE_PARAMS = [p for p in STORE_PARAMS if str(p.values[0]).startswith("database")]


def database_alias(store_name: str) -> str:
    """The DATABASES alias a ``store_name`` param puts the database store on."""
    return {"database-postgres": "postgres", "database-mariadb": "mariadb"}.get(
        store_name, "default")


def _store_settings(name: str) -> dict[str, Any]:
    if name.startswith("database"):
        return {"STORE": "database", "DATABASE_ALIAS": database_alias(name)}
    return {"STORE": name, "DATABASE_ALIAS": "default"}


@pytest.fixture(params=STORE_PARAMS)
def store_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every job test runs on every store: django-redis (real Redis), locmem, the database
    store on SQLite, on the real PostgreSQL and on the real MariaDB."""
    name: str = request.param
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, **_store_settings(name)}):
        yield name


@pytest.fixture
def app() -> Any:
    return celery_app
