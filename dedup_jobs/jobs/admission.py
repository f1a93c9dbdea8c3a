"""The worker-side admission stage of the unique kinds: every message of a ``UniqueJob`` or
``UniqueUntilProcessingJob`` that reaches a worker, by any entry path (W2), passes
:func:`admit` before its body runs, in one store call (``store.start``). There it is

- **admitted**: its lock is free or its own (W1): it runs;
- **skipped**: another owner holds its lock (W3): the body never runs, the result ends
  ``REVOKED`` (``SUCCESS``/``None`` inside a group or chord), later chain links too;
- **put off**: another delivery of this very message is running (W5): published again with a
  countdown, same task id, the result untouched;
- **deferred** (R2, ``without_overlapping``): another run of its key is in progress: published
  again with a countdown, same task id, keeping its lock (``job_deferred``);
- **throttled** (T2/T3, :func:`admit_throttle`, before the lock check, on every kind): every
  concurrency slot of its throttle key is taken, or its rate allows no start now: published
  again (same task id, its lock kept) for when the store says a slot or a start is due
  (``job_deferred`` reason ``"concurrency"`` / ``"throttle"``);
- **replaced** (R1): its result is already REVOKED by the dispatch that took its lock over:
  the body never runs and the result is left as it is;
- **observed** (R3, observe-only): every decision above is taken and reported
  (``observed=True``, a log line), then the message runs as a plain task would;
- **dropped**: a copy the broker redelivered after the first run finished (W5);
- **run unchecked**: no key can be computed (W4);
- **run, reconciled**: the lock check cannot reach the store (W4): the body runs and the
  lease thread re-sends the same check (same delivery nonce) until the store answers, then
  holds what it granted (``Admitted.resend``, ``Slot.resend``);
- **deferred for the store** (W7): a limit's admission, or a replace job's lock check (R1),
  cannot reach the store: published again (same task id, ``job_deferred`` reason
  ``"store_error"``); no limit exceeded, no replaced holder running beside its replacement.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore
from celery.states import REVOKED

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs import takeover
from dedup_jobs.jobs.base import logger
from dedup_jobs.jobs.chains import revoke_rest_of_chain
from dedup_jobs.jobs.request import REDELIVERED, finished, is_redelivered
from dedup_jobs.jobs.store_errors import defer_for_store, holds_after
from dedup_jobs.jobs.throttle import Slot, parse_rate, release_slot
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import (
    job_deferred,
    lock_acquired,
    lock_released,
    notify,
    unique_job_skipped,
)
from dedup_jobs.stores.base import Admission, BaseStore, Started, new_request_id, running_key

if TYPE_CHECKING:
    from dedup_jobs.jobs.unique import UniqueJob

#: dedup header of a duplicate published in observe-only mode (R3): the holder it would have
#: been deduplicated onto; the dispatch reported it, the worker runs it without a check
OBSERVED = "observed"
#: dedup header: how many times the message was deferred for an overlapping run (R2)
DEFERRED = "deferred"
#: dedup header of a copy deferred because its exclusive check could not reach the store
#: (W7): that check's delivery nonce, so the copy re-sends the very same call (S7) and finds
#: the running marker the lost call may have taken as its own
NONCE = "nonce"


class PutOff(Ignore):
    """W5: this delivery waits for its first delivery's run (re-published); ends as Ignore."""


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """What :func:`admit` let through."""

    run: bool  # False: skipped inside a group or chord, the job returns None
    owner: str
    store: BaseStore | None = None  # None (with key): no key could be computed, run unchecked
    key: JobKey | None = None
    alias: str = ""
    delivery: str | None = None  # this delivery's nonce (W5), kept by the lease (W6)
    marker: JobKey | None = None  # R2: the running marker this run holds (leased, released)
    slot: Slot | None = None  # T2: the concurrency slot this run holds (leased, released)
    #: W4: the check whose reply was lost, re-sent by the lease thread (see lease.py)
    resend: Callable[[BaseStore], bool] | None = None
    #: W7: the check was a re-send (a copy deferred for the store): renew at once
    resent: bool = False


def admit(job: UniqueJob, args: Any, kwargs: Any) -> Admitted:
    """Decide the message being executed by ``job``; raises ``Ignore`` when it must end
    without running (skipped, put off, dropped). A message let through to its body is
    counted ``ran`` here (A5); the other outcomes where they are decided."""
    admitted = _decide(job, args, kwargs)
    if admitted.run:
        metrics.decision(job.name, "ran")
    return admitted


def _decide(job: UniqueJob, args: Any, kwargs: Any) -> Admitted:
    request = job.request
    owner = str(request.id)
    header = job.header()
    try:
        if header is not None:
            key, alias = job.key_from_header(header), str(header["via"])
        else:
            key, alias = job.job_key(args, kwargs), job.store_alias()
    except Exception:
        logger.warning("%s[%s]: no dedup key could be computed; running unchecked.",
                       job.name, owner, exc_info=True)
        return Admitted(run=True, owner=owner)
    observing = job.observing()
    if observing and header is not None and header.get(OBSERVED):
        return Admitted(run=True, owner=owner)  # R3: reported at dispatch, runs as it is
    if job.on_duplicate == "replace" and not observing and replaced(job, owner):
        logger.info("%s[%s]: replaced by a later dispatch (its result is REVOKED); not run.",
                    job.name, owner)
        revoke_rest_of_chain(job, f"task {owner} was replaced by a later dispatch")
        raise Ignore()
    store = job.store(alias)
    redelivered = is_redelivered(request, header)
    if redelivered and finished(job, owner):
        # W5: the first delivery ran to its end; this copy is dropped, its result kept.
        logger.info("%s[%s]: redelivered copy of a finished run dropped.", job.name, owner)
        raise Ignore()
    slot = admit_throttle(job, args, kwargs, lambda countdown: republish(
        job, args, kwargs, key, alias, countdown, {REDELIVERED: redelivered}))
    try:
        admitted = check_lock(job, args, kwargs, key, alias, store, header, redelivered)
    except PutOff:  # W5: a slot held already is the live first run's: it releases it
        if slot is None or not slot.held:
            release_slot(job.name, slot)
        raise
    except BaseException:
        release_slot(job.name, slot)  # the lock check ended it: skipped, deferred
        raise
    if not admitted.run or slot is None:
        release_slot(job.name, slot)  # skipped inside a group or chord: it does not run
        return admitted
    return replace(admitted, slot=slot)


def check_lock(
    job: UniqueJob, args: Any, kwargs: Any, key: JobKey, alias: str, store: BaseStore,
    header: dict[str, Any] | None, redelivered: bool,
) -> Admitted:
    """W1/W3/W5/R2: the lock check of a message, one store call."""
    request = job.request
    owner = str(request.id)
    observing = job.observing()
    delivery = str((header or {}).get(NONCE) or new_request_id())
    exclusive = job.without_overlapping and job.release_on_start
    lease = app_settings.LEASE_SECONDS

    def check(through: BaseStore) -> Started:
        if exclusive:
            return through.start_exclusive(key, running_key(key), owner, lease,
                                           now=clock.now(), delivery=delivery)
        return through.start(key, owner, lease, now=clock.now(), release=job.release_on_start,
                             delivery=delivery, redelivered=redelivered)

    try:
        started = check(store)
    except StoreUnavailable:
        if exclusive or job.on_duplicate == "replace":
            # W7: R2 is a limit; R1 may replace a holder the store thinks queued (#fates)
            defer_for_store(job, key, alias, "worker check", lambda countdown: republish(
                job, args, kwargs, key, alias, countdown,
                {REDELIVERED: redelivered, NONCE: delivery}))
        logger.warning("%s[%s]: store %r unavailable at the worker check; running (what the "
                       "check did is settled when the store answers).", job.name, owner,
                       alias, exc_info=True)
        return Admitted(run=True, owner=owner, store=store, key=key, alias=alias,
                        delivery=delivery,
                        marker=running_key(key) if exclusive else None,
                        resend=lambda through: holds_after(check(through), job.release_on_start
                                                      and not exclusive))
    if started.done:
        # W5: the first delivery's run has just released the lock; its result is being stored.
        logger.info("%s[%s]: redelivered copy of a run that just ended dropped.", job.name, owner)
        raise Ignore()
    if started.live:
        put_off(job, args, kwargs, key, alias, redelivered)
    if started.overlap:
        return defer(job, args, kwargs, key, alias, store, started, header, redelivered)
    if started.taken_over is not None and not observing:
        # R1/S7: taken over by a dispatch that may have failed: skip only once confirmed
        waited = float((header or {}).get(takeover.WAITED) or 0)
        action, countdown = takeover.decide(job, owner, started.taken_over, waited)
        if action == takeover.REPLACED:
            revoke_rest_of_chain(job, f"task {owner} was replaced by a later dispatch")
            raise Ignore()
        if action == takeover.WAIT:
            metrics.decision(job.name, "deferred", key.key)
            republish(job, args, kwargs, key, alias, countdown,
                      {REDELIVERED: redelivered, takeover.WAITED: waited + countdown})
            raise Ignore()
    if not started.run:
        if observing:
            return observe_skip(job, key, str(started.holder))
        return Admitted(run=skip(job, key, str(started.holder)), owner=owner)
    if started.took:
        notify(lock_acquired, type(job), key=key.key, owner=owner, store=alias)
    if started.released:
        notify(lock_released, type(job), key=key.key, owner=owner, store=alias,
               reason="processing")
    return Admitted(run=True, owner=owner, store=store, key=key, alias=alias,
                    delivery=delivery, marker=running_key(key) if exclusive else None,
                    resent=bool((header or {}).get(NONCE)))


def admit_throttle(
    job: Any, args: Any, kwargs: Any, again: Callable[[float], None]
) -> Slot | None:
    """T2/T3, the throttle stage of every kind (ThrottledJob, and the unique and debounced
    kinds with throttle options), in one store call (``store.throttle_admit``). Admitted:
    the run goes on, holding the returned slot (``concurrency``) or nothing (a rate alone
    touches the store only here). Deferred: ``job_deferred`` is sent and ``again(countdown)``
    publishes the message once more (same task id: its ``AsyncResult`` resolves when it
    runs) for when the store's answer says a slot or a start is due; then Ignore is raised,
    the worker process is free meanwhile. Unthrottled (W4, when in doubt, run): no key, a
    store that cannot throttle, or a store that cannot answer."""
    if not job.throttled():
        return None
    request = job.request
    owner = str(request.id)
    try:
        key, alias = job.throttle_key(args, kwargs), job.throttle_alias()
        store = job.store(alias)
        rate = parse_rate(job.throttle)
    except Exception:
        logger.warning("%s[%s]: no throttle key could be computed; running unthrottled.",
                       job.name, owner, exc_info=True)
        return None
    if not store.can_throttle:
        logger.warning("%s[%s]: store %r cannot throttle (see docs/throttling.md); running "
                       "unthrottled.", job.name, owner, alias)
        return None
    concurrency = int(job.concurrency or 0)
    delivery = new_request_id()

    def ask(through: BaseStore) -> Admission:
        return through.throttle_admit(
            key, owner, delivery=delivery, concurrency=concurrency,
            rate_limit=rate.limit if rate else 0, rate_period=rate.period if rate else 1.0,
            lease=app_settings.LEASE_SECONDS)

    try:
        answer = ask(store)
    except StoreUnavailable:
        # W7, no re-send: the copy (same task id) takes over the slot the lost call may have
        # taken (that grant superseded: its re-send answers RELEASED), or the slot lapses
        defer_for_store(job, key, alias, "throttle check", again)
        # Run after all: a slot the lost call may have taken is settled by the lease (W4).
        return Slot(store=store, key=key, owner=owner, limit=concurrency,
                    resend=lambda through: ask(through).admitted) if concurrency else None
    if answer.admitted:
        return Slot(store=store, key=key, owner=owner, limit=concurrency,
                    held=answer.held) if concurrency else None
    # The store's answer holds the jitter (T2: up to a quarter of a wait for a slot, at most
    # 1 s, part of the waiter's turn; T3: none, the reserved start times are spread already)
    wait = max(0.0, answer.until - clock.now())
    observing = bool(getattr(job, "observing", lambda: False)())
    metrics.decision(job.name, "deferred", key.key)
    notify(job_deferred, type(job), task_id=owner, key=key.key, reason=answer.reason,
           until=clock.now() + wait, observed=observing)
    if observing:
        logger.info("%s[%s]: observe-only: would have waited %.2fs (%s of %s); runs now.",
                    job.name, owner, wait, answer.reason, key.key)
        return None
    logger.info("%s[%s]: %s limit of %s reached; this message waits %.2fs.", job.name, owner,
                answer.reason, key.key, wait)
    again(wait)
    raise Ignore()


def replaced(job: UniqueJob, task_id: str) -> bool:
    """R1: was this message replaced? The dispatch that took its lock over marked its result
    REVOKED before publishing its own message, so a replaced message never runs even once the
    lock is free again. One read of the result backend (not the store), for replace jobs
    only; without a result (``ignore_result``) the lock check alone decides."""
    if job.ignore_result or job.request.ignore_result:
        return False
    try:
        return str(job.AsyncResult(task_id).state) == REVOKED
    except Exception:
        logger.warning("%s[%s]: could not read the result; the lock check decides.",
                       job.name, task_id, exc_info=True)
        return False


def observe_skip(job: UniqueJob, key: JobKey, holder: str) -> Admitted:
    """R3: the message would have been skipped (W3): reported, then run unchecked (the lock
    is another owner's: nothing of it is touched)."""
    request = job.request
    metrics.decision(job.name, "skipped", key.key)
    notify(unique_job_skipped, type(job), task_id=request.id, holder_id=holder, key=key.key,
           stage="worker", observed=True)
    logger.info("%s[%s]: observe-only: would have been skipped (%s is held by %s); runs.",
                job.name, request.id, key.key, holder)
    return Admitted(run=True, owner=str(request.id))


def defer(
    job: UniqueJob, args: Any, kwargs: Any, key: JobKey, alias: str, store: BaseStore,
    started: Started, header: dict[str, Any] | None, redelivered: bool,
) -> Admitted:
    """R2: another run of the key is in progress. The message waits: published again (same
    task id, its lock kept, so later dispatches are deduplicated onto it), checked again after
    a countdown that doubles from 0.5 s up to a third of the lease (plus jitter). The worker
    process is not blocked. In observe-only mode (R3) it is reported and runs now."""
    request = job.request
    deferred = int((header or {}).get(DEFERRED) or 0)
    countdown = min(app_settings.LEASE_SECONDS / 3, 0.5 * 2 ** deferred)
    countdown += random.uniform(0, 0.25)
    until = clock.now() + countdown
    observing = job.observing()
    metrics.decision(job.name, "deferred", key.key)
    notify(job_deferred, type(job), task_id=request.id, key=key.key, reason="overlap",
           until=until, observed=observing)
    if observing:
        logger.info("%s[%s]: observe-only: would have waited %.1fs for the run of %s by %s; "
                    "runs now.", job.name, request.id, countdown, key.key, started.holder)
        try:
            store.release(key, str(request.id))  # it runs now: its until-processing lock goes
        except StoreUnavailable:
            logger.warning("%s[%s]: could not release %s.", job.name, request.id, key.key,
                           exc_info=True)
        return Admitted(run=True, owner=str(request.id))
    logger.info("%s[%s]: %s is running under %s; this message waits %.1fs.", job.name,
                request.id, key.key, started.holder, countdown)
    republish(job, args, kwargs, key, alias, countdown,
              {REDELIVERED: redelivered, DEFERRED: deferred + 1})
    raise Ignore()


def republish(job: UniqueJob, args: Any, kwargs: Any, key: JobKey, alias: str,
              countdown: float, extra: dict[str, Any]) -> None:
    """Publish the message being executed again, same task id, after ``countdown``."""
    request = job.request
    signature = job.signature_from_request(request, args, kwargs, countdown=countdown)
    options = dict(signature.options)
    for name in ("task_id", "eta", "headers"):
        options.pop(name, None)
    job._publish(args, kwargs, str(request.id), key, alias, {**options, "countdown": countdown},
                 extra=extra)


def put_off(
    job: UniqueJob, args: Any, kwargs: Any, key: JobKey, alias: str, redelivered: bool
) -> None:
    """W5: another delivery of this very message is running (its lease keeps the lock
    alive). This copy never runs beside it: it is published again (same task id) to be
    checked once more after a third of the lease, and this delivery ends without a result.
    After the first run ends, the copy is dropped (a broker redelivery) or runs (a fresh
    publish of the same id); if the first run's worker died, its lock expires and the copy
    runs."""
    request = job.request
    countdown = app_settings.LEASE_SECONDS / 3
    metrics.decision(job.name, "deferred", key.key)
    logger.warning("%s[%s]: another delivery of this message is running; this copy waits "
                   "%.1fs.", job.name, request.id, countdown)
    republish(job, args, kwargs, key, alias, countdown, {REDELIVERED: redelivered})
    raise PutOff()


def skip(job: UniqueJob, key: JobKey, holder: str) -> bool:
    """W3: another owner holds the lock; this message's body does not run. Returns False
    inside a group or chord (the job returns None, so the chord body still runs); raises
    Ignore otherwise, with the result REVOKED and later chain links too."""
    request = job.request
    metrics.decision(job.name, "skipped", key.key)
    notify(unique_job_skipped, type(job), task_id=request.id, holder_id=holder, key=key.key,
           stage="worker")
    logger.info("%s[%s] skipped: %s is held by %s", job.name, request.id, key.key, holder)
    if request.group or request.chord:
        return False
    reason = f"duplicate: lock {key.key} is held by task {holder}"
    if not (job.ignore_result or request.ignore_result):
        job.backend.mark_as_revoked(str(request.id), reason=reason, request=request)
    revoke_rest_of_chain(job, reason)
    raise Ignore()
