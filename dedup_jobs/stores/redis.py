"""The django-redis store: one EVALSHA per decision, an index of held locks."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from typing import Any

from django.core.cache import caches

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores import lua
from dedup_jobs.stores.base import (
    CLAIMED,
    DUE_TOLERANCE,
    MISSING,
    OTHER,
    QUEUED,
    WAIT,
    Acquired,
    BaseStore,
    Debounced,
    DebounceState,
    Due,
    LockInfo,
    Page,
    Started,
    decode_call,
)

#: index entries examined per ZSCAN call when the admin searches
SCAN_COUNT = 2000
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
_kept_by: weakref.WeakSet[RedisStore] = weakref.WeakSet()


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


class RedisStore(BaseStore):
    """Locks on a django-redis cache (``django_redis.cache.RedisCache``)."""

    can_list = True

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self.cache: Any = caches[alias]
        self._client: Any = None
        self._errors = _errors()
        self._no_script, self._transient, self._reply = _redis_errors()
        self._sha = dict(lua.SHA)
        # connections kept between decisions (see _evalsha); set up by _keeping()
        self._ready = False
        self._idle: list[Any] = []
        self._pool: Any = None
        self._closed = False
        # Settings are read once per store instance: get_store() drops its instances when
        # CACHES or DEDUP_JOBS change, so override_settings still takes effect.
        self._index_key = self.physical(f"{app_settings.KEY_PREFIX}:index:unique")
        self._debounce_index_key = self.physical(f"{app_settings.KEY_PREFIX}:index:debounce")

    # -- plumbing -----------------------------------------------------------------------

    @property
    def client(self) -> Any:
        if self._client is None:
            from django_redis import get_redis_connection

            self._client = get_redis_connection(self.alias)
        return self._client

    def physical(self, key: str) -> str:
        return str(self.cache.make_key(key))

    def index_key(self) -> str:
        return self._index_key

    def debounce_index_key(self) -> str:
        return self._debounce_index_key

    def _call(self, name: str, key: JobKey, *args: Any) -> Any:
        return self._eval(name, [self.physical(key.key), self._index_key], args)

    def _eval(self, name: str, keys: list[str], args: Any) -> Any:
        """Run script ``name`` in one round trip: EVALSHA by the digest computed at import,
        loading the script only if the server answers NOSCRIPT (first use, restart, flush)."""
        command = (len(keys), *keys, *args)
        try:
            try:
                return self._evalsha(self._sha[name], command)
            except self._no_script:
                self._sha[name] = self.client.script_load(getattr(lua, name))
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

    def _debounce_keys(self, key: JobKey) -> list[str]:
        physical = self.physical(key.key)
        return [physical, f"{physical}:ids", self.debounce_index_key()]

    # -- decisions ----------------------------------------------------------------------

    def acquire(
        self, key: JobKey, owner: str, ttl: float, *, now: float, reentrant: bool = False
    ) -> Acquired:
        answer = _text(self._call(
            "ACQUIRE", key, owner, _ms(ttl), _ms(now), "1" if reentrant else "0",
            key.task_name, key.ident,
        ))
        return Acquired(acquired=answer[0] == "1", holder=answer[1:])

    def start(
        self, key: JobKey, owner: str, lease: float, *, now: float, release: bool
    ) -> Started:
        ok, what = self._call(
            "START", key, owner, _ms(lease), _ms(now), "1" if release else "0",
            key.task_name, key.ident,
        )
        if not ok:
            return Started(run=False, holder=_text(what))
        what = _text(what)
        return Started(run=True, holder=None, took=what == "taken", released=what == "released")

    def release(self, key: JobKey, owner: str) -> bool:
        return bool(self._call("RELEASE", key, owner))

    def renew(self, key: JobKey, owner: str, ttl: float, *, now: float) -> bool:
        return bool(self._call("RENEW", key, owner, _ms(ttl), _ms(now)))

    # -- debounce -----------------------------------------------------------------------

    def debounce(
        self, key: JobKey, task_id: str, payload: str, *, now: float, debounce_for: float,
        max_wait: float | None, ttl: float,
    ) -> Debounced:
        new, message, superseded = self._eval("DEBOUNCE", self._debounce_keys(key), (
            task_id, payload, _ms(now), _ms(debounce_for),
            "" if max_wait is None else _ms(max_wait), _ms(ttl), key.task_name, key.ident,
        ))
        return Debounced(new=bool(new), message_id=_text(message),
                         superseded=_text(superseded) or None)

    def claim_due(self, key: JobKey, message_id: str, *, now: float) -> Due:
        answer = self._eval("CLAIM", self._debounce_keys(key),
                            (message_id, _ms(now), int(DUE_TOLERANCE * 1000)))
        action = _text(answer[0])
        if action == CLAIMED:
            args, kwargs = decode_call(answer[2])
            return Due(action=CLAIMED, latest_id=_text(answer[1]), args=args, kwargs=kwargs,
                       absorbed=tuple(_text(i) for i in answer[3]))
        if action == WAIT:
            return Due(action=WAIT, wait_until=int(answer[1]) / 1000)
        return Due(action=OTHER if action == OTHER else MISSING)

    def _debounce_state(self, physical: str, fields: dict[bytes, bytes]) -> DebounceState | None:
        if not fields or b"message" not in fields:
            return None
        data = {_text(k): _text(v) for k, v in fields.items()}
        args, kwargs = decode_call(data["payload"])
        run_at = int(data["run_at"]) / 1000
        deadline = int(data["deadline"]) / 1000 if data.get("deadline") else None
        prefix_at = physical.find(f"{app_settings.KEY_PREFIX}:debounce:")
        return DebounceState(
            key=physical[prefix_at:] if prefix_at >= 0 else physical,
            task_name=data.get("task", ""), ident=data.get("id", ""),
            count=int(data.get("count", "1")),
            first_dispatch_at=int(data["first"]) / 1000,
            last_dispatch_at=int(data["last"]) / 1000,
            runs_at=run_at if deadline is None else min(run_at, deadline),
            deadline=deadline, message_id=data["message"], latest_id=data["latest"],
            args=args, kwargs=kwargs, store=self.alias,
        )

    def get_debounce(self, key: JobKey) -> DebounceState | None:
        physical = self.physical(key.key)
        try:
            return self._debounce_state(physical, self.client.hgetall(physical))
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def iter_debounces(self, *, batch_size: int = 500) -> Iterator[DebounceState]:
        """Walk the debounce index, soonest due first, ``batch_size`` per pipelined read."""
        yield from self._walk(self.debounce_index_key(), batch_size, self._debounce_state)

    def _walk(self, index: str, batch_size: int, parse: Any) -> Iterator[Any]:
        start = 0
        try:
            while True:
                members = self.client.zrange(index, start, start + batch_size - 1)
                if not members:
                    return
                pipe = self.client.pipeline(transaction=False)
                for member in members:
                    pipe.hgetall(member)
                for member, fields in zip(members, pipe.execute(), strict=True):
                    item = parse(_text(member), fields)
                    if item is not None:
                        yield item
                start += batch_size
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    # -- reading ------------------------------------------------------------------------

    def _info(self, physical: str, fields: dict[bytes, bytes]) -> LockInfo | None:
        if not fields or b"owner" not in fields:
            return None
        data = {_text(k): _text(v) for k, v in fields.items()}
        prefix_at = physical.find(f"{app_settings.KEY_PREFIX}:unique:")
        return LockInfo(
            key=physical[prefix_at:] if prefix_at >= 0 else physical,
            task_name=data.get("task", ""),
            ident=data.get("id", ""),
            owner=data["owner"],
            state=data.get("state", QUEUED),
            acquired_at=int(data.get("acquired", "0")) / 1000,
            expires_at=int(data["expires"]) / 1000 if "expires" in data else None,
            store=self.alias,
        )

    def get(self, key: JobKey) -> LockInfo | None:
        physical = self.physical(key.key)
        try:
            return self._info(physical, self.client.hgetall(physical))
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def iter_locks(self, *, batch_size: int = 500) -> Iterator[LockInfo]:
        """Every held lock, ``batch_size`` index entries per ZSCAN and one pipelined read of
        their hashes. ZSCAN's cursor survives deletions, so callers may release as they go
        (a lock may, rarely, be yielded twice while Redis rehashes the index)."""
        index = self.index_key()
        cursor = 0
        try:
            while True:
                cursor, entries = self.client.zscan(index, cursor, count=batch_size)
                yield from self._read([member for member, _score in entries])
                if cursor == 0:
                    return
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def _read(self, members: list[Any], parse: Any = None) -> list[Any]:
        """The hashes at ``members`` (physical keys), parsed, in one pipelined round trip."""
        if not members:
            return []
        parse = parse or self._info
        pipe = self.client.pipeline(transaction=False)
        for member in members:
            pipe.hgetall(member)
        answers = pipe.execute()
        items = (parse(_text(m), fields) for m, fields in zip(members, answers, strict=True))
        return [item for item in items if item is not None]

    def lock_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[LockInfo]:
        return self._page(self.index_key(), "unique", self._info, offset=offset, limit=limit,
                          task_name=task_name, search=search, min_score=int(now * 1000))

    def debounce_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[DebounceState]:
        return self._page(self.debounce_index_key(), "debounce", self._debounce_state,
                          offset=offset, limit=limit, task_name=task_name, search=search,
                          min_score=None)

    def _page(self, index: str, kind: str, parse: Any, *, offset: int, limit: int,
              task_name: str, search: str, min_score: int | None) -> Page[Any]:
        """Without a filter: count and range of the index by score in one pipeline, then one
        pipelined read of the page. With a job or a search: ZSCAN MATCH over the index
        (server-side filtering, never KEYS), stopping as soon as the page is full.
        ``min_score`` leaves out entries that expired (locks are scored by expiry)."""
        low: Any = "-inf" if min_score is None else min_score
        try:
            if not task_name and not search:
                pipe = self.client.pipeline(transaction=False)
                pipe.zcount(index, low, "+inf")
                pipe.zrangebyscore(index, low, "+inf", start=offset, num=limit)
                total, members = pipe.execute()
                return Page(items=self._read(members, parse), total=int(total),
                            has_more=offset + limit < int(total))
            pattern = glob_escape(self.physical(f"{app_settings.KEY_PREFIX}:{kind}:"))
            pattern += glob_escape(f"{task_name}:") if task_name else ""
            pattern += f"*{glob_icase(search)}*" if search else "*"
            matches: list[tuple[bytes, float]] = []
            seen: set[bytes] = set()
            cursor = 0
            while True:
                cursor, entries = self.client.zscan(index, cursor, match=pattern,
                                                    count=SCAN_COUNT)
                for member, score in entries:
                    if (min_score is None or score >= min_score) and member not in seen:
                        seen.add(member)
                        matches.append((member, score))
                if cursor == 0 or len(matches) > offset + limit:
                    break
            page = sorted(matches[offset:offset + limit], key=lambda entry: entry[1])
            items = self._read([member for member, _score in page], parse)
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc
        return Page(items=items, total=len(matches) if cursor == 0 else None,
                    has_more=len(matches) > offset + limit)

    def release_queued(self, key: JobKey, owner: str) -> bool:
        return bool(self._call("RELEASE_QUEUED", key, owner))

    def trim_index(self) -> int:
        """Drop index entries of locks that expired (their keys are gone already)."""
        try:
            seconds, micros = self.client.time()  # the server's clock, as the scripts use
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            return int(self.client.zremrangebyscore(self.index_key(), "-inf", f"({now_ms}"))
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern (MATCH)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def glob_icase(text: str) -> str:
    """``text`` as a case-insensitive Redis glob: letters become ``[aA]`` classes."""
    return "".join(
        f"[{c.lower()}{c.upper()}]" if c.isascii() and c.isalpha() else glob_escape(c)
        for c in text
    )
