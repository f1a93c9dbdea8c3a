"""The Redis connection of a store: one EVALSHA per decision on connections kept between
decisions, scripts loaded on NOSCRIPT, every client error turned into StoreUnavailable.

Every call is bounded (S8): the store talks to Redis through a client of its own, a copy of
the cache's connection settings with ``socket_timeout`` and ``socket_connect_timeout`` capped
at ``DEDUP_JOBS["STORE_TIMEOUT"]`` and the client library's own retries off (redis-py or
valkey-py, see ``adapters.py``), so that neither a cache without a socket timeout nor a
client's retry policy (which re-sends a command after a
timeout) can make a decision wait longer. A decision is re-sent at most once, on a connection
error, within the same time budget: every script is idempotent (S7), so a re-sent one answers
as the first did and changes nothing more. A connection error drops every connection kept
from before it (S9: a restart closed them all), so the re-send goes out on a fresh one.
"""

from __future__ import annotations

import copy
import math
import os
import time
import weakref
from collections.abc import Callable
from time import perf_counter
from typing import Any

from dedup_jobs import metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.metrics.tally import FOLD_AT
from dedup_jobs.stores.answers import Acquired
from dedup_jobs.stores.redis import scripts
from dedup_jobs.stores.redis.adapters import Adapter, Family, family, family_of

#: connections a store keeps out of the pool between decisions (more are handed back)
MAX_IDLE = 8


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


def cache_timeout(client: Any) -> float | None:
    """The socket timeout the cache's own client reads with (None: unbounded)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    value = kwargs.get("socket_timeout")
    return float(value) if value else None


def bounded_client(client: Any, timeout: float, lib: Family | None = None) -> tuple[Any, bool]:
    """A client of the store's own on the cache's server and settings, every socket
    operation capped at ``timeout`` seconds and without the client library's retries (redis-py
    or valkey-py: ``lib``, by default the client's own); and whether it is the store's own (to
    disconnect when the store is dropped). A Sentinel pool gets one of its own too, on a copy
    of the cache's sentinel manager whose sentinels answer within a share of ``timeout``
    (:func:`_bounded_sentinel`). Other pool kinds (a client-side-caching connection) keep the
    cache's client as it is; a cluster cache gets a cluster client of the store's own
    (``cluster.py``)."""
    lib = lib or family_of(client)
    pool: Any = getattr(client, "connection_pool", None)
    if getattr(client, "connection", None) is not None:
        return client, False
    if isinstance(pool, lib.sentinel_pool):
        return _bounded_sentinel(pool, timeout, lib), True
    if type(pool) not in lib.pools:
        return client, False
    own = type(pool)(connection_class=pool.connection_class,
                     max_connections=pool.max_connections,
                     **_capped(pool.connection_kwargs, timeout, lib))
    return lib.client_class(connection_pool=own), True


def _capped(kwargs: dict[str, Any], timeout: float, lib: Family) -> dict[str, Any]:
    """A pool's connection settings with socket timeouts capped at ``timeout``, no retries."""
    kwargs = dict(kwargs)
    for name in ("socket_timeout", "socket_connect_timeout"):
        kwargs[name] = min(float(kwargs.get(name) or math.inf), timeout)
    kwargs.update(retry=lib.no_retries(), retry_on_error=[], retry_on_timeout=False)
    return kwargs


def _bounded_sentinel(pool: Any, timeout: float, lib: Family) -> Any:
    """S8 through Sentinel: a client on a Sentinel pool of the store's own, like the cache's
    (service, connection class), its connections capped at ``timeout``, and always on the
    primary: every decision writes (django-valkey 0.4's SentinelClient sets its primary
    pool's ``is_master`` to False, while that pool's connections, which read the proxy, still
    go to the primary). Its sentinel manager is a copy of the cache's whose sentinels are
    asked with a timeout of ``timeout / number of sentinels`` each, so a silent sentinel is
    passed over in time (redis-py asks them in turn for the primary's address)."""
    manager = copy.copy(pool.sentinel_manager)
    share = timeout / max(1, len(manager.sentinels))
    manager.sentinels = [bounded_client(sentinel, share, lib)[0]
                         for sentinel in manager.sentinels]
    kwargs = _capped(pool.connection_kwargs, timeout, lib)
    kwargs.pop("connection_pool", None)  # the pool's proxy, made anew by the pool
    own = type(pool)(pool.service_name, manager, connection_class=pool.connection_class,
                     max_connections=pool.max_connections, is_master=True,
                     check_connection=pool.check_connection, **kwargs)
    return lib.client_class(connection_pool=own)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))



class _Calls(dict[str, str]):
    """A script's name as the metrics' ``call`` label: the store method it serves."""

    def __missing__(self, name: str) -> str:
        self[name] = label = "claim_due" if name == "CLAIM" else name.lower()
        return label


CALLS = _Calls()


class RedisConnection:
    """The plumbing half of :class:`~dedup_jobs.stores.redis.store.RedisStore`."""

    alias: str
    cache: Any
    #: every round trip is timed in :meth:`_eval` (see BaseStore.__init_subclass__)
    times_its_calls = True

    def _init_connection(self, adapter: Adapter) -> None:
        self._client: Any = None
        self._own_client = False
        self.adapter = adapter
        self._lib = lib = family(adapter.module)
        #: where the seconds of each script's calls are counted (A5), by script name
        self._timings: dict[str, Any] = {}
        self._errors = adapter.errors()
        # NOSCRIPT; other connection errors (the reply was lost: re-sent once); error
        # replies (the server answered: the connection is fine). A timeout is neither: a
        # late reply is never re-sent.
        self._no_script, self._lost, self._reply = (
            lib.no_script, lib.connection_error, lib.response_error)
        #: seconds a decision may take in all (S8): STORE_TIMEOUT, or the cache's own socket
        #: timeout when that is shorter
        self.budget = app_settings.STORE_TIMEOUT
        #: ms to add to our clock for the server's (learned from a "late" answer, see
        #: deadline_ms): the scripts that write at dispatch refuse to run past the deadline
        self.skew_ms = 0
        self._sha = dict(scripts.SHA)
        # connections kept between decisions (see _evalsha); set up by _keeping()
        self._ready = False
        self._idle: list[Any] = []
        self._pool: Any = None
        self._closed = False

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                cache_client = self.adapter.client(self.alias, self.cache)
            except self._errors as exc:  # a client that connects as it is made (Sentinel)
                raise StoreUnavailable(self.alias, exc) from exc
            self.budget = min(app_settings.STORE_TIMEOUT,
                              cache_timeout(cache_client) or math.inf)
            self._client, self._own_client = bounded_client(cache_client, self.budget,
                                                            self._lib)
        return self._client

    def deadline_ms(self) -> int:
        """When the caller gives up on a decision sent now, on the server's clock (ms): a
        dispatch script that the server runs after it (Redis was stalled, the reply came
        too late) must change nothing, since the caller has been told it failed (S7)."""
        return int((time.time() + self.budget) * 1000) + self.skew_ms

    def learn_skew(self, server_ms: int) -> None:
        """A script refused as late although its answer arrived in time: the server's clock
        is ahead of ours. Remember by how much (plus the budget, to stay on the safe side)."""
        self.skew_ms = max(self.skew_ms, server_ms - int(time.time() * 1000) + 1)


    def acquired_answers(self, calls: Any, replies: list[Any],
                         again: Callable[[Any], Acquired]) -> list[Acquired]:
        """L3: the answers of a batch of lock scripts, in order; a call refused as late (the
        server's clock ahead of ours) is made ``again`` alone. StoreUnavailable from such a
        call carries the answers read before it (``answered``)."""
        answers: list[Acquired] = []
        for call, reply in zip(calls, replies, strict=True):
            answer = _text(reply)
            if answer[0] == "L":
                self.learn_skew(int(answer[1:]))
                try:
                    answers.append(again(call))
                except StoreUnavailable as exc:
                    exc.answered = answers
                    raise
            else:
                answers.append(Acquired(acquired=answer[0] == "1", holder=answer[1:]))
        return answers

    def _eval(self, name: str, keys: list[str], args: Any, job: str = "?") -> Any:
        """Run script ``name`` in one round trip, timed for the metrics (A5; ``job``: the
        task name a failure is counted under): the one place a Redis-family store times
        its calls, so its decision methods carry no timing wrapper (``times_its_calls``)."""
        if not app_settings.raw.get("METRICS", True):
            return self._send(name, keys, args)
        started = perf_counter()
        try:
            answer = self._send(name, keys, args)
        except StoreUnavailable as exc:
            metrics.call_failed(self.alias, CALLS[name], perf_counter() - started, exc, job)
            raise
        self._timed(name, perf_counter() - started)
        return answer

    def _timed(self, name: str, seconds: float) -> None:
        queue = self._timings.get(name)
        if queue is None:
            queue = self._timings[name] = metrics.tally.timing(self.alias, CALLS[name])
        queue.append(seconds)
        if len(queue) > FOLD_AT:
            metrics.tally.fold()

    def _send(self, name: str, keys: list[str], args: Any) -> Any:
        """EVALSHA by the digest computed at import, loading the script only if the server
        answers NOSCRIPT (first use, restart, flush)."""
        command = (len(keys), *keys, *args)
        try:
            try:
                return self._evalsha(self._sha[name], command)
            except self._no_script:
                self._sha[name] = self.client.script_load(getattr(scripts, name))
                return self._evalsha(self._sha[name], command)
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def _send_many(self, name: str, calls: list[tuple[list[str], tuple[Any, ...]]],
                   job: str = "?") -> list[Any]:
        """L3: script ``name`` for each ``(keys, args)`` of a batch in one round trip, as
        :meth:`_send` (NOSCRIPT: loaded, and the whole batch sent again, which the
        idempotent scripts answer as the first time). A failure is counted under ``job``
        (A5), as :meth:`_eval` counts one."""
        commands = [(len(keys), *keys, *args) for keys, args in calls]
        timed, started = app_settings.raw.get("METRICS", True), perf_counter()
        try:
            for _attempt in range(2):
                replies = self._evalsha_many(self._sha[name], commands)
                errors = [r for r in replies if isinstance(r, self._reply)]
                if not any(isinstance(r, self._no_script) for r in errors):
                    if errors:
                        raise errors[0]
                    if timed:
                        self._timed(name, perf_counter() - started)  # one call: the batch
                    return replies
                self._sha[name] = self.client.script_load(getattr(scripts, name))
            failed: Exception = StoreUnavailable(self.alias,
                                                 f"{name} answered NOSCRIPT after SCRIPT LOAD")
        except self._errors as exc:
            failed = StoreUnavailable(self.alias, exc)
            failed.__cause__ = exc
        if timed:
            metrics.call_failed(self.alias, CALLS[name], perf_counter() - started, failed, job)
        raise failed

    def _evalsha(self, sha: str, command: tuple[Any, ...]) -> Any:
        """One EVALSHA on a connection this store keeps between decisions.

        Every decision is on the dispatch path, and redis-py's per-command machinery (pool
        lock, a "has the connection unread data" poll of the socket, metrics hooks, argument
        encoding) costs more than Redis takes to run the script. So the store keeps up to
        ``MAX_IDLE`` connections of its own pool, packs the command itself and reads the
        reply with redis-py's parser (checked against redis-py 8.1). A connection that fails
        mid-command is never reused. The whole call, a re-send included, takes at most
        ``budget`` seconds: a late reply is a TimeoutError and is never waited for again; a
        lost connection (reset, closed by the server) is re-sent once on a fresh one."""
        pool = self._keeping(self.client)
        if pool is None:
            # Sentinel and cluster pools, client-side caching: the plain way
            return self.client.execute_command("EVALSHA", sha, *command)
        reply = self._exchange(pool, (_pack(sha, command),))[0]
        if isinstance(reply, self._reply):
            raise reply
        return reply

    def _evalsha_many(self, sha: str, commands: list[tuple[Any, ...]]) -> list[Any]:
        """L3: every command of a batch written at once and the answers read back: one
        round trip, on a kept connection, or through the client's own pipeline where the
        store keeps none (Sentinel pools, client-side caching; see :meth:`_keeping`). An
        error reply stands in the list in its command's place."""
        pool = self._keeping(self.client)
        if pool is None:
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command("EVALSHA", sha, *command)
            return list(pipe.execute(raise_on_error=False))
        # one buffer: one write, which the server reads in one go (a tuple would be
        # written part by part)
        return self._exchange(pool, (b"".join(_pack(sha, c) for c in commands),),
                              len(commands))

    def _exchange(self, pool: Any, packed: tuple[bytes, ...], count: int = 1) -> list[Any]:
        """Write ``packed`` on a kept connection and read ``count`` replies, within the
        budget (see :meth:`_evalsha`); an error reply is kept in its place."""
        give_up = time.monotonic() + self.budget
        resent = False
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                conn = self._lib.get_connection(pool)
            replies: list[Any] = []
            try:
                conn.send_packed_command(packed)
                while len(replies) < count:
                    left = give_up - time.monotonic()
                    # the socket's own timeout is the budget: no settimeout() system calls,
                    # unless a connect or a first try took part of it
                    try:
                        replies.append(self._lib.read_response(
                            conn, None if left > self.budget - 0.001 else max(0.001, left)))
                    except self._reply as exc:  # the server answered: read on
                        replies.append(exc)
            except self._lost:
                # (a TimeoutError is not a ConnectionError: a late reply is never re-sent)
                conn.disconnect()
                pool.release(conn)
                # S9: a server restart (or failover) closed every connection kept from
                # before it, not just this one: drop them all together, so that the re-send
                # and the decisions after it go out on fresh connections.
                self._discard_kept(pool)
                if resent or time.monotonic() >= give_up:
                    raise
                resent = True  # idempotent scripts (S7): the re-send answers as the first
                continue
            except BaseException:
                conn.disconnect()  # interrupted mid-reply: never reuse a half-read connection
                pool.release(conn)
                raise
            self._put_back(pool, conn)
            return replies

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
                type(pool) in self._lib.pools
                and getattr(pool, "cache", None) is None
                and getattr(client, "connection", None) is None
            )
            self._pool = pool if keep else None
            _kept_by.add(self)
            self._ready = True
        return self._pool

    def _discard_kept(self, pool: Any) -> None:
        """S9: disconnect every connection kept between decisions and hand it back to the
        pool (it reconnects when next used). No round trip: a restart's closed sockets are
        not probed one by one. The pool's own idle connections need nothing: the pool checks
        each one as it hands it out (and reconnects one the server closed); connections in
        use by other threads are left to them (valkey-py's BlockingConnectionPool cannot
        disconnect only the idle ones)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.disconnect()
            pool.release(conn)

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
        if self._own_client and self._client is not None:
            # positional: valkey-py's BlockingConnectionPool names the argument "_"
            pool = self._client.connection_pool
            pool.disconnect(False)
            manager = getattr(pool, "sentinel_manager", None)  # our copy (_bounded_sentinel)
            for sentinel in getattr(manager, "sentinels", ()):
                sentinel.connection_pool.disconnect(False)
