"""UniqueJob and UniqueUntilProcessingJob: one copy queued (or running) per unique id.

Where the lock is taken: :meth:`UniqueJob.apply_async` →
:class:`dedup_jobs.engine.dispatch.Dispatch` (dispatch, one store call).
Where the worker checks: :meth:`UniqueJob.__call__` → :func:`dedup_jobs.jobs.admission.admit`
→ ``engine/start.py`` → ``store.start`` (one store call): admitted, skipped, put off or dropped.
Where it is released: :meth:`UniqueJob._finish` (owner's compare-and-delete), or by
``store.start(release=True)`` just before ``run`` for UniqueUntilProcessingJob.
Where a failed dispatch's lock is undone: ``jobs/undo.py`` (via ``engine/rollback.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from celery.exceptions import Ignore, Reject, Retry
from celery.result import AsyncResult

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.engine.dispatch import Dispatch
from dedup_jobs.engine.lease import leases
from dedup_jobs.engine.limits import seconds_at_worker, seconds_of
from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.engine.throttle import holding
from dedup_jobs.exceptions import (
    DedupError,
    DuplicateJob,
    InvalidJobConfiguration,
    StoreUnavailable,
)
from dedup_jobs.jobs.admission import OBSERVED, Admitted, admit
from dedup_jobs.jobs.base import DedupJob, logger, message_wait, new_task_id
from dedup_jobs.jobs.bulk import dispatch_batch
from dedup_jobs.jobs.calls import check_limits
from dedup_jobs.jobs.cancel import (
    CANCEL_RUNNING,
    REPLACING,
    cancelled_by,
    name_canceller,
    releases_on_start,
    run_cancellable,
    runs_exclusive,
)
from dedup_jobs.jobs.fused import observed, try_fused
from dedup_jobs.jobs.replace import replaced_by
from dedup_jobs.jobs.undo import release_unpublished, undo_lock
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import (
    lock_acquired,
    lock_released,
    notify,
    unique_job_skipped,
)
from dedup_jobs.stores.base import BaseStore, running_key

ON_DUPLICATE_CHOICES = ("return", "raise", "replace", CANCEL_RUNNING)


def _frozen_by_canvas(options: dict[str, Any]) -> bool:
    """True for a dispatch made by a chain, group or chord: its id is already in a result
    somebody waits on (a chain passes ``chain``, a group ``group_id``, a chord header
    ``chord``; a chord body was frozen with the header's ``group_id``)."""
    return bool(options.get("group_id") or options.get("chord") or "chain" in options)


class UniqueJob(DedupJob):
    """A job of which at most one copy per unique id is queued or running (Laravel's
    ``ShouldBeUnique``)."""

    dedup_kind = "unique"
    _key_fields_option = "unique_on"
    _id_hook = "unique_id"
    _via_option = "unique_via"
    _batch = staticmethod(dispatch_batch)  # L3: a batch's locks in one store call

    #: seconds; the fail-safe expiry of a lock whose job never ran (default:
    #: DEDUP_JOBS["DEFAULT_UNIQUE_FOR"]); or a method of the call's arguments (L1)
    unique_for: Any = None
    #: argument names that form the key (default: all arguments of run)
    unique_on: tuple[str, ...] | None = None
    #: a CACHES alias or "database" (attribute, or a method returning it)
    unique_via: Any = None
    #: "return" the holder's AsyncResult (with .deduplicated True), "raise" DuplicateJob,
    #: "replace" a queued holder (R1: it is revoked, this dispatch is published), or
    #: "cancel_running" (L2: as "replace"; a running copy is also asked to stop, and this
    #: dispatch runs after it)
    on_duplicate: str = "return"
    #: L2: a cancelled run is terminated (prefork pool) instead of asked to stop
    cancel_terminates: bool = False
    #: R2: no two runs of one key at once; a message meeting a run of its key waits
    #: (UniqueUntilProcessingJob; on UniqueJob the lock held while running already does it)
    without_overlapping: bool = False
    #: R3: decide and report, but behave as a plain Celery task (None: DEDUP_JOBS["OBSERVE_ONLY"])
    observe_only: bool | None = None
    #: release the lock just before run (UniqueUntilProcessingJob)
    release_on_start: ClassVar[bool] = False
    #: the worker-side request: releases the lock when a hard time limit kills the job
    Request = "dedup_jobs.jobs.request:UniqueRequest"

    @classmethod
    def validate_options(cls) -> None:
        label = cls._job_label()
        if getattr(cls, "debounce_for", None) is not None or getattr(cls, "max_wait", None):
            raise InvalidJobConfiguration(
                f"{label} is both unique and debounced (it sets debounce_for/max_wait). "
                f"Use DebouncedJob for debouncing, or drop those options."
            )
        if not callable(cls.unique_for):  # a method is checked per call (L1)
            cls._positive(label, "unique_for", cls.unique_for)
        if cls.on_duplicate not in ON_DUPLICATE_CHOICES:
            raise InvalidJobConfiguration(
                f"{label}: on_duplicate = {cls.on_duplicate!r} must be one of "
                f"{ON_DUPLICATE_CHOICES!r}."
            )
        for name in ("without_overlapping", "observe_only", "cancel_terminates"):
            value = getattr(cls, name)
            if not (isinstance(value, bool) or (name == "observe_only" and value is None)):
                raise InvalidJobConfiguration(
                    f"{label}: {name} = {value!r} must be True or False."
                )
        super().validate_options()

    def observing(self) -> bool:
        """R3: is this job in observe-only mode (its own option, else the setting)?"""
        if self.observe_only is not None:
            return bool(self.observe_only)
        return app_settings.OBSERVE_ONLY

    def lock_ttl(self, args: Any = None, kwargs: Any = None) -> float:
        """The lock's lifetime for a call with these arguments: ``unique_for`` (L1: a
        method's answer for them), else DEFAULT_UNIQUE_FOR."""
        found = seconds_of(self.name, "unique_for", self.unique_for, args, kwargs)
        return float(app_settings.DEFAULT_UNIQUE_FOR if found is None else found)

    def _running_ttl(self) -> float:
        """The lock's lifetime for the call being run (a method's bad answer: the default:
        a requeue or a release's retry must not fail on it)."""
        return seconds_at_worker(self.name, "unique_for", self.unique_for, self.request.args,
                                 self.request.kwargs, app_settings.DEFAULT_UNIQUE_FOR)

    # -- dispatch -----------------------------------------------------------------------

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        options.update(producer=producer, link=link, link_error=link_error, shadow=shadow)
        generated = task_id is None
        # The request stack is only consulted when a task id is given (a retry re-sends its own).
        retrying = not generated and task_id == self.request.id
        task_id = task_id or new_task_id()
        alias = self.store_alias()
        try:
            store = self.store(alias)
        except DedupError:
            store = None  # an unknown store: raised below, once the key is known to be valid
        key = self.job_key(args, kwargs, store)
        if store is None:
            store = self.store(alias)
        if not retrying:
            check_limits(self, args, kwargs)  # L1: a limit method's bad value, by name
        now = clock.now()
        # A message that waits (countdown/eta) keeps its lock for the wait, then unique_for.
        ttl = self.lock_ttl(args, kwargs) + message_wait(options, now)
        if retrying:
            if self.cancel_requested():  # L2: a run asked to stop ends cancelled, unretried
                return self.AsyncResult(task_id)  # (run_cancellable: REVOKED)
            # A retry is always published; it keeps (or re-takes) its own lock for the wait.
            self._try_acquire(store, key, task_id, ttl, now, reentrant=True)
            # The attempt that is ending must not release the lock it hands over to its
            # retry (self.retry(throw=False) returns normally; the same id carries on),
            # unless the retry's arguments give another key: then it releases its own.
            self.request.update(dedup_handed_over=self._same_key(key, alias))
            self.retry_slot(args, kwargs)  # T2: its slot, while its arguments keep it
            return self._publish(args, kwargs, task_id, key, alias, options)
        dispatch = Dispatch(key=key, task_id=task_id, ttl=ttl, generated=generated,
                            replace=self.on_duplicate in REPLACING,
                            cancel=self.on_duplicate == CANCEL_RUNNING)
        fused = try_fused(self, store, dispatch, args, kwargs, alias, options)
        if fused is not None:  # the lock and the message in one round trip
            return fused
        try:
            answer = dispatch.ask(store, now=now)
        except StoreUnavailable:
            if app_settings.ON_STORE_ERROR != "enqueue":
                # S7: the call may have run on the store (a lost reply): undo it.
                undo_lock(self, store, key, task_id, ttl, request=dispatch.request,
                          generated=generated, cancel=dispatch.cancel)
                raise
            logger.warning("%s[%s]: store %r unavailable, publishing without a lock "
                           "(ON_STORE_ERROR='enqueue').", self.name, task_id, alias,
                           exc_info=True)
            result = self._publish(args, kwargs, task_id, key, alias, options)
            metrics.decision(self.name, "dispatched")
            result.deduplicated = False  # type: ignore[attr-defined]
            return result
        observed(self, store, not answer.publish)  # (counted only where fusing is on)
        if not answer.publish:
            return self._duplicate(key, alias, answer.holder, task_id, args, kwargs, options)
        if answer.replaced:
            self._replaced(key, answer.replaced, task_id)
        try:
            result = self._publish(args, kwargs, task_id, key, alias, options)
        except BaseException:
            # U6: never a lock with nothing queued (L2: nor a run stopped for nothing).
            release_unpublished(self, store, dispatch)
            raise
        if answer.cancelled:
            cancelled_by(self, key, answer.cancelled, task_id)
        notify(lock_acquired, type(self), key=key.key, owner=task_id, store=alias)
        metrics.decision(self.name, "dispatched")
        result.deduplicated = False  # type: ignore[attr-defined]
        return result

    def _publish(
        self,
        args: Any,
        kwargs: Any,
        task_id: str,
        key: JobKey,
        alias: str,
        options: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> AsyncResult[Any]:
        """Celery's apply_async, with the dedup header the worker-side check reads (built
        only for a message that is published: a duplicate never needs it)."""
        header = key.as_header(alias)
        if extra:
            header.update(extra)
        options = self.with_header(options, header)
        return super().apply_async(args, kwargs, task_id, **options)

    def _try_acquire(
        self, store: BaseStore, key: JobKey, owner: str, ttl: float, now: float, *, reentrant: bool
    ) -> None:
        try:
            store.acquire(key, owner, ttl, now=now, reentrant=reentrant)
        except StoreUnavailable:
            logger.warning("%s[%s]: could not refresh the lock for a retry", self.name, owner,
                           exc_info=True)

    def _replaced(self, key: JobKey, replaced: str, task_id: str) -> None:
        replaced_by(self, key, replaced, task_id)

    def _duplicate(self, key: JobKey, alias: str, holder: str, task_id: str, args: Any,
                   kwargs: Any, options: dict[str, Any]) -> AsyncResult[Any]:
        metrics.decision(self.name, "deduplicated", key.key)
        observing = self.observing()
        notify(unique_job_skipped, type(self), task_id=task_id, holder_id=holder, key=key.key,
               stage="dispatch", observed=observing)
        if observing:
            # R3: reported, then published as a plain task would be; the worker runs it
            # without reporting it again (OBSERVED in its header).
            logger.info("%s[%s]: observe-only: would have %s (%s is held by %s); published.",
                        self.name, task_id,
                        "raised DuplicateJob" if self.on_duplicate == "raise"
                        else "deduplicated it", key.key, holder)
            result = self._publish(args, kwargs, task_id, key, alias, options,
                                   extra={OBSERVED: holder})
            result.deduplicated = False  # type: ignore[attr-defined]
            return result
        if self.on_duplicate == "raise":
            raise DuplicateJob(self.name, key.key, holder)
        if _frozen_by_canvas(options):
            # A chain/group/chord froze this id into the result its caller waits on: publish
            # it anyway; the worker-side check sees the other owner and completes it (W3).
            return self._publish(args, kwargs, task_id, key, alias, options)
        result = self.AsyncResult(holder)
        result.deduplicated = True  # type: ignore[attr-defined]
        return result

    # -- worker -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)
        admitted = admit(self, args, kwargs)  # skipped, put off or dropped: raises Ignore
        if not admitted.run:
            return None  # skipped inside a group or chord (W3): done, with None
        # T2: its concurrency slot
        with holding(admitted.slot, type(self), request, keep_on=(Retry,),
                     wake=self.waker()):
            return self._run_admitted(admitted, args, kwargs)

    def _run_admitted(self, admitted: Admitted, args: Any, kwargs: Any) -> Any:
        request = self.request
        store, key, alias, owner = admitted.store, admitted.key, admitted.alias, admitted.owner
        if store is None or key is None:
            return self.run(*args, **kwargs)  # no key could be computed (W4)
        if admitted.marker is not None:
            return self._run_marked(store, admitted, args, kwargs)
        if releases_on_start(self) and admitted.resend is None:
            return self.run(*args, **kwargs)
        lease = app_settings.LEASE_SECONDS
        # Released only once the lease has stopped: a renewal after the release would take
        # the finished job's lock back (W6). W4: a check whose reply was lost is re-sent by
        # the lease thread (``resend``); the lock is released unless its answer granted
        # nothing (an until-processing check released it, another owner holds it).
        held: Any = None
        try:
            with leases.hold(store, key, owner, lease, sender=type(self),
                             delivery=admitted.delivery, resend=admitted.resend,
                             renew_at_once=admitted.resent) as held:
                result = self.run(*args, **kwargs)
        except Retry:  # the retry was published with the lock kept for it (or its own)
            if not getattr(request, "dedup_handed_over", True) and (
                    held is None or held.granted is not False):
                self._finish(store, key, owner, alias, "failure")
            raise
        except Reject as exc:
            if getattr(exc, "requeue", False):
                # The requeued message runs next: mark the lock queued again, so that its
                # delivery is not taken for a second copy of a live run (W5).
                self._try_acquire(store, key, owner, self._running_ttl(), clock.now(),
                                  reentrant=True)
            elif held is None or held.granted is not False:
                self._finish(store, key, owner, alias, "failure")
            raise
        except Ignore:  # (Task.replace() by the same key hands the lock over: kept)
            if (held is None or held.granted is not False) and not getattr(
                    request, "dedup_handed_over", False):
                self._finish(store, key, owner, alias, "success")
            raise
        except BaseException:
            if held is None or held.granted is not False:
                self._finish(store, key, owner, alias, "failure")
            raise
        if getattr(request, "dedup_handed_over", False) or held.granted is False:
            return result  # self.retry(throw=False): the retry message owns the lock now
        self._finish(store, key, owner, alias, "success")
        return result

    def _run_marked(self, store: BaseStore, admitted: Admitted, args: Any, kwargs: Any) -> Any:
        """R2: run under the key's running marker (leased like a lock, so a killed worker
        frees it within LEASE_SECONDS), released however the run ends, retries included
        (the retry is a new run that must not wait for this one). W4: a check whose reply
        was lost is re-sent by the lease thread; still unknown at the end, the lock it
        should have released goes too."""
        marker, owner = admitted.marker, admitted.owner
        assert marker is not None and admitted.key is not None
        held: Any = None
        try:
            with leases.hold(store, marker, owner, app_settings.LEASE_SECONDS,
                             sender=type(self), delivery=admitted.delivery,
                             resend=admitted.resend, renew_at_once=admitted.resent) as held:
                return run_cancellable(self, held, admitted.key,
                                       lambda: self.run(*args, **kwargs))
        finally:
            if held is None or held.granted is not False:
                self._finish(store, marker, owner, admitted.alias, "", quiet=True)
            if held is not None and held.granted is None:
                self._finish(store, admitted.key, owner, admitted.alias, "processing")

    def cancel_requested(self) -> bool:
        """L2: has a later dispatch (``on_duplicate = "cancel_running"``) asked this run to
        stop? Read from the run's lease, renewed every third of LEASE_SECONDS: a cooperative
        body polls it and returns (its result then ends REVOKED, naming that dispatch).
        Always False in observe-only mode (R3) and outside a run of such a job."""
        held = getattr(self.request, "dedup_lease", None)
        return bool(held is not None and held.cancel and not self.observing())

    def _finish(self, store: BaseStore, key: JobKey, owner: str, alias: str, reason: str,
                *, quiet: bool = False, queued_only: bool = False) -> None:
        """Compare-and-delete ``owner``'s lock (or running marker: ``quiet``, no signal). A
        release that cannot reach the store is re-sent until it answers (W4: its reply may
        be lost, or it never ran), for as long as the lock could live."""
        release = store.release_queued if queued_only else store.release
        try:
            released = release(key, owner)
        except StoreUnavailable:
            logger.warning("%s[%s]: could not release %s; released as soon as the store "
                           "answers.", self.name, owner, key.key, exc_info=True)
            rollbacks.add(f"{key.key} of finished task {owner}",
                          lambda: bool(release(key, owner)), store=store,
                          lifetime=self._running_ttl() + app_settings.LEASE_SECONDS)
            return
        if released and not quiet:
            notify(lock_released, type(self), key=key.key, owner=owner, store=alias, reason=reason)

    def _same_key(self, key: JobKey, alias: str) -> bool:
        """Is ``key`` (on ``alias``) the key of the run being executed (its header's)?"""
        header = self.header()
        try:
            return header is None or (self.key_from_header(header) == key
                                      and str(header["via"]) == alias)
        except Exception:
            return True  # (as before: a header it cannot read keeps the lock for the retry)

    def release_dropped(self, owner: str, header: Any, args: Any, kwargs: Any, *,
                        ran: bool = True) -> None:
        """Release the lock of a message the worker drops without the job's own release
        running: revoked or expired before it ran, terminated, killed by its hard time limit.
        Called in the worker's main process. Compare-and-delete by ``owner``, so it is a no-op
        when the lock is gone or held by another owner (which is also why recomputing the key
        of a message without the header is safe here). ``ran`` False (dropped before it ran):
        only a lock still queued goes; a running one is another delivery's of the same id
        (W5), where the store can tell (``release_queued``)."""
        try:
            if isinstance(header, dict):
                key, alias = self.key_from_header(header), str(header["via"])
            else:
                key, alias = self.job_key(args, kwargs), self.store_alias()
        except Exception:
            logger.warning("%s[%s]: no dedup key for the dropped message; its lock (if any) "
                           "expires by itself.", self.name, owner, exc_info=True)
            return
        store = self.store(alias)
        if not ran and store.can_list:
            self._finish(store, key, owner, alias, "failure", queued_only=True)
            return
        if runs_exclusive(self):  # its running marker too (L2: a terminated run, R2)
            name_canceller(self, store, key, owner)
            self._finish(store, running_key(key), owner, alias, "", quiet=True)
        self._finish(store, key, owner, alias, "failure")

class UniqueUntilProcessingJob(UniqueJob):
    """Unique until a worker takes the message: the lock is released just before ``run``
    (Laravel's ``ShouldBeUniqueUntilProcessing``)."""

    release_on_start = True
