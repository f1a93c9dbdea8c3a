"""The Redis store: one EVALSHA per decision (scripts in ``scripts.py``), an index of held
locks. Where a lock is taken: :meth:`RedisStore.acquire`; checked by the worker:
:meth:`RedisStore.start`; released: :meth:`RedisStore.release`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.cache import caches

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import InvalidJobConfiguration, StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.answers import ClaimAnswer
from dedup_jobs.stores.base import (
    ADOPTED,
    CLAIM_RECORD_SECONDS,
    CLAIMED,
    DUE_TOLERANCE,
    MISSING,
    OTHER,
    WAIT,
    AcquireCall,
    Acquired,
    BaseStore,
    Debounced,
    Due,
    Renewed,
    Started,
    decode_call,
    new_request_id,
    stale_grace,
)
from dedup_jobs.stores.cache import backend_path
from dedup_jobs.stores.redis.adapters import adapter_for
from dedup_jobs.stores.redis.connection import RedisConnection, _ms, _text
from dedup_jobs.stores.redis.fused import RedisFused
from dedup_jobs.stores.redis.listing import RedisListing
from dedup_jobs.stores.redis.throttle import RedisThrottleMixin


class RedisStore(RedisFused, RedisThrottleMixin, RedisListing, RedisConnection, BaseStore):
    """Locks on a Redis-protocol cache: django-redis, Django's own RedisCache, django-valkey
    (each reached through its adapter, ``adapters.py``)."""

    can_list = True

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self.cache: Any = caches[alias]
        adapter = adapter_for(backend_path(self.cache))
        if adapter is None:
            raise InvalidJobConfiguration(
                f"dedup_jobs store {alias!r} ({backend_path(self.cache)}) is not a "
                f"Redis-protocol cache the Redis store knows: use django-redis, Django's "
                f"RedisCache or django-valkey.")
        self._init_connection(adapter)
        # Settings are read once per store instance: get_store() drops its instances when
        # CACHES or DEDUP_JOBS change, so override_settings still takes effect.
        self._indexes: dict[str, list[str]] = {}

    def physical(self, key: str) -> str:
        return str(self.cache.make_key(key))

    # -- where keys live: the one place that builds them (the cluster store overrides) ---

    def place(self, key: JobKey, index: str = "unique") -> tuple[str, str]:
        """Where ``key`` lives: its physical key (the cache's KEY_PREFIX, VERSION and key
        function applied) and the physical key of the index ``index`` ("unique",
        "debounce", ...) that lists it. Every key a script touches is one of these two or
        the physical key plus a suffix (``:rel``, ``:seen``, ...), so that on a cluster
        (:class:`~dedup_jobs.stores.redis.cluster.RedisClusterStore`) they share a slot."""
        return self.physical(key.key), self.index_keys(index)[0]

    def index_keys(self, index: str = "unique") -> list[str]:
        """Every physical key of the index ``index``: one on a single Redis, one per hash-tag
        group on a cluster."""
        found = self._indexes.get(index)
        if found is None:
            found = self._indexes[index] = [
                self.physical(f"{app_settings.KEY_PREFIX}:index:{index}")]
        return found

    def index_key(self) -> str:
        return self.index_keys("unique")[0]

    def debounce_index_key(self) -> str:
        return self.index_keys("debounce")[0]

    def _call(self, name: str, key: JobKey, *args: Any) -> Any:
        return self._eval(name, list(self.place(key)), args, key.task_name)

    def _call_with_tombstone(self, name: str, key: JobKey, *args: Any) -> Any:
        physical, index = self.place(key)
        return self._eval(name, [physical, index, f"{physical}:rel"], args, key.task_name)

    def _tombstone_ms(self) -> int:
        """How long a release tombstone answers a re-send: longer than any re-send waits."""
        return _ms(2 * self.budget + 1)

    def _debounce_keys(self, key: JobKey) -> list[str]:
        physical, index = self.place(key, "debounce")
        return [physical, f"{physical}:seen", index, f"{physical}:claimed",
                f"{physical}:claimed:seen"]

    # -- decisions ----------------------------------------------------------------------

    def acquire(
        self, key: JobKey, owner: str, ttl: float, *, now: float, reentrant: bool = False,
        request: str | None = None,
    ) -> Acquired:
        for _attempt in range(2):
            answer = _text(self._call(
                "ACQUIRE", key, owner, _ms(ttl), self.deadline_ms(), "1" if reentrant else "0",
                key.task_name, key.ident, request or "",
            ))
            if answer[0] != "L":
                return Acquired(acquired=answer[0] == "1", holder=answer[1:])
            # Refused as late, yet answered in time: the server's clock is ahead of ours.
            self.learn_skew(int(answer[1:]))
        raise StoreUnavailable(self.alias, "the server refused the acquire as late twice")

    def acquire_many(self, calls: Sequence[AcquireCall], *, now: float) -> list[Acquired]:
        """L3: every ACQUIRE of the batch pipelined on one connection (one round trip);
        a call refused as late (the server's clock ahead of ours) is made again alone."""
        deadline = self.deadline_ms()
        replies = self._send_many("ACQUIRE", [
            (list(self.place(c.key)), (c.owner, _ms(c.ttl), deadline, "0", c.key.task_name,
                                       c.key.ident, c.request)) for c in calls],
            calls[0].key.task_name if calls else "?")
        return self.acquired_answers(calls, replies, lambda call: self.acquire(
            call.key, call.owner, call.ttl, now=now, request=call.request))

    def start(
        self, key: JobKey, owner: str, lease: float, *, now: float, release: bool,
        delivery: str | None = None, redelivered: bool = False,
    ) -> Started:
        nonce = delivery or new_request_id()
        for _attempt in range(2):
            answer = self._call_with_tombstone(
                "START", key, owner, _ms(lease), nonce, "1" if release else "0", key.task_name,
                key.ident, self._tombstone_ms(), "1" if redelivered else "0", self.deadline_ms(),
            )
            if answer[0] != 5:
                return _started(answer, owner)
            self.learn_skew(int(answer[1]))  # refused as late, answered in time: clock skew
        raise StoreUnavailable(self.alias, "the server refused the worker's check as late twice")

    def release(self, key: JobKey, owner: str) -> bool:
        return bool(self._call_with_tombstone(
            "RELEASE", key, owner, new_request_id(), self._tombstone_ms()))

    def undo(self, key: JobKey, owner: str, request: str | None) -> bool:
        physical, index = self.place(key)
        return bool(self._eval("UNDO", [physical, index, f"{physical}:undo"],
                               (owner, request or "", self._tombstone_ms()), key.task_name))

    def undo_cancel(self, key: JobKey, running: JobKey, owner: str,
                    request: str | None) -> bool:
        physical, index = self.place(key)
        return bool(self._eval(
            "UNDO", [physical, index, f"{physical}:undo", self.place(running)[0]],
            (owner, request or "", self._tombstone_ms()), key.task_name))

    def renew(
        self, key: JobKey, owner: str, ttl: float, *, now: float, delivery: str | None = None
    ) -> Renewed:
        for _attempt in range(2):
            answer = _text(self._call(
                "RENEW", key, owner, _ms(ttl), self.deadline_ms(), key.task_name, key.ident,
                delivery or "",
            ))
            if answer[0] == "0":
                return Renewed(held=False, holder=answer[1:])
            if answer[0] == "C":
                return Renewed(held=True, cancel=answer[1:])
            if answer[0] != "L":
                return Renewed(held=True, retaken=answer == "2")
            self.learn_skew(int(answer[1:]))  # refused as late, answered in time: clock skew
        raise StoreUnavailable(self.alias, "the server refused the renewal as late twice")

    # -- debounce -----------------------------------------------------------------------

    def debounce(
        self, key: JobKey, task_id: str, payload: str, *, now: float, debounce_for: float,
        max_wait: float | None, ttl: float,
    ) -> Debounced:
        keys = self._debounce_keys(key)
        for _attempt in range(2):
            new, message, superseded = self._eval("DEBOUNCE", keys, (
                task_id, payload, _ms(now), _ms(debounce_for),
                "" if max_wait is None else _ms(max_wait), _ms(ttl), key.task_name, key.ident,
                self.deadline_ms(), _ms(stale_grace()),
            ), key.task_name)
            if new != 2:
                return Debounced(new=bool(new), message_id=_text(message),
                                 superseded=_text(superseded) or None)
            self.learn_skew(int(message))  # refused as late, answered in time: clock skew
        raise StoreUnavailable(self.alias, "the server refused the debounce as late twice")

    def claim_due(self, key: JobKey, message_id: str, *, now: float) -> Due:
        physical = self.place(key, "debounce")[0]
        record = f"{physical}:claim:{message_id}"  # the message's own claim record (S7)
        answer = self._eval("CLAIM", [*self._debounce_keys(key), record, f"{record}:seen"], (
            message_id, _ms(now), int(DUE_TOLERANCE * 1000), _ms(CLAIM_RECORD_SECONDS)),
            key.task_name)
        action = _text(answer[0])
        if action == CLAIMED:
            args, kwargs = decode_call(answer[2])
            return Due(action=CLAIMED, latest_id=_text(answer[1]), args=args, kwargs=kwargs,
                       absorbed=_in_order(answer[3]))
        if action == WAIT:
            return Due(action=WAIT, wait_until=int(answer[1]) / 1000)
        return Due(action=ClaimAnswer(action) if action in (OTHER, ADOPTED) else MISSING)

    def withdraw(self, key: JobKey, task_id: str) -> bool:
        return bool(self._eval("WITHDRAW", self._debounce_keys(key), (task_id,), key.task_name))

    def release_queued(self, key: JobKey, owner: str) -> bool:
        return bool(self._call("RELEASE_QUEUED", key, owner))

    # -- flow control (R1, R2) ----------------------------------------------------------

    def take_over(
        self, key: JobKey, owner: str, ttl: float, *, now: float, request: str | None = None
    ) -> Acquired:
        return self._take_over(key, None, owner, ttl, request)

    def cancel_take(
        self, key: JobKey, running: JobKey, owner: str, ttl: float, *, now: float,
        request: str | None = None,
    ) -> Acquired:
        return self._take_over(key, running, owner, ttl, request)

    def _take_over(self, key: JobKey, running: JobKey | None, owner: str, ttl: float,
                   request: str | None) -> Acquired:
        """TAKE_OVER; with ``running``, its marker is passed too (L2, cancel_take)."""
        keys = list(self.place(key))
        if running is not None:
            keys.append(self.place(running)[0])
        for _attempt in range(2):
            reply = self._eval("TAKE_OVER", keys, (
                owner, _ms(ttl), self.deadline_ms(), key.task_name, key.ident, request or ""),
                key.task_name)
            answer, cancelled = ((_text(reply[0]), _text(reply[1]) or None)
                                 if running is not None else (_text(reply), None))
            if answer[0] == "1":
                return Acquired(acquired=True, holder=owner, cancelled=cancelled)
            if answer[0] == "R":
                return Acquired(acquired=True, holder=owner, replaced=answer[1:],
                                cancelled=cancelled)
            if answer[0] == "0":
                return Acquired(acquired=False, holder=answer[1:])
            self.learn_skew(int(answer[1:]))  # refused as late, answered in time: clock skew
        raise StoreUnavailable(self.alias, "the server refused the take-over as late twice")

    def start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, *, now: float,
        delivery: str | None = None,
    ) -> Started:
        physical, index = self.place(key)
        nonce = delivery or new_request_id()
        for _attempt in range(2):
            answer = self._eval(
                "START_EXCLUSIVE", [physical, index, self.place(running)[0]],
                (owner, _ms(lease), nonce, key.task_name, key.ident, self.deadline_ms()),
                key.task_name,
            )
            if answer[0] != 5:
                return _started_exclusive(answer, owner)
            self.learn_skew(int(answer[1]))  # refused as late, answered in time: clock skew
        raise StoreUnavailable(self.alias, "the server refused the exclusive check as late twice")


def _started(answer: Any, owner: str) -> Started:
    """START's answer (see scripts.py)."""
    ok, what = answer[0], answer[1]
    if ok == 2:
        return Started(run=False, holder=owner, live=True)
    if ok == 3:
        return Started(run=False, holder=owner, done=True)
    if ok == 4:
        return Started(run=False, holder=_text(what), taken_over=int(answer[2]) / 1000)
    if not ok:
        return Started(run=False, holder=_text(what))
    what = _text(what)
    return Started(run=True, holder=None, took=what == "taken", released=what == "released")


def _started_exclusive(answer: Any, owner: str) -> Started:
    """START_EXCLUSIVE's answer (see scripts.py)."""
    ok, what = answer[0], _text(answer[1])
    if ok == 4:
        return Started(run=False, holder=what, taken_over=int(answer[2]) / 1000)
    if ok == 3:
        return Started(run=False, holder=what, overlap=True)
    if ok == 2:
        return Started(run=False, holder=owner, live=True)
    if not ok:
        return Started(run=False, holder=what)
    return Started(run=True, holder=None, took=True, released=what == "released")


def _in_order(flat: list[Any]) -> tuple[str, ...]:
    """The burst's dispatch ids from the "seen" hash (id, "n|superseded", ...), in order."""
    pairs = [(int(_text(flat[i + 1]).split("|", 1)[0]), _text(flat[i]))
             for i in range(0, len(flat), 2)]
    return tuple(task_id for _n, task_id in sorted(pairs))

