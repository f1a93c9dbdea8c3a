"""The worker-side admission stage of the unique kinds: every message of a ``UniqueJob`` or
``UniqueUntilProcessingJob`` that reaches a worker, by any entry path (W2), passes
:func:`admit` before its body runs, in one store call (``store.start``). There it is

- **admitted**: its lock is free or its own (W1): it runs;
- **skipped**: another owner holds its lock (W3): the body never runs, the result ends
  ``REVOKED`` (``SUCCESS``/``None`` inside a group or chord), later chain links too;
- **put off**: another delivery of this very message is running (W5): published again with a
  countdown, same task id, the result untouched;
- **dropped**: a copy the broker redelivered after the first run finished (W5);
- **run unchecked**: no key can be computed, or the store cannot answer (W4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore
from celery.states import READY_STATES

from dedup_jobs import clock
from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs.base import logger, notify
from dedup_jobs.jobs.chains import revoke_links
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import lock_acquired, lock_released, unique_job_skipped
from dedup_jobs.stores.base import BaseStore, new_request_id

if TYPE_CHECKING:
    from dedup_jobs.jobs.unique import UniqueJob

#: dedup header flag of a copy re-published to wait for its first delivery's run (W5): it
#: carries on that the broker had marked the copy redelivered
REDELIVERED = "redelivered"


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """What :func:`admit` let through."""

    run: bool  # False: skipped inside a group or chord, the job returns None
    owner: str
    store: BaseStore | None = None  # None (with key): no key could be computed, run unchecked
    key: JobKey | None = None
    alias: str = ""
    checked: bool = True  # False: the store could not answer (W4), run and release after
    delivery: str | None = None  # this delivery's nonce (W5), kept by the lease (W6)


def admit(job: UniqueJob, args: Any, kwargs: Any) -> Admitted:
    """Decide the message being executed by ``job``; raises ``Ignore`` when it must end
    without running (skipped, put off, dropped)."""
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
    store = job.store(alias)
    redelivered = is_redelivered(request, header)
    if redelivered and finished(job, owner):
        # W5: the first delivery ran to its end; this copy is dropped, its result kept.
        logger.info("%s[%s]: redelivered copy of a finished run dropped.", job.name, owner)
        raise Ignore()
    delivery = new_request_id()
    try:
        started = store.start(key, owner, app_settings.LEASE_SECONDS, now=clock.now(),
                              release=job.release_on_start, delivery=delivery)
    except StoreUnavailable:
        logger.warning("%s[%s]: store %r unavailable at the worker check; running.",
                       job.name, owner, alias, exc_info=True)
        return Admitted(run=True, owner=owner, store=store, key=key, alias=alias,
                        checked=False)
    if started.live:
        put_off(job, args, kwargs, key, alias, redelivered)
    if not started.run:
        return Admitted(run=skip(job, key, str(started.holder)), owner=owner)
    if started.took:
        notify(lock_acquired, type(job), key=key.key, owner=owner, store=alias)
    if started.released:
        notify(lock_released, type(job), key=key.key, owner=owner, store=alias,
               reason="processing")
    return Admitted(run=True, owner=owner, store=store, key=key, alias=alias,
                    delivery=delivery)


def is_redelivered(request: Any, header: dict[str, Any] | None) -> bool:
    """The broker marked this delivery redelivered, or it is a copy that waited for its
    first delivery's run and carries that mark on (W5)."""
    if header is not None and header.get(REDELIVERED):
        return True
    return bool((getattr(request, "delivery_info", None) or {}).get("redelivered"))


def finished(job: Any, task_id: str) -> bool:
    """W5: has a run of ``task_id`` ended (its result is ready)? Asked only of a copy the
    broker marked redelivered; without a result (``ignore_result``, no backend) nobody can
    tell, and the copy goes on to the lock check (at least once)."""
    if job.ignore_result:
        return False
    try:
        return job.AsyncResult(task_id).state in READY_STATES
    except Exception:
        logger.warning("%s[%s]: could not read the result of the redelivered message.",
                       job.name, task_id, exc_info=True)
        return False


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
    logger.warning("%s[%s]: another delivery of this message is running; this copy waits "
                   "%.1fs.", job.name, request.id, countdown)
    signature = job.signature_from_request(request, args, kwargs, countdown=countdown)
    options = dict(signature.options)
    for name in ("task_id", "eta", "headers"):
        options.pop(name, None)
    job._publish(args, kwargs, str(request.id), key, alias, {**options, "countdown": countdown},
                 extra={REDELIVERED: redelivered})
    raise Ignore()


def skip(job: UniqueJob, key: JobKey, holder: str) -> bool:
    """W3: another owner holds the lock; this message's body does not run. Returns False
    inside a group or chord (the job returns None, so the chord body still runs); raises
    Ignore otherwise, with the result REVOKED and later chain links too."""
    request = job.request
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


def revoke_rest_of_chain(job: Any, reason: str) -> None:
    """The later links of a skipped chain link never run: they end REVOKED, so that the
    chain's result (its last link) is ready, and a chord they belong to is told."""
    request = job.request
    links: Any = request.chain or ()
    revoke_links(job.backend, links,
                 f"an earlier link of its chain ({request.id}) was skipped: {reason}")
