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

This module is the Celery front-end of those decisions: it reads the request once into a
:class:`~dedup_jobs.engine.message.Message`, asks the engine (``engine/start.py``,
``engine/throttle_admission.py``, ``engine/takeover.py``, ``engine/store_errors.py``) and acts
on the answer: ``Ignore``, a result marked ``REVOKED``, the message published again
(:meth:`DedupJob.publish_again`, the one re-publish of every kind).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore
from celery.states import REVOKED

from dedup_jobs import clock, metrics
from dedup_jobs.engine import takeover, throttle_admission
from dedup_jobs.engine.message import Message
from dedup_jobs.engine.start import DEFERRED, NONCE, Check, check_for, overlap_wait, put_off_wait
from dedup_jobs.engine.store_errors import defer_for_store
from dedup_jobs.engine.throttle import Slot, release_slot
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs.base import logger
from dedup_jobs.jobs.cancel import REPLACING, releases_on_start, runs_exclusive
from dedup_jobs.jobs.chains import revoke_rest_of_chain
from dedup_jobs.jobs.request import REDELIVERED, finished, is_redelivered
from dedup_jobs.jobs.wake import wakeable
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import (
    job_deferred,
    lock_acquired,
    lock_released,
    notify,
    unique_job_skipped,
)
from dedup_jobs.stores.answers import StartAnswer
from dedup_jobs.stores.base import BaseStore

if TYPE_CHECKING:
    from dedup_jobs.jobs.unique import UniqueJob

__all__ = ["DEFERRED", "NONCE", "OBSERVED", "Admitted", "PutOff", "admit", "admit_throttle"]

#: dedup header of a duplicate published in observe-only mode (R3): the holder it would have
#: been deduplicated onto; the dispatch reported it, the worker runs it without a check
OBSERVED = "observed"


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


def message_of(job: Any, header: dict[str, Any] | None) -> Message:
    """The delivery ``job`` is executing, read once from its request."""
    request = job.request
    observing = getattr(job, "observing", None)
    return Message(name=job.name, sender=type(job), owner=str(request.id), header=header,
                   observing=bool(observing()) if observing is not None else False,
                   redelivered=is_redelivered(request, header))


def admit(job: UniqueJob, args: Any, kwargs: Any) -> Admitted:
    """Decide the message being executed by ``job``; raises ``Ignore`` when it must end
    without running (skipped, put off, dropped). A message let through to its body is
    counted ``ran`` here (A5); the other outcomes where they are decided."""
    admitted = _decide(job, args, kwargs)
    if admitted.run:
        metrics.decision(job.name, "ran")
    return admitted


def _decide(job: UniqueJob, args: Any, kwargs: Any) -> Admitted:
    header = job.header()
    message = message_of(job, header)
    owner = message.owner
    try:
        if header is not None:
            key, alias = job.key_from_header(header), str(header["via"])
        else:
            key, alias = job.job_key(args, kwargs), job.store_alias()
    except Exception:
        logger.warning("%s[%s]: no dedup key could be computed; running unchecked.",
                       job.name, owner, exc_info=True)
        return Admitted(run=True, owner=owner)
    if message.observing and message.carried(OBSERVED):
        return Admitted(run=True, owner=owner)  # R3: reported at dispatch, runs as it is
    if job.on_duplicate in REPLACING and not message.observing and replaced(job, owner):
        logger.info("%s[%s]: replaced by a later dispatch (its result is REVOKED); not run.",
                    job.name, owner)
        revoke_rest_of_chain(job, f"task {owner} was replaced by a later dispatch")
        raise Ignore()
    store = job.store(alias)
    if message.redelivered and finished(job, owner):
        # W5: the first delivery ran to its end; this copy is dropped, its result kept.
        logger.info("%s[%s]: redelivered copy of a finished run dropped.", job.name, owner)
        raise Ignore()
    try:
        slot = admit_throttle(job, args, kwargs, lambda countdown: republish(
            job, args, kwargs, message, key, alias, countdown), message)
    except Ignore:
        raise  # deferred: its re-publish carries the lock on
    except Exception:
        # L1: a limit method's bad value for this call (refused at dispatch; here a retry's
        # new arguments), or a deferral the broker would not take: the message fails, and
        # the lock it holds goes with it (U4)
        job._finish(store, key, owner, alias, "failure")
        raise
    try:
        admitted = check_lock(job, args, kwargs, message, key, alias, store)
    except PutOff:  # W5: a slot held already is the live first run's: it releases it
        if slot is None or not slot.held:
            release_slot(job.name, slot, job.waker())
        raise
    except BaseException:
        release_slot(job.name, slot, job.waker())  # the lock check ended it: skipped, deferred
        raise
    if not admitted.run or slot is None:
        release_slot(job.name, slot, job.waker())  # skipped in a group or chord: it does not run
        return admitted
    return replace(admitted, slot=slot)


def check_lock(
    job: UniqueJob, args: Any, kwargs: Any, message: Message, key: JobKey, alias: str,
    store: BaseStore,
) -> Admitted:
    """W1/W3/W5/R2: the lock check of a message, one store call (``engine/start.py``)."""
    owner = message.owner
    check = check_for(message, key, without_overlapping=runs_exclusive(job),
                      release_on_start=releases_on_start(job))
    try:
        started = check(store)
    except StoreUnavailable:
        # W7: R2 is a limit; R1 may replace a holder the store thinks queued (#fates)
        waits = (check.exclusive or job.on_duplicate in REPLACING) and defer_for_store(
            message, key, alias, "worker check", lambda countdown: republish(
                job, args, kwargs, message, key, alias, countdown, {NONCE: check.delivery}))
        if waits:
            raise Ignore() from None
        logger.warning("%s[%s]: store %r unavailable at the worker check; running (what the "
                       "check did is settled when the store answers).", job.name, owner,
                       alias, exc_info=True)
        return _admitted(message, store, key, alias, check, resend=check.holds_after)
    answer = started.answer
    if answer is StartAnswer.DONE:
        # W5: the first delivery's run has just released the lock; its result is being stored.
        logger.info("%s[%s]: redelivered copy of a run that just ended dropped.", job.name, owner)
        raise Ignore()
    if answer is StartAnswer.LIVE:
        put_off(job, args, kwargs, message, key, alias)
    if answer is StartAnswer.OVERLAP:
        return defer(job, args, kwargs, message, key, alias, store, str(started.holder))
    if answer is StartAnswer.TAKEN_OVER and not message.observing:
        # R1/S7: taken over by a dispatch that may have failed: skip only once confirmed
        action, countdown = takeover.decide(message, started.taken_over or 0.0,
                                            lambda: replaced(job, owner))
        if action == takeover.REPLACED:
            revoke_rest_of_chain(job, f"task {owner} was replaced by a later dispatch")
            raise Ignore()
        if action == takeover.WAIT:
            metrics.decision(job.name, "deferred", key.key)
            republish(job, args, kwargs, message, key, alias, countdown,
                      {takeover.WAITED: takeover.waited(message) + countdown})
            raise Ignore()
    if answer is not StartAnswer.RUN:
        if message.observing:
            return observe_skip(message, key, str(started.holder))
        return Admitted(run=skip(job, message, key, str(started.holder)), owner=owner)
    if started.took:
        notify(lock_acquired, message.sender, key=key.key, owner=owner, store=alias)
    if started.released:
        notify(lock_released, message.sender, key=key.key, owner=owner, store=alias,
               reason="processing")
    return _admitted(message, store, key, alias, check, resent=bool(message.carried(NONCE)))


def _admitted(message: Message, store: BaseStore, key: JobKey, alias: str, check: Check,
              **more: Any) -> Admitted:
    return Admitted(run=True, owner=message.owner, store=store, key=key, alias=alias,
                    delivery=check.delivery, marker=check.marker, **more)


def admit_throttle(
    job: Any, args: Any, kwargs: Any, again: Callable[[float], None],
    message: Message | None = None,
) -> Slot | None:
    """T2/T3, the throttle stage of every kind (ThrottledJob, and the unique and debounced
    kinds with throttle options): ``engine/throttle_admission.py`` decides, in one store call;
    a message that must wait is published again by ``again(countdown)`` (same task id: its
    ``AsyncResult`` resolves when it runs) and ends here with Ignore. Unthrottled (W4, when
    in doubt, run): no key, or a store that cannot throttle."""
    if not job.throttled():
        return None
    # L1: the limits of this call (a method's bad value raises, naming it, not a store error)
    concurrency, rate = job.limits_for(args, kwargs)
    if not concurrency and rate is None:
        return None  # no limit for this call: nothing to ask the store
    message = message or message_of(job, None)
    try:
        key, alias = job.throttle_key(args, kwargs), job.throttle_alias()
        store = job.store(alias)
    except Exception:
        logger.warning("%s[%s]: no throttle key could be computed; running unthrottled.",
                       job.name, message.owner, exc_info=True)
        return None
    if not store.can_throttle:
        logger.warning("%s[%s]: store %r cannot throttle (see docs/throttling.md); running "
                       "unthrottled.", job.name, message.owner, alias)
        return None
    throttled = throttle_admission.admit(message, key, alias, store,
                                         concurrency=concurrency, rate=rate, again=again,
                                         wakes=wakeable(job.app))
    if throttled.waits:
        raise Ignore()
    return throttled.slot


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


def observe_skip(message: Message, key: JobKey, holder: str) -> Admitted:
    """R3: the message would have been skipped (W3): reported, then run unchecked (the lock
    is another owner's: nothing of it is touched)."""
    metrics.decision(message.name, "skipped", key.key)
    notify(unique_job_skipped, message.sender, task_id=message.owner, holder_id=holder,
           key=key.key, stage="worker", observed=True)
    logger.info("%s[%s]: observe-only: would have been skipped (%s is held by %s); runs.",
                message.name, message.owner, key.key, holder)
    return Admitted(run=True, owner=message.owner)


def defer(
    job: UniqueJob, args: Any, kwargs: Any, message: Message, key: JobKey, alias: str,
    store: BaseStore, holder: str,
) -> Admitted:
    """R2: another run of the key is in progress. The message waits: published again (same
    task id, its lock kept, so later dispatches are deduplicated onto it), checked again after
    a countdown that doubles from 0.5 s up to a third of the lease (plus jitter). The worker
    process is not blocked. In observe-only mode (R3) it is reported and runs now."""
    owner = message.owner
    countdown = overlap_wait(message)
    metrics.decision(job.name, "deferred", key.key)
    notify(job_deferred, message.sender, task_id=owner, key=key.key, reason="overlap",
           until=clock.now() + countdown, observed=message.observing)
    if message.observing:
        logger.info("%s[%s]: observe-only: would have waited %.1fs for the run of %s by %s; "
                    "runs now.", job.name, owner, countdown, key.key, holder)
        try:
            store.release(key, owner)  # it runs now: its until-processing lock goes
        except StoreUnavailable:
            logger.warning("%s[%s]: could not release %s.", job.name, owner, key.key,
                           exc_info=True)
        return Admitted(run=True, owner=owner)
    logger.info("%s[%s]: %s is running under %s; this message waits %.1fs.", job.name,
                owner, key.key, holder, countdown)
    republish(job, args, kwargs, message, key, alias, countdown,
              {DEFERRED: int(message.carried(DEFERRED) or 0) + 1})
    raise Ignore()


def republish(job: UniqueJob, args: Any, kwargs: Any, message: Message, key: JobKey,
              alias: str, countdown: float, extra: dict[str, Any] | None = None) -> None:
    """Publish the message being executed again, same task id, after ``countdown``, with a
    fresh dedup header: its key, the redelivery mark it carries on (W5) and ``extra``."""
    header = {**key.as_header(alias), REDELIVERED: message.redelivered, **(extra or {})}
    job.publish_again(args, kwargs, countdown, lambda options: job.with_header(options, header))


def put_off(
    job: UniqueJob, args: Any, kwargs: Any, message: Message, key: JobKey, alias: str
) -> None:
    """W5: another delivery of this very message is running (its lease keeps the lock
    alive). This copy never runs beside it: it is published again (same task id) to be
    checked once more after a third of the lease, and this delivery ends without a result.
    After the first run ends, the copy is dropped (a broker redelivery) or runs (a fresh
    publish of the same id); if the first run's worker died, its lock expires and the copy
    runs."""
    countdown = put_off_wait()
    metrics.decision(job.name, "deferred", key.key)
    logger.warning("%s[%s]: another delivery of this message is running; this copy waits "
                   "%.1fs.", job.name, message.owner, countdown)
    republish(job, args, kwargs, message, key, alias, countdown)
    raise PutOff()


def skip(job: UniqueJob, message: Message, key: JobKey, holder: str) -> bool:
    """W3: another owner holds the lock; this message's body does not run. Returns False
    inside a group or chord (the job returns None, so the chord body still runs); raises
    Ignore otherwise, with the result REVOKED and later chain links too."""
    request = job.request
    metrics.decision(job.name, "skipped", key.key)
    notify(unique_job_skipped, message.sender, task_id=request.id, holder_id=holder,
           key=key.key, stage="worker")
    logger.info("%s[%s] skipped: %s is held by %s", job.name, request.id, key.key, holder)
    if request.group or request.chord:
        return False
    reason = f"duplicate: lock {key.key} is held by task {holder}"
    if not (job.ignore_result or request.ignore_result):
        job.backend.mark_as_revoked(str(request.id), reason=reason, request=request)
    revoke_rest_of_chain(job, reason)
    raise Ignore()
