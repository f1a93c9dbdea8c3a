"""The admin's *Throttles* page (T5) through Django's test client: permissions, the columns
(job, throttle id, limit, running now, starts in the current window, deferred), search,
pagination, and a page read at 100,000 throttle keys (Redis and the database store on
PostgreSQL, in the slow matrix: uv run pytest -m matrix)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.test import Client, override_settings

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.database.models import ThrottleKey
from tests.admin_helpers import PASSWORD, TX, TX_PG, make_user

THROTTLES = "/admin/dedup_jobs/throttlekey/"
STORES = [
    pytest.param("redis", marks=[pytest.mark.redis, TX], id="django-redis"),
    pytest.param("database", marks=TX, id="database-sqlite"),
]


def login(username: str, *perms: str) -> Client:
    make_user(username, *perms)
    client = Client()
    assert client.login(username=username, password=PASSWORD)
    return client


def settings_for(store: str) -> dict[str, Any]:
    return {"STORE": store, "DATABASE_ALIAS": "default"}


def rows(html: str) -> list[list[str]]:
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in html else ""
    return [[re.sub(r"<[^>]+>", "", cell).strip()
             for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


@pytest.mark.django_db
def test_staff_without_view_permission_is_refused() -> None:
    """T5 / A1: the page needs the view permission (of held locks, or of throttles)."""
    assert login("staff").get(THROTTLES).status_code == 403
    assert login("viewer", "view_throttlekey").get(THROTTLES).status_code == 200


@pytest.mark.parametrize("store", STORES)
def test_throttles_page_columns_and_search(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """T5: one key of each kind of limit; the row shows job, throttle id, limit, running
    now (slots held), starts in the current window and deferred messages; the search matches
    the job or the id, case-insensitively; the job filter narrows. The page is read at the
    time of the admissions (the clock seam): a waiter's planned turn is a moment away, and a
    page read after it (a loaded machine) no longer counts it as deferred."""
    client = login("ops", "view_joblock")
    with override_settings(DEDUP_JOBS=settings_for(store)):
        s = get_store(store)
        hot = build_key("throttle", "shop.push_order", "account=Émile")
        for owner in ("a", "b", "c"):
            s.throttle_admit(hot, owner, delivery=f"d-{owner}", concurrency=2,
                             rate_limit=0, rate_period=1.0, lease=60)
        rated = build_key("throttle", "shop.sync", "shop.sync")
        for owner in ("x", "y", "z"):
            s.throttle_admit(rated, owner, delivery=f"d-{owner}", concurrency=0,
                             rate_limit=2, rate_period=60.0, lease=60)
        admitted = clock.now()
        monkeypatch.setattr("dedup_jobs.clock.now", lambda: admitted)
        page = client.get(THROTTLES, {"store": store}).content.decode()
        found = {row[0]: row for row in rows(page)}
        assert found["shop.push_order"] == ["shop.push_order", "account=Émile",
                                            "concurrency 2", "2", "0", "1"]
        assert found["shop.sync"] == ["shop.sync", "shop.sync", "2/m", "0", "2", "1"]
        searched = rows(client.get(THROTTLES, {"store": store, "q": "émile"}).content.decode())
        assert [row[0] for row in searched] == ["shop.push_order"]
        by_job = rows(client.get(THROTTLES, {"store": store, "job": "shop.sync"}).content
                      .decode())
        assert [row[0] for row in by_job] == ["shop.sync"]


def _fill_redis(count: int) -> None:
    """``count`` throttle keys, each admitted once, through the store's own script in
    pipelined batches (the layout is the script's, not a copy of it)."""
    from dedup_jobs.stores.redis import scripts

    s: Any = get_store("redis")
    client = s.client
    sha = client.script_load(scripts.THROTTLE_ADMIT)
    for start in range(0, count, 5000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(count, start + 5000)):
            key = build_key("throttle", "shop.bulk", f"tenant={i}")
            keys = s._throttle_keys(key)
            pipe.evalsha(sha, len(keys), *keys, *s.admit_arguments(
                key, f"o{i}", delivery=f"d{i}", concurrency=2, rate_limit=0, rate_period=1.0,
                lease=60.0, deadline_ms=0))
        pipe.execute()


@pytest.mark.redis
@pytest.mark.matrix
@TX
def test_throttles_page_at_100000_keys_on_redis() -> None:
    """T5: 100,000 throttle keys on Redis: the first page, a later page and a search each
    answer (200) with a full page of 100 rows and the total, without KEYS (the index is
    paged); the times are printed, not asserted."""
    with override_settings(DEDUP_JOBS=settings_for("redis")):
        _fill_redis(100_000)
        client = login("ops", "view_joblock")
        for params in ({}, {"p": 500}, {"q": "tenant=9999"}):
            began = time.monotonic()
            response = client.get(THROTTLES, {"store": "redis", **params})
            took = time.monotonic() - began
            assert response.status_code == 200
            html = response.content.decode()
            print(f"{params or 'first page'}: {took:.2f}s")
            if "q" in params:
                assert {row[1] for row in rows(html)} >= {"tenant=9999"}
            else:
                assert len(rows(html)) == 100 and "100000" in html.replace(",", "")


@pytest.mark.postgres
@pytest.mark.matrix
@TX_PG
def test_throttles_page_at_100000_keys_on_postgres() -> None:
    """T5: 100,000 throttle keys in the database store on PostgreSQL: pages and a search
    answer with a full page and the total (two indexed queries, the counts in one grouped
    query)."""
    from datetime import timedelta

    from django.utils import timezone

    with override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": "postgres"}):
        later = timezone.now() + timedelta(hours=1)
        ThrottleKey.objects.using("postgres").bulk_create(
            [ThrottleKey(key=f"dedup_jobs:throttle:shop.bulk:tenant={i}", task_name="shop.bulk",
                         ident=f"tenant={i}", limit="concurrency 2", expires_at=later)
             for i in range(100_000)], batch_size=5000)
        client = login("ops", "view_joblock")
        for params in ({}, {"p": 500}, {"q": "tenant=9999"}):
            response = client.get(THROTTLES, {"store": "database", **params})
            assert response.status_code == 200
            html = response.content.decode()
            if "q" in params:
                assert {row[1] for row in rows(html)} >= {"tenant=9999"}
            else:
                assert len(rows(html)) == 100 and "100000" in html.replace(",", "")
