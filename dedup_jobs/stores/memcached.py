"""The memcached connection of the cache store (Django's ``PyMemcacheCache``): a client of the
store's own, ``gets``/``cas``, every error turned into StoreUnavailable, every decision bounded.

Why not the cache's own client (``cache._cache``, a pymemcache ``HashClient``):

- Django sets no timeout on it (pymemcache's default ``connect_timeout`` and ``timeout`` are
  None): one call to a stopped server waits forever (S8).
- After one failed call ``HashClient`` answers the calls of the next ``retry_timeout``
  seconds with a default *without asking the server* — ``get`` None ("free"), ``add`` False —
  and after ``retry_attempts`` failures it drops the server for ``dead_timeout`` (60 s) and
  then sends its keys to another server or refuses them. A lock must live on one server all
  processes agree on, and "free" must come from the server.
- pymemcache's base ``Client`` is one socket and not thread-safe; Django makes one per thread,
  but a store is shared by the threads of a process (S3).

So the store keeps connections of its own (pymemcache base ``Client``\\ s, as many as threads
use at once), to the servers and with the options of the cache (serde, key prefix, TLS, ...),
the server of a key chosen as the cache's ``HashClient`` chooses it (rendezvous hashing over
the same node names), never another one. Keys and timeouts go through the Django cache's own
``make_and_validate_key`` and ``get_backend_timeout``, so ``cache.get`` reads what the store
wrote. Every socket operation is capped at the time left of the decision, which gets
``DEDUP_JOBS["STORE_TIMEOUT"]`` in all (or the cache's own ``timeout`` option, when shorter):
see :meth:`MemcachedClient.decision`.

Compare-and-delete: memcached has no conditional delete, but ``cas`` with a negative exptime
stores an item that is already expired (protocol.txt: "If a negative value is given the item
is immediately expired"), only if nobody changed the key since ``gets``: one atomic command,
after which every ``get`` misses and ``add`` succeeds. See :meth:`MemcachedClient.cas_delete`.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable

#: connections a store keeps between decisions, per server (more are closed after use)
MAX_IDLE = 8

#: options of Django's cache that pymemcache's base Client takes as they are
CLIENT_OPTIONS = ("serde", "serializer", "deserializer", "no_delay", "socket_module",
                  "socket_keepalive", "key_prefix", "allow_unicode_keys", "encoding",
                  "tls_context")

_kept_by: weakref.WeakSet[MemcachedClient] = weakref.WeakSet()


def _forget_after_fork() -> None:
    """In a forked child the kept connections are the parent's sockets: forget them (never
    close them: the parent still uses them)."""
    for client in list(_kept_by):
        client._idle = {server: [] for server in client._idle}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _node(server: Any) -> str:
    """The node name pymemcache's HashClient hashes a server by."""
    return "%s:%s" % server if isinstance(server, tuple) else str(server)  # noqa: UP031


class MemcachedClient:
    """The store's own connections to the servers of one ``PyMemcacheCache``."""

    def __init__(self, alias: str, cache: Any) -> None:
        from pymemcache.client.base import Client, normalize_server_spec
        from pymemcache.client.rendezvous import RendezvousHash
        from pymemcache.exceptions import MemcacheError

        self.alias = alias
        self.cache = cache
        from pymemcache.serde import pickle_serde

        # Django's options with its defaults (Django 4.0 to 6.1 keep them in ``_options``);
        # the same defaults again, should a future Django keep them elsewhere
        options: dict[str, Any] = {"serde": pickle_serde, "allow_unicode_keys": True,
                                   **(getattr(cache, "_options", None) or {})}
        own = options.get("timeout")
        #: seconds a decision may take in all (S8)
        self.budget = min(app_settings.STORE_TIMEOUT, float(own) if own else math.inf)
        self._kwargs = {name: options[name] for name in CLIENT_OPTIONS if name in options}
        self._kwargs["default_noreply"] = False  # every answer is read: a decision needs it
        self._connect_timeout = min(float(options.get("connect_timeout") or math.inf),
                                    self.budget)
        self._client_class = Client
        self._errors = (MemcacheError, OSError)
        self._servers = {_node(s): normalize_server_spec(s) for s in cache.client_servers}
        self._hasher: Any = None
        if len(self._servers) > 1:
            self._hasher = options.get("hasher", RendezvousHash)()
            for node in self._servers:
                self._hasher.add_node(node)
        self._only = next(iter(self._servers)) if len(self._servers) == 1 else None
        self._idle: dict[str, list[Any]] = {node: [] for node in self._servers}
        self._local = threading.local()
        self._closed = False
        _kept_by.add(self)

    # -- the time budget of one decision (S8) ----------------------------------------------

    @contextmanager
    def decision(self) -> Iterator[None]:
        """One decision of the store: every call inside it (a nested decision included)
        shares one budget of ``self.budget`` seconds; past it a call is StoreUnavailable."""
        local = self._local
        if getattr(local, "deadline", None) is not None:
            yield
            return
        local.deadline = time.monotonic() + self.budget
        try:
            yield
        finally:
            local.deadline = None

    def _left(self) -> float:
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            return self.budget
        left: float = deadline - time.monotonic()
        if left <= 0:
            raise StoreUnavailable(self.alias, f"no answer within STORE_TIMEOUT = "
                                               f"{self.budget!r} s")
        return left

    # -- connections -------------------------------------------------------------------------

    def _node_of(self, key: str) -> str:
        if self._only is not None:
            return self._only
        node: str = self._hasher.get_node(key)
        return node

    def _call(self, key: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``Client.<method>(*args)`` on a connection to the server of ``key``, within the
        decision's time left; any failure is StoreUnavailable and closes the connection."""
        node = self._node_of(key)
        left = self._left()
        try:
            conn = self._idle[node].pop()
        except IndexError:
            conn = self._client_class(self._servers[node], **self._kwargs)
        try:
            if conn.sock is None:
                conn.connect_timeout = min(self._connect_timeout, left)
                conn.timeout = left
            else:
                conn.sock.settimeout(left)
            answer = getattr(conn, method)(*args, **kwargs)
        except self._errors as exc:
            conn.close()
            raise StoreUnavailable(self.alias, f"memcached {_node(self._servers[node])}: "
                                               f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            conn.close()  # interrupted mid-reply: never reuse a half-read connection
            raise
        idle = self._idle[node]
        if not self._closed and len(idle) < MAX_IDLE:
            idle.append(conn)
        else:
            conn.close()
        return answer

    def close(self) -> None:
        """Close the kept connections (the store is being dropped)."""
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().close()

    # -- commands (names are the store's; keys and timeouts made as the cache makes them) ----

    def _key(self, name: str) -> str:
        key: str = self.cache.make_and_validate_key(name)
        return key

    def _expire(self, ttl: float) -> int:
        """memcached counts whole seconds on its own clock, and an item with exptime n lives
        between n - 1 and n seconds: ceil(ttl) + 1, so a lock never lives shorter than
        asked (at most 2 s longer). Over 30 days the exptime is a Unix time, in 32 bits:
        one past 2038-01-19 arrives expired, so such a lifetime is no expiry (0): the item
        lives until it is released (or evicted)."""
        expire: int = self.cache.get_backend_timeout(math.ceil(ttl) + 1)
        return 0 if expire >= 2**31 else expire

    def add(self, name: str, value: Any, ttl: float) -> bool:
        key = self._key(name)
        return bool(self._call(key, "add", key, value, self._expire(ttl)))

    def get(self, name: str) -> Any:
        key = self._key(name)
        return self._call(key, "get", key)

    def gets(self, name: str) -> tuple[Any, Any]:
        """The value at ``name`` and its cas token (None, None when there is none)."""
        key = self._key(name)
        value, token = self._call(key, "gets", key)
        return value, token

    def cas(self, name: str, value: Any, token: Any, ttl: float) -> bool | None:
        """Write ``value`` only if nobody changed ``name`` since the ``gets`` that returned
        ``token``: True written, False changed since, None gone since."""
        key = self._key(name)
        answer: bool | None = self._call(key, "cas", key, value, token, self._expire(ttl))
        return answer

    def cas_delete(self, name: str, token: Any) -> bool | None:
        """Compare-and-delete: replace the item by an already-expired one (exptime -1) only
        if nobody changed it since ``gets``. True deleted, False changed since, None gone.
        One atomic command: there is no moment at which the key holds anything else."""
        key = self._key(name)
        answer: bool | None = self._call(key, "cas", key, b"", token, -1)
        return answer

    def set_many(self, values: dict[str, Any], ttl: float) -> None:
        by_node: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            key = self._key(name)
            by_node.setdefault(self._node_of(key), {})[key] = value
        for batch in by_node.values():
            failed = self._call(next(iter(batch)), "set_many", batch, self._expire(ttl))
            if failed:
                raise StoreUnavailable(self.alias, f"memcached did not store {failed!r}")

    def get_many(self, names: list[str]) -> dict[str, Any]:
        keys = {self._key(name): name for name in names}
        by_node: dict[str, list[str]] = {}
        for key in keys:
            by_node.setdefault(self._node_of(key), []).append(key)
        found: dict[str, Any] = {}
        for batch in by_node.values():
            found.update(self._call(batch[0], "get_many", batch))
        return {keys[key]: value for key, value in found.items()}

    def delete_many(self, names: list[str]) -> None:
        by_node: dict[str, list[str]] = {}
        for name in names:
            key = self._key(name)
            by_node.setdefault(self._node_of(key), []).append(key)
        for batch in by_node.values():
            self._call(batch[0], "delete_many", batch)
