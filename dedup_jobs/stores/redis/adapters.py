"""How the Redis store reaches each Redis-protocol Django cache backend (S1).

One adapter per backend family gives the store three things: a raw client of the family's
client library (redis-py or valkey-py) on the cache's write server, the family's exception
classes (every one of them is StoreUnavailable: connection refused, timeouts, ``READONLY``,
``LOADING``, ``MOVED`` outside cluster mode, any error reply), and the cache's key function
(``cache.make_key`` on all of them: KEY_PREFIX, VERSION and KEY_FUNCTION apply).

- django-redis (``django_redis.cache.RedisCache``, its default and Sentinel clients):
  ``django_redis.get_redis_connection(alias)``.
- Django's own ``django.core.cache.backends.redis.RedisCache``: it has no public client
  accessor; ``cache._cache.get_client(key, write=True)`` has been stable from Django 4.2 to
  6.1. :func:`django_client_problem` checks it is still there; if a future Django changes it
  the alias falls back to the generic cache store with a WARNING and the check W006. Its
  serializer (pickle) never sees our keys: every script writes hashes (and plain-string
  tombstones next to them) that only the store reads, never ``cache.get``.
- django-valkey (``django_valkey.cache.ValkeyCache``, any non-cluster client):
  ``django_valkey.get_valkey_connection(alias, write=True)``.
- django-valkey's cluster cache (``ClusterValkeyCache``, S5): the store makes a cluster
  client of its own from the cache's LOCATION (``cluster.py``); only its errors come from here.

valkey-py mirrors redis-py under the ``valkey`` module; :class:`Family` holds what differs
(class names, and two signatures the fast path of ``connection.py`` uses). Nothing here
imports valkey unless a valkey cache is in use.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import sys
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("dedup_jobs")

DJANGO_REDIS = "django_redis.cache.RedisCache"
DJANGO_BUILTIN = "django.core.cache.backends.redis.RedisCache"
DJANGO_VALKEY = "django_valkey.cache.ValkeyCache"
DJANGO_VALKEY_CLUSTER = "django_valkey.cluster_cache.cache.ClusterValkeyCache"


class Family:
    """A client library of the Redis protocol: redis-py (``"redis"``) or valkey-py
    (``"valkey"``), imported on first use."""

    def __init__(self, module: str) -> None:
        lib = importlib.import_module(module)
        exc = importlib.import_module(f"{module}.exceptions")
        self.module = module
        self.client_class: type = lib.Valkey if module == "valkey" else lib.Redis
        #: pools whose connections the store may keep and copy (not Sentinel, not cluster)
        self.pools: tuple[type, ...] = (lib.ConnectionPool, lib.BlockingConnectionPool)
        #: Sentinel's pool (the store makes one of its own, bounded: ``bounded_client``)
        sentinel = importlib.import_module(f"{module}.sentinel")
        self.sentinel_pool: type = sentinel.SentinelConnectionPool
        #: the base of every exception of the library (connection, timeout, error replies)
        self.error: type[BaseException] = exc.ValkeyError if module == "valkey" else exc.RedisError
        self.no_script: type[BaseException] = exc.NoScriptError
        self.timeout: type[BaseException] = exc.TimeoutError
        self.connection_error: type[BaseException] = exc.ConnectionError
        self.response_error: type[BaseException] = exc.ResponseError
        self.retry_class: type = importlib.import_module(f"{module}.retry").Retry
        self.no_backoff: type = importlib.import_module(f"{module}.backoff").NoBackoff
        # valkey-py (and redis-py < 5.3) want a command name; redis-py >= 5.3 warns on one
        get = inspect.signature(lib.ConnectionPool.get_connection).parameters.get("command_name")
        self._named_get = get is not None and get.default is inspect.Parameter.empty
        # redis-py >= 5.1 reads a reply with a timeout of its own; valkey-py does not
        read = inspect.signature(lib.Connection.read_response).parameters
        self._read_timeout = "timeout" in read

    def no_retries(self) -> Any:
        return self.retry_class(self.no_backoff(), 0)

    def get_connection(self, pool: Any) -> Any:
        return pool.get_connection("EVALSHA") if self._named_get else pool.get_connection()

    def read_response(self, conn: Any, timeout: float | None) -> Any:
        """The reply on ``conn``, waiting at most ``timeout`` s (None: the socket's own)."""
        if timeout is None:
            return conn.read_response()
        if self._read_timeout:
            return conn.read_response(timeout=timeout)
        sock = conn._sock
        sock.settimeout(timeout)
        try:
            return conn.read_response()
        finally:
            if conn._sock is sock:  # still connected: back to the connection's own timeout
                sock.settimeout(conn.socket_timeout)


@functools.cache
def family(module: str) -> Family:
    return Family(module)


def family_of(client: Any) -> Family:
    """The family of a raw client: valkey-py's if it is a ``valkey.Valkey`` (only looked at
    when valkey is imported already), redis-py's otherwise."""
    valkey = sys.modules.get("valkey")
    if valkey is not None and isinstance(client, valkey.Valkey):
        return family("valkey")
    return family("redis")


@dataclass(frozen=True)
class Adapter:
    """What the store needs from one backend family."""

    backend: str  # the backend's dotted path, as in CACHES
    label: str  # its name in the admin
    module: str  # its client library: "redis" or "valkey"
    cluster: bool = False  # a cluster cache: the store is RedisClusterStore (cluster.py)

    def client(self, alias: str, cache: Any) -> Any:
        """A raw client of the family on the cache's write (primary) server."""
        if self.backend == DJANGO_REDIS:
            from django_redis import get_redis_connection

            return get_redis_connection(alias)
        if self.backend == DJANGO_VALKEY:
            from django_valkey import get_valkey_connection

            return get_valkey_connection(alias, write=True)
        return cache._cache.get_client(None, write=True)

    def errors(self) -> tuple[type[BaseException], ...]:
        """Every exception a store call on this backend can raise: the library's base error
        (connection loss and error replies alike: READONLY after a failover, LOADING, MOVED,
        OOM, NOPERM, BUSY) and the backend's own wrapper, if it has one."""
        found: list[type[BaseException]] = [family(self.module).error]
        if self.backend == DJANGO_REDIS:
            from django_redis.exceptions import ConnectionInterrupted

            found.append(ConnectionInterrupted)
        elif self.backend in (DJANGO_VALKEY, DJANGO_VALKEY_CLUSTER):
            from django_valkey.exceptions import ConnectionInterrupted as Interrupted

            found.append(Interrupted)
        if self.cluster:  # slot not covered, no node reachable: outside ValkeyError
            from valkey.exceptions import ValkeyClusterException

            found.append(ValkeyClusterException)
        return tuple(found)

    def socket_timeout(self, options: dict[str, Any]) -> Any:
        """The socket timeout the cache's OPTIONS set (None when they set none)."""
        if self.backend == DJANGO_BUILTIN:
            return options.get("socket_timeout")
        return options.get("SOCKET_TIMEOUT")


ADAPTERS = {
    DJANGO_REDIS: Adapter(DJANGO_REDIS, "django-redis", "redis"),
    DJANGO_BUILTIN: Adapter(DJANGO_BUILTIN, "Django's RedisCache", "redis"),
    DJANGO_VALKEY: Adapter(DJANGO_VALKEY, "django-valkey", "valkey"),
    DJANGO_VALKEY_CLUSTER: Adapter(DJANGO_VALKEY_CLUSTER, "django-valkey cluster", "valkey",
                                   cluster=True),
}


def adapter_for(backend: str) -> Adapter | None:
    """The adapter of a CACHES ``BACKEND`` path: one of ours, or a subclass of one (looked
    up only if the path imports)."""
    if backend in ADAPTERS:
        return ADAPTERS[backend]
    from django.utils.module_loading import import_string

    try:
        cls = import_string(backend)
    except ImportError:
        return None
    for base in getattr(cls, "__mro__", ()):
        found = ADAPTERS.get(f"{base.__module__}.{base.__qualname__}")
        if found is not None:
            return found
    return None


def django_client_problem(cache: Any) -> str | None:
    """Why Django's own RedisCache ``cache`` gives no client through its private accessor
    ``cache._cache.get_client(key, write=True)`` (None: it does). Builds the client, which
    opens no connection."""
    try:
        inner = cache._cache
        get_client = inner.get_client
        inspect.signature(get_client).bind(None, write=True)
        client = get_client(None, write=True)
    except Exception as exc:  # AttributeError, TypeError, or whatever a new Django raises
        return f"{type(exc).__name__}: {exc}"
    if not callable(getattr(client, "execute_command", None)) or not hasattr(
        client, "connection_pool"
    ):
        return f"it returned {type(client).__name__}, not a redis-py client"
    return None


def fallback_message(alias: str, problem: str) -> str:
    return (
        f"CACHES[{alias!r}] ({DJANGO_BUILTIN}): this Django's RedisCache no longer gives a "
        f"redis-py client through _cache.get_client(key, write=True) ({problem}), so "
        f"dedup_jobs falls back to the generic cache store there: no Lua (release and renew "
        f"read then write), no listing in the admin or clear_stale_locks, raw client errors."
    )


FALLBACK_HINT = (
    "Use django-redis (django_redis.cache.RedisCache) or django-valkey for this alias, "
    "pin Django to a version dedup_jobs supports, or upgrade dedup_jobs."
)


def warn_fallback(alias: str, problem: str) -> None:
    logger.warning("%s %s", fallback_message(alias, problem), FALLBACK_HINT)
