"""S3 / SPEC section 8: statements per decision of the database store, on each database.

PostgreSQL and SQLite: counted by Django (every statement the store sends). MariaDB: counted
by the server (the session's ``Questions`` status: every statement the client sent, the
driver's ``SET autocommit`` and ``COMMIT`` included). "mariadb-as-mysql" runs MySQL 8's form
(no ``RETURNING``: the upsert and a read of its row in one transaction) on MariaDB."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import CLAIMED, Renewed, encode_call
from dedup_jobs.stores.database import statements
from tests import jobs

DATABASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mariadb", marks=pytest.mark.mariadb, id="mariadb"),
    pytest.param("mariadb-as-mysql", marks=pytest.mark.mariadb, id="mariadb-as-mysql"),
]
#: statements of one decision, by database (MySQL 8: SET autocommit=0, INSERT … ON DUPLICATE
#: KEY UPDATE, SELECT, COMMIT, SET autocommit=1)
EXPECTED = {"default": 1, "postgres": 1, "mariadb": 1, "mariadb-as-mysql": 5}
#: the claim on MariaDB and MySQL 8, which have no ``UPDATE … RETURNING`` to move the claimed
#: row to its claim record (S7) in one statement: SET autocommit=0, SELECT … FOR UPDATE,
#: UPDATE, COMMIT, SET autocommit=1
MYSQL_CLAIM = 5


@pytest.fixture(params=DATABASES)
def database(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name: str = request.param
    alias = name.removesuffix("-as-mysql")
    if name.endswith("-as-mysql"):
        monkeypatch.setattr(statements, "dialect", lambda connection: "duplicate_key_read")
    dedup = {**settings.DEDUP_JOBS, "STORE": "database", "DATABASE_ALIAS": alias}
    with override_settings(DEDUP_JOBS=dedup):
        yield name


def count(database: str, action: Callable[[], Any]) -> tuple[int, Any]:
    """Statements the store sent during ``action``, and what it returned."""
    alias = database.removesuffix("-as-mysql")
    connection = connections[alias]
    if connection.vendor != "mysql":
        with CaptureQueriesContext(connection) as queries:
            result = action()
        return len(queries), result

    def questions() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
            return int(cursor.fetchone()[1])

    before = questions()
    result = action()
    return questions() - before - 1, result  # less the SHOW of the second reading


def test_one_statement_per_decision(database: str) -> None:
    """S3 / section 8: on PostgreSQL, SQLite and MariaDB, acquire (free and duplicate), the
    worker start, renew, release and a debounced dispatch (first and absorbed) are one
    statement each, and on PostgreSQL and SQLite the claim of a due burst too; on MySQL 8's
    form each is one transaction of five, as the claim on MariaDB is."""
    store = get_store("database")
    key = jobs.unique_sleep.job_key((1,), {})
    store.acquire(jobs.unique_sleep.job_key(("warm",), {}), "warm", 60, now=clock.now())
    expected = EXPECTED[database]
    figures: dict[str, int] = {}

    def measure(name: str, action: Callable[[], Any]) -> Any:
        figures[name], result = count(database, action)
        return result

    assert measure("acquire", lambda: store.acquire(key, "a", 60, now=clock.now())).acquired
    duplicate = measure("duplicate", lambda: store.acquire(key, "b", 60, now=clock.now()))
    assert (duplicate.acquired, duplicate.holder) == (False, "a")
    started = measure("start", lambda: store.start(key, "a", 30, now=clock.now(),
                                                   release=False, delivery="d1"))
    assert started.run and not started.took
    renewed = measure("renew", lambda: store.renew(key, "a", 30, now=clock.now(), delivery="d1"))
    assert renewed == Renewed(held=True)
    assert measure("release", lambda: store.release(key, "a")) is True
    burst = build_key("debounce", "tests.statements", "item=1")

    def dispatch(task_id: str, now: float) -> Any:
        return store.debounce(burst, task_id, encode_call([1], {}), now=now, debounce_for=1.0,
                              max_wait=None, ttl=60.0)

    assert measure("debounce first", lambda: dispatch("m1", clock.now())).new
    assert not measure("debounce absorbed", lambda: dispatch("m2", clock.now())).new
    claimed = measure("claim", lambda: store.claim_due(burst, "m1", now=clock.now() + 5))
    assert claimed.action == CLAIMED and claimed.absorbed == ("m1", "m2")
    print(f"S3 statements per decision on {database}: {figures}")
    claim = MYSQL_CLAIM if database.startswith("mariadb") else expected
    assert figures == {
        "acquire": expected, "duplicate": expected, "start": expected, "renew": 1,
        "release": 1, "debounce first": expected, "debounce absorbed": expected,
        "claim": claim,
    }
