"""L3, bulk dispatch: ``Job.dispatch_many(calls)``, one ``AsyncResult`` per call, in order.

Where a batch is decided: :func:`dispatch_batch`, for a unique kind whose duplicates return
the holder's result (``on_duplicate = "return"``, the default): every lock of the batch in
one store call (``engine/dispatch.py`` ``ask_many``: one round trip on the Redis family),
then the winners published over one producer, in one publish batch where the transport
defers a batch's writes (kombu 5.7's Redis transport: one pipelined broker round trip for
the batch; other transports publish one message per call). Every other job, and a
unique job whose duplicates raise, replace or cancel, dispatches the calls one by one, each
exactly as ``apply_async`` would (:meth:`DedupJob.dispatch_many`).

What a failure leaves (S7, U6): a store that cannot answer for the batch raises before
anything is published, and every request of the batch is undone (a lost reply may have
taken some locks); a publish that fails releases the locks of the winners not published
(in a publish batch: every winner's, since the batch is written at its end, or not at all;
their ids marked REVOKED: a caller deduplicated onto one meanwhile gets an answer), then
raises. Calling ``dispatch_many`` again with the same calls is then
safe: what was published is a duplicate now.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from celery.result import AsyncResult

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.engine.dispatch import Dispatch, Dispatched, ask_many
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs.base import logger, message_wait, new_task_id
from dedup_jobs.jobs.calls import Call, check_each, check_limits
from dedup_jobs.jobs.fused import fused_transport, why_not_fused
from dedup_jobs.jobs.fused_many import dispatch_fused_many
from dedup_jobs.jobs.undo import release_unpublished, undo_lock
from dedup_jobs.signals import lock_acquired, notify


def dispatch_batch(job: Any, calls: list[Call], options: dict[str, Any]) -> list[AsyncResult[Any]]:
    """The batch of a unique kind (see the module docstring); one by one when its duplicates
    do not simply return the holder's result, or in eager mode (each runs at once)."""
    if job.on_duplicate != "return" or job.app.conf.task_always_eager:
        check_each(job, calls)
        return [job.apply_async(args, kwargs, **options) for args, kwargs in calls]
    alias = job.store_alias()
    store = job.store(alias)
    now = clock.now()
    wait = message_wait(options, now)
    dispatches = []
    for args, kwargs in calls:  # every key first: a bad argument raises before any lock
        check_limits(job, args, kwargs)
        dispatches.append(Dispatch(key=job.job_key(args, kwargs, store), task_id=new_task_id(),
                                   ttl=job.lock_ttl(args, kwargs) + wait, generated=True,
                                   replace=False))
    if (app_settings.ON_STORE_ERROR != "enqueue" and fused_transport(job.app)
            and not why_not_fused(job, store, options, batch=True)):
        fused = dispatch_fused_many(job, store, calls, dispatches, alias, options)
        if fused is not None:  # every lock and message in one round trip
            return fused
    try:
        answers = ask_many(dispatches, store, now=now)
    except StoreUnavailable as exc:
        if app_settings.ON_STORE_ERROR != "enqueue":
            for d in dispatches:  # S7: any of the calls may have run (a lost reply)
                undo_lock(job, store, d.key, d.task_id, d.ttl, request=d.request)
            raise
        # The calls answered before the failure keep their answers (a duplicate stays one);
        # the rest are published without a lock, each under the id its call may have
        # locked with (a lost reply): that lock is then its own message's.
        got = len(exc.answered)
        logger.warning("%s: store %r unavailable, publishing %d of a batch of %d without "
                       "locks (ON_STORE_ERROR='enqueue').", job.name, alias,
                       len(calls) - got, len(calls), exc_info=True)
        answers = [d.read(a) for d, a in zip(dispatches, exc.answered, strict=False)] + [
            Dispatched(publish=True, holder=d.task_id, locked=False) for d in dispatches[got:]]
    return _publish(job, calls, dispatches, answers, alias, options, store)


def _publish(job: Any, calls: list[Call], dispatches: list[Dispatch],
             answers: list[Dispatched], alias: str, options: dict[str, Any],
             store: Any) -> list[AsyncResult[Any]]:
    """Publish the winners in order over one producer, in one publish batch where the
    transport defers a batch's writes (kombu 5.7's Redis transport: one pipelined round trip
    at the end); a duplicate gets what a single dispatch of it would (the holder's result;
    published too when observe-only, R3)."""
    results: list[AsyncResult[Any]] = []
    with job.app.producer_or_acquire(options.get("producer")) as producer:
        sent = {**options, "producer": producer}
        batch: Any = getattr(producer, "batch", None)  # kombu 5.7+
        # (a connection of the caller's is published on by Celery's own producer, at once)
        deferred = (batch is not None and options.get("connection") is None
                    and bool(getattr(producer, "supports_batch_publish", False)))
        index = 0
        try:
            # room for every command of the batch: no write before the end (all or nothing)
            with batch(max_size=8 * len(calls) + 8) if deferred else nullcontext():
                decided = list(zip(calls, dispatches, answers, strict=True))
                for index in range(len(decided)):
                    (args, kwargs), d, answer = decided[index]
                    if not answer.publish:
                        results.append(job._duplicate(d.key, alias, answer.holder, d.task_id,
                                                      args, kwargs, sent))
                        continue
                    result = job._publish(args, kwargs, d.task_id, d.key, alias, sent)
                    result.deduplicated = False
                    results.append(result)
        except BaseException:
            # U6: no lock without its message. Deferred, nothing of the batch was written
            # (or, if its one write failed, not knowably): every winner's lock is released;
            # a message that did land finds its lock free, or another owner's, at the
            # worker's check. Published one by one: this call's and the later winners'.
            start = 0 if deferred else index
            for later, taken in zip(dispatches[start:], answers[start:], strict=True):
                if taken.publish and taken.locked:
                    release_unpublished(job, store, later)
            raise
    for d, answer in zip(dispatches, answers, strict=True):
        if answer.publish:
            if answer.locked:
                notify(lock_acquired, type(job), key=d.key.key, owner=d.task_id, store=alias)
            metrics.decision(job.name, "dispatched")
    return results
