"""The stores at their edges: lifetimes memcached cannot count (over 30 days it reads a Unix
time, in 32 bits), ids whose keys a cache cannot hold (memcached's 250 bytes, not characters;
the longest key a lock writes; Django's database cache's 255-character column on PostgreSQL
and MariaDB), refused by name rather than failing as an outage. From a red-team of the
stores; each test failed before its fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.conf import MAX_SECONDS
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey, build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import encode_call
from tests.memcached_server import MemcachedServer
from tests.test_bad_input import memcached as memcached  # a fixture
from tests.test_bad_input import queued, raw_debounce_id, raw_unique_id

DAY = 86400
TTLS = [pytest.param(40 * DAY, id="40d"), pytest.param(10 * 365 * DAY, id="10y"),
        pytest.param(12 * 365 * DAY, id="12y"), pytest.param(MAX_SECONDS, id="100y")]


@pytest.fixture(params=["memcached", "locmem-rt", "file-rt"])
def cache_store(request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.param
    caches: dict[str, Any] = dict(settings.CACHES)
    if name == "memcached":
        server: MemcachedServer = request.getfixturevalue("memcached_server")
        server.flush()
        caches["memcached"] = server.cache()
    elif name == "locmem-rt":
        caches[name] = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                        "LOCATION": "rt"}
    else:
        import tempfile
        caches[name] = {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                        "LOCATION": tempfile.mkdtemp(prefix="rt-st-file-")}
    with override_settings(CACHES=caches,
                           DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": name}):
        from django.core.cache import caches as live
        live[name].clear()
        yield name


def key(ident: str = "x", task: str = "tests.rt.job") -> JobKey:
    return build_key("unique", task, ident)


@pytest.mark.parametrize("ttl", TTLS)
def test_long_unique_for_lock_is_held(cache_store: str, ttl: float) -> None:
    assert_held(cache_store, ttl)


def assert_held(alias: str, ttl: float) -> None:
    """A lock of ``ttl`` seconds on store ``alias`` is there, and held against another."""
    store = get_store(alias)
    k = key()
    now = clock.now()
    assert store.acquire(k, "a", ttl, now=now).acquired
    assert store.get(k) is not None, "lock gone right after acquire"
    second = store.acquire(k, "b", ttl, now=now)
    assert not second.acquired and second.holder == "a"


@pytest.mark.parametrize("ttl", TTLS)
def test_long_debounce_state_is_kept(cache_store: str, ttl: float) -> None:
    store = get_store(cache_store)
    k = build_key("debounce", "tests.rt.job", "x")
    now = clock.now()
    first = store.debounce(k, "m1", encode_call((1,), {}), now=now, debounce_for=ttl,
                           max_wait=None, ttl=60)
    assert first.new
    assert store.get_debounce(k) is not None, "debounce state gone right after dispatch"
    second = store.debounce(k, "m2", encode_call((2,), {}), now=now, debounce_for=ttl,
                            max_wait=None, ttl=60)
    assert not second.new and second.superseded == "m1"


@pytest.fixture(params=["default", "postgres", "mariadb"])
def dbcache_store(request: pytest.FixtureRequest) -> Iterator[str]:
    from django.core.cache import caches as live
    from django.core.management import call_command

    db = request.param
    name = f"dbcache-{db}"
    caches: dict[str, Any] = dict(settings.CACHES)
    caches[name] = {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                    "LOCATION": "rt_st_cache"}
    with override_settings(CACHES=caches,
                           DATABASE_ROUTERS=[f"tests.test_store_edges.Router{db.title()}"],
                           DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": name}):
        call_command("createcachetable", database=db, verbosity=0)
        live[name].clear()
        yield name


class _Router:
    db = "default"

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self.db if model._meta.app_label == "django_cache" else None

    db_for_write = db_for_read

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return db == self.db if app_label == "django_cache" else None


class RouterDefault(_Router):
    db = "default"


class RouterPostgres(_Router):
    db = "postgres"


class RouterMariadb(_Router):
    db = "mariadb"


@pytest.mark.django_db(databases=["default", "postgres", "mariadb"], transaction=True)
@pytest.mark.parametrize("ttl", TTLS)
def test_dbcache_long_lock(dbcache_store: str, ttl: float) -> None:
    assert_held(dbcache_store, ttl)


@pytest.mark.parametrize("cache_store", ["memcached"], indirect=True)
def test_memcached_non_ascii_id_fits_or_is_refused(cache_store: str) -> None:
    """A4: an id of 150 'é' (150 characters, 300 UTF-8 bytes; under MAX_ID_LENGTH, so not
    hashed): either key_problem names it, or the store holds the lock. Never
    StoreUnavailable."""
    store = get_store(cache_store)
    assert "250 bytes" in str(store.key_problem(key("é" * 150)))
    k = key("é" * 50)  # 100 bytes: fits
    assert store.key_problem(k) is None
    assert store.acquire(k, "a", 60, now=clock.now()).acquired
    assert store.get(k) is not None


LONG_TASK = "tests.rt." + "n" * 100


def _id_filling(store: Any, kind: str, room: int = 0) -> str:
    """An ASCII id (under MAX_ID_LENGTH) that makes the cache key of kind exactly 250 - room."""
    from django.core.cache import caches as live

    base = len(live[store.alias].make_key(build_key(kind, LONG_TASK, "").key))
    return "i" * (250 - room - base)


@pytest.mark.parametrize("cache_store", ["memcached"], indirect=True)
def test_memcached_unique_id_at_250_bytes_release(cache_store: str) -> None:
    """A4: the longest id key_problem lets through can be locked and released (release's
    tombstone '{key}:rel' and the running marker's undo '{key}:run:undo' are longer than
    the lock's key: the lock was deleted, then the tombstone raised InvalidCacheKey); one
    character more is refused by name."""
    store = get_store(cache_store)
    ident = _id_filling(store, "unique", room=len(":run:undo"))
    assert len(ident) <= 200
    k = key(ident, LONG_TASK)
    assert store.key_problem(k) is None
    assert store.acquire(k, "a", 60, now=clock.now()).acquired
    assert store.release(k, "a") is True
    assert "memcached" in str(store.key_problem(key(ident + "i", LONG_TASK)))


@pytest.mark.parametrize("cache_store", ["memcached"], indirect=True)
def test_memcached_debounce_explicit_long_task_id_is_refused_by_name(cache_store: str) -> None:
    """A4: a debounce id checked with a generated (36-character) message id, dispatched with
    an explicit task_id of 60 characters (apply_async(task_id=...)), whose burst's keys
    memcached cannot hold: InvalidJobId naming the task id, nothing written (it was a bare
    InvalidCacheKey from the cache)."""
    from dedup_jobs.exceptions import InvalidJobId

    store = get_store(cache_store)
    k = build_key("debounce", "tests.rt.job", "d" * 150)
    assert store.key_problem(k) is None
    with pytest.raises(InvalidJobId, match=r"task_id=.*'t{60}'"):
        store.debounce(k, "t" * 60, encode_call((1,), {}), now=clock.now(),
                       debounce_for=5, max_wait=None, ttl=60)
    assert store.get_debounce(k) is None
    assert store.debounce(k, "u" * 36, encode_call((1,), {}), now=clock.now(),
                          debounce_for=5, max_wait=None, ttl=60).new


@pytest.mark.django_db(databases=["default", "postgres", "mariadb"], transaction=True)
def test_dbcache_long_key(dbcache_store: str) -> None:
    """A4 on Django's database cache (cache_key varchar(255)): a 200-character id of a job
    with a 109-character name: refused by name (key_problem) or held."""
    store = get_store(dbcache_store)
    assert "255 characters" in str(store.key_problem(key("i" * 200, LONG_TASK)))
    k = key("i" * 100, LONG_TASK)
    assert store.key_problem(k) is None
    assert store.acquire(k, "a", 60, now=clock.now()).acquired
    assert store.get(k) is not None


def on_memcached(location: str, **dedup: Any) -> Any:
    """Settings whose store "mc" is the memcached at ``location``."""
    cache = {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
             "LOCATION": location}
    return override_settings(CACHES={**settings.CACHES, "mc": cache},
                             DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "mc", **dedup})


@pytest.mark.parametrize("job", ["unique", "debounce"])
def test_non_ascii_id_over_250_bytes_on_memcached(app: Any, memcached: str, job: str) -> None:
    """A4: an id of 150 'é' (under MAX_ID_LENGTH = 200 characters, 300 bytes in UTF-8) is a
    key memcached cannot hold: refused by name (a ValueError); never StoreUnavailable,
    and never published without a lock under ON_STORE_ERROR = "enqueue"."""
    task = raw_unique_id if job == "unique" else raw_debounce_id
    with on_memcached(memcached, ON_STORE_ERROR="enqueue"):
        with pytest.raises(ValueError, match="250 bytes") as refused:
            task.delay("é" * 150)
        assert not isinstance(refused.value, StoreUnavailable)
        assert queued(app) == 0


def test_unique_for_20_years_on_memcached(app: Any, memcached: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """U1/U2 with unique_for = 20 years (under the 100-year cap): the second dispatch of the
    same id is deduplicated."""
    monkeypatch.setattr(type(raw_unique_id), "unique_for", 20 * 365 * 86400)
    with on_memcached(memcached):
        first = raw_unique_id.delay("k1")
        second = raw_unique_id.delay("k1")
        assert second.deduplicated, (first.id, second.id)
        assert queued(app) == 1
