"""S1 on every Redis-protocol Django cache backend: django-redis, Django's own
``django.core.cache.backends.redis.RedisCache`` and django-valkey's ``ValkeyCache`` (on a real
Valkey server) all get the Redis store (Lua, indexes, listing), with the cache's own key
function; a store outage on any of them is StoreUnavailable at dispatch (S4) and "run with a
WARNING" at the worker (W4); Django's private client accessor, if a future Django changes it,
falls back loudly (a log WARNING and the system check W006), never silently."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import kombu
import pytest
from django.conf import settings
from django.test import Client, override_settings

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store, store_class_for
from dedup_jobs.stores.redis import RedisStore
from dedup_jobs.stores.redis import scripts as lua
from tests import jobs
from tests.admin_helpers import PASSWORD, make_user
from tests.conftest import server_client_of
from tests.test_stores import MEMORY
from tests.workers import thread_worker

BACKENDS = {
    "redis": "django_redis.cache.RedisCache",
    "djredis": "django.core.cache.backends.redis.RedisCache",
    "valkey": "django_valkey.cache.ValkeyCache",
}


def test_every_redis_family_backend_gets_the_redis_store(family_store: str) -> None:
    """S1: django-redis, Django's own RedisCache and django-valkey resolve to the Redis store
    (Lua scripts, index, listing), not the generic cache store."""
    assert settings.CACHES[family_store]["BACKEND"] == BACKENDS[family_store]
    assert store_class_for(family_store) is RedisStore
    store = get_store(family_store)
    assert isinstance(store, RedisStore) and store.can_list


def key_function(key: str, key_prefix: str, version: int) -> str:
    """A project's own KEY_FUNCTION (S1: the cache's key function applies)."""
    return f"kf|{key_prefix}|v{version}|{key}"


def test_the_caches_key_function_prefix_and_version_apply(
    family_store: str, server_client: Any
) -> None:
    """S1: the lock and its index live at the keys the cache's own KEY_FUNCTION, KEY_PREFIX
    and VERSION make, on every Redis-protocol backend."""
    custom = {**settings.CACHES[family_store], "KEY_PREFIX": "kp", "VERSION": 7,
              "KEY_FUNCTION": "tests.test_redis_family.key_function"}
    with override_settings(CACHES={**settings.CACHES, family_store: custom}):
        store = get_store(family_store)
        key = jobs.unique_sleep.job_key((1,), {})
        assert store.acquire(key, "owner-kf", 60, now=clock.now()).acquired
        physical = f"kf|kp|v7|{key.key}"
        assert server_client.hget(physical, "owner") == b"owner-kf"
        index = f"kf|kp|v7|{settings.DEDUP_JOBS.get('KEY_PREFIX', 'dedup_jobs')}:index:unique"
        assert server_client.zscore(index, physical) is not None
        assert [lock.owner for lock in store.iter_locks()] == ["owner-kf"]
        assert store.release(key, "owner-kf")


def _dead(alias: str) -> dict[str, Any]:
    """CACHES[alias] of the same backend, at a port where nothing listens."""
    scheme = "valkey" if alias == "valkey" else "redis"
    options = ({"socket_connect_timeout": 0.3, "socket_timeout": 0.3} if alias == "djredis"
               else {"SOCKET_CONNECT_TIMEOUT": 0.3, "SOCKET_TIMEOUT": 0.3})
    return {"BACKEND": BACKENDS[alias], "LOCATION": f"{scheme}://127.0.0.1:1/0",
            "OPTIONS": options}


class _Records(logging.Handler):
    """The dedup_jobs logger's records, also those of a worker thread (Celery's worker set-up
    rearranges the root logger's handlers, pytest's among them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.worker
def test_an_outage_is_store_unavailable_and_the_worker_runs_with_a_warning(
    app: Any, family_store: str
) -> None:
    """S1/S4/W4 on every Redis-protocol backend, its server down: a dispatch raises
    StoreUnavailable (nothing published); with ON_STORE_ERROR="enqueue" it publishes with a
    warning; the worker, finding the store down, runs the job and logs a WARNING naming the
    task and its id."""
    caches = {**settings.CACHES, "dead": _dead(family_store)}
    dedup = {**settings.DEDUP_JOBS, "STORE": "dead"}
    with override_settings(CACHES=caches, DEDUP_JOBS=dedup):
        assert isinstance(get_store("dead"), RedisStore)
        with pytest.raises(StoreUnavailable, match="'dead' is unavailable"):
            jobs.unique_sleep.delay(5)
    handler = _Records()
    logging.getLogger("dedup_jobs").addHandler(handler)
    try:
        with override_settings(CACHES=caches,
                               DEDUP_JOBS={**dedup, "ON_STORE_ERROR": "enqueue"}):
            result = jobs.unique_sleep.delay(6)
            assert result.deduplicated is False
            with thread_worker(app):
                assert result.get(timeout=20) == 6
    finally:
        logging.getLogger("dedup_jobs").removeHandler(handler)
    assert jobs.runs("unique_sleep") == ["6"]
    messages = [r.getMessage() for r in handler.records if r.levelno == logging.WARNING]
    assert any("without a lock" in m and result.id in m for m in messages), messages
    assert any(f"tests.unique_sleep[{result.id}]: store 'dead' unavailable at the worker"
               in m for m in messages), messages


def test_a_future_django_without_the_client_accessor_falls_back_loudly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """S1/A3: if Django's RedisCache no longer has ``_cache.get_client(key, write=True)``, the
    alias falls back to the generic cache store with a WARNING naming the backend, and the
    system check dedup_jobs.W006 says what that costs and what to do; never silently."""
    from django.core.cache.backends.redis import RedisCacheClient

    from dedup_jobs.checks import check_stores
    from dedup_jobs.stores.cache import CacheStore

    monkeypatch.delattr(RedisCacheClient, "get_client")
    with (
        override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "djredis"}),
        caplog.at_level(logging.WARNING, logger="dedup_jobs"),
    ):
        assert store_class_for("djredis") is CacheStore
        found = [m for m in check_stores() if m.id == "dedup_jobs.W006"]
    assert any("django.core.cache.backends.redis.RedisCache" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)
    assert len(found) == 1
    assert "django.core.cache.backends.redis.RedisCache" in found[0].msg
    assert "get_client" in found[0].msg and "django-redis" in (found[0].hint or "")


def test_the_client_accessor_passes_the_check(family_store: str) -> None:
    """A3: on today's Django, django-redis and django-valkey no W006 fires."""
    from dedup_jobs.checks import check_stores

    assert not [m for m in check_stores() if m.id == "dedup_jobs.W006"]


# -- 10,000 held locks in the admin -----------------------------------------------------

LOCKS = "/admin/dedup_jobs/joblock/"
MANY = 10_000


def fill_many(alias: str, count: int) -> None:
    """``count`` held locks through the store's own ACQUIRE script, pipelined."""
    store: Any = get_store(alias)
    script = store.client.register_script(lua.ACQUIRE)
    deadline = int((clock.now() + 600) * 1000)
    pipe = store.client.pipeline(transaction=False)
    for i in range(count):
        key = build_key("unique", "tests.unique_sleep", f"item={i}")
        script(keys=[store.physical(key.key), store.index_key()],
               args=[f"owner-{i}", 600_000, deadline, "0", key.task_name, key.ident],
               client=pipe)
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()


@pytest.mark.django_db(transaction=True)
def test_the_admin_lists_and_pages_10000_held_locks(family_store: str) -> None:
    """S1/A1 on every Redis-protocol backend: 10,000 held locks are counted, paged (first,
    middle and last page of 100), searched and filtered from the index, each page in well
    under a second."""
    fill_many(family_store, MANY)
    assert server_client_of(family_store).zcard(get_store(family_store).index_key()) == MANY
    make_user("viewer", "view_joblock")
    client = Client()
    assert client.login(username="viewer", password=PASSWORD)
    owners = re.compile(r'<td class="owner" title="([^"]*)">')
    timings = {}
    for label, url, rows in (
        ("first page", LOCKS, 100),
        ("page 50", LOCKS + "?p=50", 100),
        ("last page", LOCKS + "?p=100", 100),
        ("search a rare id", LOCKS + "?q=item%3D9876", 1),
        ("filter by job", LOCKS + "?job=tests.unique_sleep", 100),
    ):
        started = time.perf_counter()
        html = client.get(url).content.decode()
        timings[label] = time.perf_counter() - started
        assert len(owners.findall(html)) == rows, (label, owners.findall(html)[:3])
        if label == "first page":
            assert f"{MANY:,} held locks" in html or f"{MANY} held locks" in html
            assert "page 1 of 100" in html
    assert owners.findall(client.get(LOCKS + "?q=item%3D9876").content.decode()) == [
        "owner-9876"]
    print(f"S1/A1 {family_store}: 10,000 held locks, admin page times: "
          + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timings.items()))
    assert max(timings.values()) < 5.0, timings


def test_a_dispatch_through_each_backend_is_listed_with_its_readable_id(
    family_store: str,
) -> None:
    """A1/S1: a real dispatch's lock on each backend is listed by the store (the admin's
    source), with job, readable id and owner."""
    with kombu.Connection(MEMORY) as memory:
        result = jobs.unique_sleep.apply_async((77,), connection=memory)
    [lock] = list(get_store(family_store).iter_locks())
    assert (lock.task_name, lock.owner, lock.store) == ("tests.unique_sleep", result.id,
                                                        family_store)
    assert "77" in lock.ident


# -- error replies: READONLY on a real replica, LOADING and MOVED ------------------------

SERVER_OF = {"redis": "redis", "djredis": "redis", "valkey": "valkey"}


def _cache_at(alias: str, host: str, port: int) -> dict[str, Any]:
    scheme = "valkey" if alias == "valkey" else "redis"
    return {**_dead(alias), "LOCATION": f"{scheme}://{host}:{port}/0"}


def test_a_write_on_a_read_only_replica_is_store_unavailable(family_store: str) -> None:
    """S1/S4: a store pointed at a replica (as after a failover seen late) gets READONLY
    from the real server (redis-server, or valkey-server for django-valkey):
    StoreUnavailable naming it, never a raw client error."""
    from tests.faults.servers import redis_server, valkey_server_binary

    binary = valkey_server_binary() if SERVER_OF[family_store] == "valkey" else None
    with (
        redis_server(binary=binary) as primary,
        redis_server("--replicaof", primary.host, str(primary.port), binary=binary) as replica,
    ):
        caches = {**settings.CACHES,
                  "replica": _cache_at(family_store, replica.host, replica.port)}
        with override_settings(CACHES=caches):
            store = get_store("replica")
            key = jobs.unique_sleep.job_key((1,), {})
            with pytest.raises(StoreUnavailable, match=r"ReadOnlyError|READONLY"):
                store.acquire(key, "a", 30, now=clock.now())
            assert store.get(key) is None  # reads still work on the replica


class ErrorServer:
    """A loopback server that answers every command with one error reply, as a server
    does while it loads its dataset (``-LOADING``) or a cluster node for a slot it does not
    serve (``-MOVED``). (A real LOADING needs a dataset that takes seconds to load; a real
    MOVED a cluster, S5.)"""

    def __init__(self, reply: bytes) -> None:
        import socket
        import threading

        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Any) -> None:
        buffer = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buffer += data
                while (rest := _one_command(buffer)) is not None:
                    buffer = rest
                    conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()


def _one_command(buffer: bytes) -> bytes | None:
    """``buffer`` after its first complete RESP command, or None if it holds none yet."""
    head, sep, rest = buffer.partition(b"\r\n")
    if not sep or not head.startswith(b"*"):
        return None
    for _ in range(int(head[1:])):
        size, sep, rest = rest.partition(b"\r\n")
        if not sep or len(rest) < int(size[1:]) + 2:
            return None
        rest = rest[int(size[1:]) + 2:]
    return rest


@pytest.mark.parametrize("reply", [
    b"-LOADING Redis is loading the dataset in memory\r\n",
    b"-MOVED 3999 127.0.0.1:6381\r\n",
])
def test_loading_and_moved_replies_are_store_unavailable(family_store: str,
                                                         reply: bytes) -> None:
    """S1/S4: a server still loading its dataset (LOADING) and a MOVED redirect outside
    cluster mode are StoreUnavailable on every Redis-protocol backend, for a decision and a
    read alike."""
    server = ErrorServer(reply)
    try:
        caches = {**settings.CACHES, "odd": _cache_at(family_store, "127.0.0.1", server.port)}
        with override_settings(CACHES=caches):
            store = get_store("odd")
            key = jobs.unique_sleep.job_key((1,), {})
            # the class the client library makes of the reply, or the reply itself
            said = {b"-L": r"BusyLoadingError|LOADING", b"-M": r"MovedError|MOVED"}[reply[:2]]
            with pytest.raises(StoreUnavailable, match=said):
                store.acquire(key, "a", 30, now=clock.now())
            with pytest.raises(StoreUnavailable, match=said):
                store.get(key)
    finally:
        server.close()
