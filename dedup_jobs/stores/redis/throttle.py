"""Throttling on the Redis store (T2-T5): one EVALSHA per admission decision, one per slot
release, one per slot renewal (scripts in ``throttle_scripts.py``), and the admin's page of
throttle keys through their index."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores import throttling as plan
from dedup_jobs.stores.answers import ThrottleAnswer
from dedup_jobs.stores.base import (
    RELEASED,
    THROTTLE_GRACE,
    Admission,
    Page,
    Released,
    Renewed,
    ThrottleState,
)
from dedup_jobs.stores.redis.connection import _text

#: the five keys of one throttle key (see throttle_scripts.py), as suffixes of it
SUFFIXES = ("", ":slots", ":wait", ":starts", ":res", ":done")


class RedisThrottleMixin:
    """``throttle_*`` for :class:`~dedup_jobs.stores.redis.store.RedisStore`."""

    alias: str
    client: Any
    budget: float
    _errors: tuple[type[BaseException], ...]

    if TYPE_CHECKING:  # provided by RedisStore, RedisConnection and RedisListing
        def physical(self, key: str) -> str: ...
        def _eval(self, name: str, keys: list[str], args: Any, job: str = "?") -> Any: ...
        def deadline_ms(self) -> int: ...
        def learn_skew(self, server_ms: int) -> None: ...
        def place(self, key: JobKey, index: str = "unique") -> tuple[str, str]: ...
        def index_keys(self, index: str = "unique") -> list[str]: ...
        def logical(self, key: str) -> str: ...
        def _page(self, kind: str, parse: Any, *, offset: int, limit: int,
                  task_name: str, search: str, min_score: int | None) -> Page[Any]: ...

    def throttle_index_key(self) -> str:
        """The index of throttle keys (on a cluster: its first shard; every shard is
        ``index_keys("throttle")``)."""
        return self.index_keys("throttle")[0]

    def _throttle_keys(self, key: JobKey) -> list[str]:
        """Every key a throttle script touches, built in this one place by the store's
        :meth:`place` (on a cluster: the throttle key's hash tag, and its index shard in the
        same slot)."""
        physical, index = self.place(key, "throttle")
        return [physical + suffix for suffix in SUFFIXES] + [index]

    can_throttle = True

    def admit_arguments(
        self, key: JobKey, owner: str, *, delivery: str, concurrency: int, rate_limit: int,
        rate_period: float, lease: float, deadline_ms: int, wakes: bool = False,
    ) -> tuple[Any, ...]:
        """THROTTLE_ADMIT's ARGV, in the one place that knows their order (the admin's
        scale test fills its keys with it too)."""
        return (
            owner, delivery, concurrency, _ms(lease), rate_limit, _ms(rate_period),
            key.task_name, key.ident, deadline_ms, _ms(lease / 3),
            _ms(THROTTLE_GRACE), plan.limit_text(concurrency, rate_limit, rate_period),
            _ms(plan.ASSUMED_RUN), plan.margin_ms(rate_limit, rate_period),
            f"{random.random():.6f}", plan.TURN_FACTOR, _ms(plan.TURN_PAD), plan.HELD_BACK,
            plan.WAKE_STRETCH if wakes else 0, _ms(plan.WAKE_AFTER),
        )

    def throttle_admit(
        self, key: JobKey, owner: str, *, delivery: str, concurrency: int, rate_limit: int,
        rate_period: float, lease: float, wakes: bool = False,
    ) -> Admission:
        """See :meth:`BaseStore.throttle_admit`; ``wakes``: the caller's front-end brings a
        waiter forward when a release calls it (:meth:`throttle_release_waking`), so its turn
        is planned later on purpose (``WAKE_STRETCH``)."""
        keys = self._throttle_keys(key)
        for _attempt in range(2):
            answer = self._eval("THROTTLE_ADMIT", keys, self.admit_arguments(
                key, owner, delivery=delivery, concurrency=concurrency, rate_limit=rate_limit,
                rate_period=rate_period, lease=lease, deadline_ms=self.deadline_ms(),
                wakes=wakes,
            ), key.task_name)
            if answer[0] == 1:
                return Admission(admitted=True, held=len(answer) > 2 and answer[2] == 1)
            if answer[0] == 3:  # a grant released or superseded already (S7, fates)
                return Admission(admitted=False, reason=RELEASED, until=time.time())
            if answer[0] == 0:
                # ``until`` on our clock: the server's wait added to our now (no skew)
                wait = (int(answer[2]) - int(answer[3])) / 1000
                return Admission(admitted=False, reason=ThrottleAnswer(_text(answer[1])),
                                 until=time.time() + wait)
            self.learn_skew(int(answer[1]))  # refused as late, answered in time: clock skew
        raise StoreUnavailable(self.alias, "the server refused the admission as late twice")

    def _slot_keys(self, key: JobKey) -> list[str]:
        """The hash, the slots and the tombstones: the keys of a release or a renewal."""
        keys = self._throttle_keys(key)
        return [keys[0], keys[1], keys[5]]

    def throttle_release(self, key: JobKey, owner: str) -> bool:
        return bool(self._eval("THROTTLE_RELEASE", self._slot_keys(key), (owner,),
                               key.task_name))

    #: a release can call the waiter of the earliest turn (:meth:`throttle_release_waking`)
    can_wake = True

    def throttle_release_waking(self, key: JobKey, owner: str, wake_after: float) -> Released:
        """:meth:`throttle_release`, and in the same round trip: while fewer waiters are on
        their way than slots are free, the waiter of the earliest turn more than
        ``wake_after`` seconds away has its turn moved to now and is named in the answer
        (see THROTTLE_RELEASE)."""
        keys = self._throttle_keys(key)
        answer = self._eval("THROTTLE_RELEASE", [keys[0], keys[1], keys[5], keys[2]],
                            (owner, _ms(wake_after), _ms(app_settings.LEASE_SECONDS)),
                            key.task_name)
        if isinstance(answer, list):
            return Released(freed=True, wake=_text(answer[1]))
        return Released(freed=bool(answer))

    def throttle_renew(self, key: JobKey, owner: str, ttl: float, *, limit: int) -> Renewed:
        keys = self._slot_keys(key)
        for _attempt in range(2):
            answer = _text(self._eval("THROTTLE_RENEW", keys, (
                owner, _ms(ttl), limit, self.deadline_ms()), key.task_name))
            if answer == "0":
                return Renewed(held=False, holder="(every slot taken)")
            if answer == "4":
                return Renewed(held=False, holder="(released by its owner)")
            if not answer.startswith("L"):
                return Renewed(held=True, retaken=answer == "2")
            self.learn_skew(int(answer[1:]))  # refused as late, answered in time: clock skew
        raise StoreUnavailable(self.alias, "the server refused the renewal as late twice")

    # -- the admin's page (T5) -------------------------------------------------------------

    def _throttle_state(
        self, physical: str, fields: dict[bytes, bytes]
    ) -> tuple[ThrottleState, str, int] | None:
        """(the key's state without its counts, its physical key, its period in ms)."""
        if not fields or b"task" not in fields:
            return None
        data = {_text(k): _text(v) for k, v in fields.items()
                if not k.startswith((b"s:", b"g:"))}
        at = physical.find(f"{app_settings.KEY_PREFIX}:throttle:")
        state = ThrottleState(
            key=self.logical(physical[at:] if at >= 0 else physical), task_name=data["task"],
            ident=data.get("id", ""), limit=data.get("limit", ""), running=0, starts=0,
            deferred=0, store=self.alias,
        )
        return state, physical, int(data.get("p", "0"))

    def throttle_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[ThrottleState]:
        """A page of the index (as Held locks), then the page's counts in one pipeline."""
        page = self._page("throttle", self._throttle_state,
                          offset=offset, limit=limit, task_name=task_name, search=search,
                          min_score=int(now * 1000))
        if not page.items:
            return page
        now_ms = int(now * 1000)
        try:
            pipe = self.client.pipeline(transaction=False)
            for _item, physical, period in page.items:
                pipe.zcount(f"{physical}:slots", now_ms, "+inf")
                pipe.zcount(f"{physical}:starts", f"({now_ms - period}", "+inf")
                pipe.zcount(f"{physical}:wait", now_ms - _ms(THROTTLE_GRACE), "+inf")
                pipe.zcount(f"{physical}:res", now_ms - _ms(THROTTLE_GRACE), "+inf")
            counts = pipe.execute()
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc
        items = []
        for at, (item, _physical, period) in enumerate(page.items):
            running, starts, waiting, reserved = counts[4 * at:4 * at + 4]
            items.append(ThrottleState(
                key=item.key, task_name=item.task_name, ident=item.ident, limit=item.limit,
                running=int(running), starts=int(starts) if period else 0,
                deferred=int(waiting) + int(reserved), store=item.store))
        return Page(items=items, total=page.total, has_more=page.has_more)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
