"""The generic Django-cache store: ``cache.add`` takes a lock ("must create", as Django's
cache session backend does). Atomic on locmem and memcached; the database and file caches
are accepted with a system-check warning; DummyCache is refused.

Release, renew, the worker check and a re-entrant acquire read, decide, then write. On
memcached (``PyMemcacheCache``) the read is ``gets`` and the write is guarded by its ``cas``
token (a compare-and-delete is a ``cas`` to an already-expired item, see
``stores/memcached.py``): if the lock changed hands between the two — it expired and another
owner took it — the write does nothing and the store decides again on what is there now, so a
former owner never deletes, renews or overwrites a new owner's lock. Other caches (locmem, a
single process; the database and file caches, not atomic anyway) have no ``cas``: their write
is a plain ``set``/``delete``, and a lock that expires between the two calls can be deleted or
overwritten by its former owner (a renewal that finds the key free takes it back with
``add``, so that step never overwrites a lock taken meanwhile).

Debounce state is a dict at the debounce key, read and written under a short mutex taken with
``cache.add`` (so it is as atomic as ``add`` is) and let go by compare-and-delete of its
token; each dispatch id of a burst sits in a key of its own (``{key}:ids:{message id}:{n}``),
so a dispatch costs O(1) whatever the burst's size.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast
from uuid import uuid4

from django.core.cache import caches

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import InvalidJobId
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import (
    ADOPTED,
    CLAIM_RECORD_SECONDS,
    CLAIMED,
    DUE_TOLERANCE,
    MISSING,
    OTHER,
    QUEUED,
    RUNNING,
    WAIT,
    Acquired,
    BaseStore,
    Debounced,
    DebounceState,
    Due,
    LockInfo,
    Renewed,
    Started,
    decode_call,
    stale_grace,
)
from dedup_jobs.stores.cache_calls import DjangoCacheCalls
from dedup_jobs.stores.cache_debounce import CacheDebounceMixin, due_of
from dedup_jobs.stores.cache_flow import CacheFlowMixin, taken_over_age
from dedup_jobs.stores.retry import AGAIN, Again, decide

if TYPE_CHECKING:
    from dedup_jobs.stores.memcached import MemcachedClient

NON_ATOMIC_BACKENDS = (
    "django.core.cache.backends.db.DatabaseCache",
    "django.core.cache.backends.filebased.FileBasedCache",
)
DUMMY_BACKEND = "django.core.cache.backends.dummy.DummyCache"
LOCAL_BACKEND = "django.core.cache.backends.locmem.LocMemCache"
MEMCACHED_BACKEND = "django.core.cache.backends.memcached.PyMemcacheCache"


def backend_path(cache: Any) -> str:
    return f"{type(cache).__module__}.{type(cache).__qualname__}"


F = TypeVar("F", bound=Callable[..., Any])


def decision(method: F) -> F:
    """One decision of the store: its cache calls share one STORE_TIMEOUT (S8)."""

    @functools.wraps(method)
    def run(self: CacheStore, *args: Any, **kwargs: Any) -> Any:
        with self.calls.decision():
            return method(self, *args, **kwargs)

    return cast(F, run)


class CacheStore(CacheFlowMixin, CacheDebounceMixin, BaseStore):
    """Locks in any Django cache, as dicts: ``{"owner", "state", "acquired", "expires", ...}``."""

    cannot_list_reason = (
        "this cache cannot list its keys; use a django-redis cache or the database store "
        "to see held locks"
    )

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self.cache: Any = caches[alias]
        path = backend_path(self.cache)
        self.atomic = path not in NON_ATOMIC_BACKENDS
        from django.core.cache.backends.memcached import BaseMemcachedCache, PyMemcacheCache

        #: memcached refuses keys with spaces or control characters, or over 250 bytes
        self.strict_keys = isinstance(self.cache, BaseMemcachedCache)
        from django.core.cache.backends.db import DatabaseCache

        #: Django's database cache keeps a key in a column of 255 characters (PostgreSQL and
        #: MariaDB refuse a longer one, and the cache takes the refusal for a miss)
        self.key_column = 255 if isinstance(self.cache, DatabaseCache) else None
        self.calls: DjangoCacheCalls | MemcachedClient
        if isinstance(self.cache, PyMemcacheCache):
            from dedup_jobs.stores.memcached import MemcachedClient

            self.calls = MemcachedClient(alias, self.cache)
        else:
            self.calls = DjangoCacheCalls(alias)
        #: writes are guarded by memcached's cas token (a changed lock is decided again)
        self.guarded = not isinstance(self.calls, DjangoCacheCalls)

    def close(self) -> None:
        self.calls.close()

    def key_problem(self, key: JobKey, *, message: str = "0" * 36) -> str | None:
        """On memcached, every cache key the store writes for ``key`` (the longest: a
        debounce's per-dispatch id keys) must pass the cache's own key check, after its
        KEY_PREFIX, VERSION and KEY_FUNCTION (a key function that hashes makes any id fit)."""
        if not self.strict_keys and self.key_column is None:
            return None
        from django.core.cache.backends.base import InvalidCacheKey

        # the longest key written for it: a debounce's per-dispatch id keys; a lock's
        # running marker's undo tombstone (R2, S7)
        longest = f"{key.key}:run:undo"
        if key.key.startswith(f"{app_settings.KEY_PREFIX}:debounce:"):
            longest = self._ids_key(key, message, 999_999)  # (a generated id: 36)
        made = self.cache.make_key(longest)
        fix = ("Return an id short enough (e.g. a hash of it), set a KEY_FUNCTION on the "
               "cache that hashes keys, or use a django-redis cache or the database store.")
        if self.key_column is not None:
            if len(made) > self.key_column:
                return (f"Django's database cache keeps keys of at most {self.key_column} "
                        f"characters, and this id makes one of {len(made)}. {fix}")
            return None
        try:
            self.cache.validate_key(made)
        except InvalidCacheKey as exc:
            return (f"memcached cannot hold in a key ({exc}). Return an id without spaces "
                    f"or control characters and short enough (e.g. a hash of it), set a "
                    f"KEY_FUNCTION on the cache that hashes keys, or use a django-redis "
                    f"cache or the database store.")
        if len(made.encode("utf-8")) > 250:  # Django counts characters, memcached bytes
            return (f"memcached keeps keys of at most 250 bytes, and this id makes one of "
                    f"{len(made.encode('utf-8'))} (in UTF-8). {fix}")
        return None

    def _value(self, key: JobKey, owner: str, state: str, now: float, ttl: float,
               acquired: float | None = None) -> dict[str, Any]:
        return {
            "owner": owner, "state": state, "acquired": now if acquired is None else acquired,
            "expires": now + ttl, "task": key.task_name, "id": key.ident,
        }

    # Every loop below reads (gets), decides, and writes guarded by the read's cas token:
    # a write that finds the lock changed (False) or gone (None) since the read decides again.

    def _in_time(self, deadline_ms: int) -> None:
        """S7: refuse a dispatch decision about to write past its caller's deadline. A cache
        has no clock of its own to read in the decision: this is the caller's clock, checked
        before each write (memcached: a write delayed in the network after the check still
        lands; only the Redis family and the database store check on the server's clock)."""
        now_ms = time.time() * 1000
        if now_ms > deadline_ms:
            raise self.late(deadline_ms, now_ms)

    def _tombstone_seconds(self) -> float:
        """How long a release tombstone answers a re-send: longer than any re-send waits."""
        return 2 * app_settings.STORE_TIMEOUT + 1

    @decision
    def acquire(
        self, key: JobKey, owner: str, ttl: float, *, now: float, reentrant: bool = False,
        request: str | None = None,
    ) -> Acquired:
        calls = self.calls
        deadline = self.deadline_ms()
        value = {**self._value(key, owner, QUEUED, now, ttl), "req": request or ""}

        def attempt() -> Acquired | Again:
            self._in_time(deadline)
            if calls.add(key.key, value, ttl):
                return Acquired(acquired=True, holder=owner)
            current, token = calls.gets(key.key)
            if current is None:
                return AGAIN  # expired between add and get: try again
            if request and current["owner"] == owner and current.get("req") == request:
                return Acquired(acquired=True, holder=owner)  # this request made again (S7)
            if reentrant and current["owner"] == owner:
                if calls.cas(key.key, value, token, ttl):
                    return Acquired(acquired=True, holder=owner)
                return AGAIN
            return Acquired(acquired=False, holder=str(current["owner"]))

        return decide(self.alias, key.key, attempt)

    @decision
    def start(
        self, key: JobKey, owner: str, lease: float, *, now: float, release: bool,
        delivery: str | None = None, redelivered: bool = False,
    ) -> Started:
        delivery = delivery or str(uuid4())
        # S7: a check that reaches the store past its caller's deadline (the worker ran W4 or
        # deferred already) writes nothing: its re-send, with a deadline of its own, does
        calls, deadline = self.calls, self.deadline_ms()

        def attempt() -> Started | Again:
            current, token = calls.gets(key.key)
            if current is not None and current["owner"] != owner:
                return Started(run=False, holder=str(current["owner"]),
                               taken_over=taken_over_age(current, owner, now))
            if (not release and current is not None and current["state"] == RUNNING
                    and current.get("run", delivery) != delivery):
                return Started(run=False, holder=owner, live=True)  # W5: another delivery runs
            self._in_time(deadline)
            if release:
                if current is None:
                    return Started(run=True, holder=None)
                if calls.cas_delete(key.key, token):
                    return Started(run=True, holder=None, released=True)
                return AGAIN
            if current is None:
                value = {**self._value(key, owner, RUNNING, now, lease), "run": delivery,
                         "took": True}
                if calls.add(key.key, value, lease):
                    return Started(run=True, holder=None, took=True)
                return AGAIN  # somebody took it in between: decide again on what is there now
            took = current.get("run") == delivery and bool(current.get("took"))  # re-sent (S7)
            value = self._value(key, owner, RUNNING, now, lease, acquired=current["acquired"])
            if calls.cas(key.key, {**value, "run": delivery, "took": took}, token, lease):
                return Started(run=True, holder=None, took=took)
            return AGAIN

        return decide(self.alias, key.key, attempt)

    @decision
    def release(self, key: JobKey, owner: str) -> bool:
        """Compare-and-delete, leaving a short tombstone of ``owner`` (S7: the release made
        again after a lost reply answers True, as the first did)."""
        calls = self.calls
        tombstone = f"{key.key}:rel"

        def attempt() -> bool | Again:
            current, token = calls.gets(key.key)
            if current is None or current["owner"] != owner:
                return bool(calls.get(tombstone) == owner)
            if calls.cas_delete(key.key, token):
                calls.set_many({tombstone: owner}, self._tombstone_seconds())
                return True
            return AGAIN

        return decide(self.alias, key.key, attempt)

    @decision
    def renew(
        self, key: JobKey, owner: str, ttl: float, *, now: float, delivery: str | None = None
    ) -> Renewed:
        calls, deadline = self.calls, self.deadline_ms()

        def attempt() -> Renewed | Again:
            current, token = calls.gets(key.key)
            if current is None:
                # Gone (evicted, flushed, expired, released): take it back, "must create",
                # under the running delivery's nonce as start() leaves it (W5); S7: not past
                # the caller's deadline (a late renewal: the run may have ended and released)
                value = self._value(key, owner, RUNNING, now, ttl)
                if delivery:
                    value.update(run=delivery, took=False)
                self._in_time(deadline)
                if calls.add(key.key, value, ttl):
                    return Renewed(held=True, retaken=True)
                return AGAIN  # somebody took it in between: decide on what is there now
            if current["owner"] != owner:
                return Renewed(held=False, holder=str(current["owner"]))
            cancel = current.get("cancel") or None  # L2: a dispatch asked this run to stop
            if current["expires"] >= now + ttl:
                return Renewed(held=True, cancel=cancel)
            if calls.cas(key.key, {**current, "expires": now + ttl}, token, ttl):
                return Renewed(held=True, cancel=cancel)
            return AGAIN

        return decide(self.alias, key.key, attempt)

    @decision
    def get(self, key: JobKey) -> LockInfo | None:
        current = self.calls.get(key.key)
        if current is None:
            return None
        return LockInfo(
            key=key.key, task_name=current["task"], ident=current["id"],
            owner=current["owner"], state=current["state"], acquired_at=current["acquired"],
            expires_at=current["expires"], store=self.alias,
        )

    # -- debounce -----------------------------------------------------------------------

    @decision
    def debounce(
        self, key: JobKey, task_id: str, payload: str, *, now: float, debounce_for: float,
        max_wait: float | None, ttl: float,
    ) -> Debounced:
        # an explicit task id longer than a generated one: its burst's keys may not fit
        problem = self.key_problem(key, message=task_id) if len(task_id) > 36 else None
        if problem:
            raise InvalidJobId(key.task_name, "apply_async(task_id=...)", task_id, problem)
        deadline = self.deadline_ms()
        seen = self._seen_key(key, task_id)
        with self._mutex(key):
            found = self.calls.get_many([key.key, seen])
            if seen in found:  # S7: this dispatch made again: the first one's answer
                message, superseded = found[seen]
                return Debounced(new=message == task_id, message_id=message,
                                 superseded=superseded)
            state = found.get(key.key)
            superseded = None
            writes: dict[str, Any] = {}
            if state is None or state["expires"] <= now or due_of(state) + stale_grace() < now:
                # D9: a stale burst's ids are adopted by the new one, whose run answers them
                adopted = [] if state is None or state["expires"] <= now else self._ids(key, state)
                writes = {self._ids_key(key, task_id, n): old
                          for n, old in enumerate(adopted, start=1)}
                state = {
                    "message": task_id, "latest": task_id, "payload": payload, "first": now,
                    "last": now, "run_at": now + debounce_for, "count": 1,
                    "deadline": None if max_wait is None else now + max_wait,
                    "task": key.task_name, "id": key.ident, "base": len(adopted),
                }
            else:
                superseded = state["latest"]
                state = {**state, "latest": task_id, "payload": payload, "last": now,
                         "run_at": now + debounce_for, "count": state["count"] + 1,
                         "previous": (superseded, state["payload"])}
            timeout = due_of(state) - now + ttl
            state["expires"] = now + timeout
            n = state.get("base", 0) + state["count"]
            self._in_time(deadline)
            self.calls.set_many({
                **writes, key.key: state, self._ids_key(key, state["message"], n): task_id,
                seen: (state["message"], superseded),
            }, timeout)
        return Debounced(new=superseded is None, message_id=state["message"],
                         superseded=superseded)

    @decision
    def claim_due(self, key: JobKey, message_id: str, *, now: float) -> Due:
        # S7: the claim record of this message (one per message, so a later burst's claim
        # never hides it from this claim made again)
        claimed = f"{key.key}:claimed:{message_id}"
        with self._mutex(key):
            found = self.calls.get_many([key.key, claimed])
            state, record = found.get(key.key), found.get(claimed)
            if record is not None and record[0] == message_id and (
                    state is None or state["message"] != message_id):
                # S7: this claim made again (its reply lost): the first claim's answer
                args, kwargs = decode_call(record[2])
                return Due(action=CLAIMED, latest_id=record[1], args=args, kwargs=kwargs,
                           absorbed=tuple(record[3]))
            if state is None:
                return Due(action=MISSING)
            if state["message"] != message_id:
                adopted = message_id in self._ids(key, state)
                return Due(action=ADOPTED if adopted else OTHER)
            due = due_of(state)
            if due - now > DUE_TOLERANCE:
                return Due(action=WAIT, wait_until=due)
            absorbed = self._ids(key, state)
            self.calls.set_many({claimed: (message_id, state["latest"], state["payload"],
                                           absorbed)}, CLAIM_RECORD_SECONDS)
            self.calls.delete_many([key.key, *self._id_names(key, state)])
        args, kwargs = decode_call(state["payload"])
        return Due(action=CLAIMED, latest_id=state["latest"], args=args, kwargs=kwargs,
                   absorbed=tuple(absorbed))

    @decision
    def get_debounce(self, key: JobKey) -> DebounceState | None:
        state = self.calls.get(key.key)
        if state is None or "message" not in state:
            return None
        args, kwargs = decode_call(state["payload"])
        return DebounceState(
            key=key.key, task_name=state["task"], ident=state["id"], count=state["count"],
            first_dispatch_at=state["first"], last_dispatch_at=state["last"],
            runs_at=due_of(state), deadline=state["deadline"], message_id=state["message"],
            latest_id=state["latest"], args=args, kwargs=kwargs, store=self.alias,
        )

