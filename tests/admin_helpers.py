"""Users and locks for the admin tests (shared by the client and browser tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store

PASSWORD = "pw-ops-tests"


def make_user(username: str, *perms: str, staff: bool = True) -> User:
    """A user with the given ``dedup_jobs`` permission codenames (e.g. "view_joblock")."""
    user = User.objects.create_user(username, password=PASSWORD, is_staff=staff)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="dedup_jobs", codename=codename)
        )
    return user


def fill(
    alias: str, count: int, *, task: str = "tests.unique_sleep", ttl: float = 600
) -> list[Any]:
    """``count`` queued locks taken directly in the store (owner "owner-<i>")."""
    store = get_store(alias)
    keys = []
    now = clock.now()
    for i in range(count):
        key = build_key("unique", task, f"item={i}")
        assert store.acquire(key, f"owner-{i}", ttl, now=now).acquired
        keys.append(key)
    return keys


def unreachable_redis() -> dict[str, Any]:
    """CACHES with the "redis" alias pointing at a port where nothing listens."""
    dead = {"LOCATION": "redis://127.0.0.1:1/0", "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5}}
    return {**settings.CACHES, "redis": {**settings.CACHES["redis"], **dead}}


TX = pytest.mark.django_db(transaction=True)
TX_PG = pytest.mark.django_db(databases=["default", "postgres"], transaction=True)
TX_MARIADB = pytest.mark.django_db(databases=["default", "mariadb"], transaction=True)


#: the stores that can list: django-redis, the database store on SQLite, PostgreSQL, MariaDB
MAIN_LISTED = [
    pytest.param("redis", marks=[pytest.mark.redis, TX], id="django-redis"),
    pytest.param("database", marks=TX, id="database-sqlite"),
    pytest.param(
        "database-postgres", marks=[pytest.mark.postgres, TX_PG], id="database-postgres"
    ),
    pytest.param(
        "database-mariadb", marks=[pytest.mark.mariadb, TX_MARIADB], id="database-mariadb"
    ),
]
#: ... and the other Redis-protocol backends (S1): Django's own RedisCache, django-valkey
ALL_LISTED = [
    *MAIN_LISTED[:1],
    pytest.param("djredis", marks=[pytest.mark.redis, TX], id="django-cache-redis"),
    pytest.param("valkey", marks=[pytest.mark.redis, pytest.mark.valkey, TX], id="django-valkey"),
    *MAIN_LISTED[1:],
]


def listed_store_fixture(params: list[Any]) -> Any:
    """A ``listed_store`` fixture over ``params``: yields the store alias, made
    DEDUP_JOBS["STORE"]."""

    @pytest.fixture(params=params)
    def listed_store(request: pytest.FixtureRequest) -> Iterator[str]:
        from tests.conftest import database_alias

        alias = "database" if request.param.startswith("database") else request.param
        using = database_alias(request.param)
        with override_settings(
            DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": alias, "DATABASE_ALIAS": using}
        ):
            yield alias

    return listed_store


#: The stores that can list: the Redis-protocol ones (their index: django-redis, Django's own
#: RedisCache, django-valkey on Valkey) and the database store (SQLite, PostgreSQL, MariaDB).
listed_store = listed_store_fixture(ALL_LISTED)
#: For the tests that run real workers (tests/test_clear_stale_locks.py): django-redis and
#: SQLite in `uv run pytest`, the other listed stores in the slow store matrix (`-m matrix`).
WORKER_LISTED = [
    p if str(p.id) in ("django-redis", "database-sqlite")
    else pytest.param(*p.values, marks=[*p.marks, pytest.mark.matrix], id=p.id)
    for p in ALL_LISTED
]
listed_store_workers = listed_store_fixture(WORKER_LISTED)
#: The same without the Redis-family variants, for the admin's page-number matrix
#: (tests/test_bad_input.py), whose Redis path is the same code on every Redis backend.
listed_store_main = listed_store_fixture(MAIN_LISTED)
