"""T2/T3, the throttle stage of every kind, in one store call (``store.throttle_admit``).

Admitted: the run goes on, holding the returned slot (``concurrency``) or nothing (a rate
alone touches the store only here). Deferred: ``job_deferred`` is sent and ``again(countdown)``
publishes the message once more (same task id) for when the store's answer says a slot or a
start is due; the front-end then ends the delivery, the worker process is free meanwhile.
The store cannot answer (W7): the message waits for it (``engine/store_errors.py``), or runs
and the lease settles what the lost call may have taken (W4)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.engine.message import Message, logger
from dedup_jobs.engine.store_errors import defer_for_store
from dedup_jobs.engine.throttle import Rate, Slot
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import job_deferred, notify
from dedup_jobs.stores.answers import Admission
from dedup_jobs.stores.base import BaseStore, new_request_id


@dataclass(frozen=True, kw_only=True)
class Throttled:
    """What the throttle stage decided."""

    slot: Slot | None  # the concurrency slot the run holds (None: no slot to hold)
    waits: bool = False  # published again for later: the front-end ends this delivery


def admit(message: Message, key: JobKey, alias: str, store: BaseStore, *, concurrency: int,
          rate: Rate | None, again: Callable[[float], None], wakes: bool = False) -> Throttled:
    """Admit ``message`` under the throttle key ``key`` (see the module docstring).
    ``wakes``: the front-end brings a waiter's message forward when a release calls it (the
    wake, ``release_slot``); a store that can wake then plans a waiter's turn later."""
    owner = message.owner
    delivery = new_request_id()

    def ask(through: BaseStore) -> Admission:
        extra = {"wakes": True} if wakes and getattr(through, "can_wake", False) else {}
        return cast(Any, through).throttle_admit(  # type: ignore[no-any-return]
            key, owner, delivery=delivery, concurrency=concurrency,
            rate_limit=rate.limit if rate else 0, rate_period=rate.period if rate else 1.0,
            lease=app_settings.LEASE_SECONDS, **extra)

    try:
        answer = ask(store)
    except StoreUnavailable:
        # W7, no re-send: the copy (same task id) takes over the slot the lost call may have
        # taken (that grant superseded: its re-send answers RELEASED), or the slot lapses
        if defer_for_store(message, key, alias, "throttle check", again):
            return Throttled(slot=None, waits=True)
        # Run after all: a slot the lost call may have taken is settled by the lease (W4).
        return Throttled(slot=Slot(store=store, key=key, owner=owner, limit=concurrency,
                                   resend=lambda through: ask(through).admitted)
                         if concurrency else None)
    if answer.admitted:
        return Throttled(slot=Slot(store=store, key=key, owner=owner, limit=concurrency,
                                   held=answer.held) if concurrency else None)
    # The store's answer holds the jitter (T2: up to a quarter of a wait for a slot, at most
    # 1 s, part of the waiter's turn; T3: none, the reserved start times are spread already)
    wait = max(0.0, answer.until - clock.now())
    metrics.decision(message.name, "deferred", key.key)
    notify(job_deferred, message.sender, task_id=owner, key=key.key, reason=str(answer.reason),
           until=clock.now() + wait, observed=message.observing)
    if message.observing:
        logger.info("%s[%s]: observe-only: would have waited %.2fs (%s of %s); runs now.",
                    message.name, owner, wait, answer.reason, key.key)
        return Throttled(slot=None)
    logger.info("%s[%s]: %s limit of %s reached; this message waits %.2fs.", message.name,
                owner, answer.reason, key.key, wait)
    again(wait)
    return Throttled(slot=None, waits=True)
