"""The Redis connection of a store: one EVALSHA per decision on connections kept between
decisions, scripts loaded on NOSCRIPT, every client error turned into StoreUnavailable."""

from __future__ import annotations

import os
import weakref
from typing import Any

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores.redis import scripts

#: connections a store keeps out of the pool between decisions (more are handed back)
MAX_IDLE = 8


def _keepable_pools() -> tuple[type, ...]:
    from redis import BlockingConnectionPool, ConnectionPool

    return (ConnectionPool, BlockingConnectionPool)


_KEEPABLE_POOLS = _keepable_pools()


def _must_reconnect(conn: Any) -> bool:
    """redis-py >= 6 marks a connection to be reconnected (server maintenance)."""
    check = getattr(conn, "should_reconnect", None)
    return bool(check()) if check is not None else False


#: stores that may keep connections (weakly: a dropped store is not kept alive by this)
_kept_by: weakref.WeakSet[RedisConnection] = weakref.WeakSet()


def _forget_after_fork() -> None:
    """In a forked child the kept connections are the parent's sockets: forget them (never
    close them: the parent still uses them). The pool itself resets on its own pid check."""
    for store in list(_kept_by):
        store._idle = []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _pack(sha: str, command: tuple[Any, ...]) -> bytes:
    """``EVALSHA sha numkeys key... arg...`` in RESP. Every part is a str or an int (keys,
    owner ids, milliseconds), written UTF-8 as redis-py's default encoder would."""
    parts = [b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (len(command) + 2, sha.encode())]
    for item in command:
        data = item if type(item) is bytes else str(item).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _errors() -> tuple[type[BaseException], ...]:
    from django_redis.exceptions import ConnectionInterrupted
    from redis.exceptions import RedisError

    # RedisError covers connection loss and error replies alike (READONLY after a failover,
    # OOM, NOPERM, BUSY): the store cannot answer. NOSCRIPT is handled by _eval.
    return (RedisError, ConnectionInterrupted)


def _redis_errors() -> tuple[Any, Any, Any]:
    """NOSCRIPT, connection-level errors (the reply was lost), error replies."""
    from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

    return NoScriptError, (ConnectionError, TimeoutError), ResponseError


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)



class RedisConnection:
    """The plumbing half of :class:`~dedup_jobs.stores.redis.store.RedisStore`."""

    alias: str
    cache: Any

    def _init_connection(self) -> None:
        self._client: Any = None
        self._errors = _errors()
        self._no_script, self._transient, self._reply = _redis_errors()
        self._sha = dict(scripts.SHA)
        # connections kept between decisions (see _evalsha); set up by _keeping()
        self._ready = False
        self._idle: list[Any] = []
        self._pool: Any = None
        self._closed = False

    @property
    def client(self) -> Any:
        if self._client is None:
            from django_redis import get_redis_connection

            self._client = get_redis_connection(self.alias)
        return self._client


    def _eval(self, name: str, keys: list[str], args: Any) -> Any:
        """Run script ``name`` in one round trip: EVALSHA by the digest computed at import,
        loading the script only if the server answers NOSCRIPT (first use, restart, flush)."""
        command = (len(keys), *keys, *args)
        try:
            try:
                return self._evalsha(self._sha[name], command)
            except self._no_script:
                self._sha[name] = self.client.script_load(getattr(scripts, name))
                return self._evalsha(self._sha[name], command)
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def _evalsha(self, sha: str, command: tuple[Any, ...]) -> Any:
        """One EVALSHA on a connection this store keeps between decisions.

        Every decision is on the dispatch path, and redis-py's per-command machinery (pool
        lock, a "has the connection unread data" poll of the socket, metrics hooks, argument
        encoding) costs more than Redis takes to run the script. So the store keeps up to
        ``MAX_IDLE`` connections taken from the django-redis pool (they count as in use
        there), packs the command itself and reads the reply with redis-py's parser. A
        connection that fails mid-command is never reused; on a connection error the command
        goes once more through ``execute_command`` and redis-py's retry policy, as it would
        have without this fast path."""
        client = self.client
        pool = self._keeping(client)
        if pool is None:
            # a cluster client, a single-connection client, client-side caching: the plain way
            return client.execute_command("EVALSHA", sha, *command)
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = pool.get_connection()
        try:
            conn.send_packed_command((_pack(sha, command),))
            reply = conn.read_response()
        except self._transient:
            conn.disconnect()
            pool.release(conn)
            return client.execute_command("EVALSHA", sha, *command)
        except self._reply:
            self._put_back(pool, conn)  # the server answered: the connection is fine
            raise
        except BaseException:
            conn.disconnect()  # interrupted mid-reply: never reuse a half-read connection
            pool.release(conn)
            raise
        self._put_back(pool, conn)
        return reply

    def _keeping(self, client: Any) -> Any:
        """The pool this store keeps connections of, or None when it should not (a pool kind
        that routes connections itself, client-side caching, a single-connection client).
        After a fork the kept connections are the parent's: _forget_after_fork() drops them
        (a hook, not a getpid() per call: that is a system call on every decision)."""
        if not self._ready:
            # Idempotent: threads racing here compute the same answer, and the list of kept
            # connections (made in __init__) is never replaced but by the fork hook.
            pool = getattr(client, "connection_pool", None)
            keep = (
                type(pool) in _KEEPABLE_POOLS
                and getattr(pool, "cache", None) is None
                and getattr(client, "connection", None) is None
            )
            self._pool = pool if keep else None
            _kept_by.add(self)
            self._ready = True
        return self._pool

    def _put_back(self, pool: Any, conn: Any) -> None:
        if not self._closed and len(self._idle) < MAX_IDLE and not _must_reconnect(conn):
            self._idle.append(conn)
        else:
            pool.release(conn)

    def close(self) -> None:
        """Hand the kept connections back to their pool (the store is being dropped); a
        decision still under way on another thread hands its connection back when done."""
        self._closed = True
        idle, self._idle = self._idle, []
        if self._pool is not None:
            for conn in idle:
                self._pool.release(conn)
