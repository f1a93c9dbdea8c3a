"""ThrottledJob: concurrency and rate limits per throttle key, across every worker, that
defer a message instead of dropping it (SPEC section 10).

Where a message is admitted or deferred: :meth:`ThrottledJob.__call__` →
:func:`dedup_jobs.jobs.admission.admit_throttle` →
:func:`dedup_jobs.engine.throttle_admission.admit` → ``store.throttle_admit`` (one store call).
Where its slot is renewed and released: :func:`dedup_jobs.engine.throttle.holding`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from celery.exceptions import Retry
from celery.result import AsyncResult

from dedup_jobs import metrics
from dedup_jobs.engine.throttle import holding
from dedup_jobs.exceptions import InvalidJobConfiguration
from dedup_jobs.jobs.admission import admit_throttle
from dedup_jobs.jobs.base import DedupJob
from dedup_jobs.jobs.calls import check_limits


class ThrottledJob(DedupJob):
    """A job of which at most ``concurrency`` runs per throttle key run at once and at most
    ``throttle`` ("K/s", "K/m", "K/h") start per period, across every worker. Nothing is
    deduplicated: every dispatch runs, some later than others."""

    dedup_kind: ClassVar[str] = "throttle"
    _key_fields_option = "throttle_on"
    _id_hook = "throttle_id"
    _via_option = "throttle_via"

    @classmethod
    def validate_options(cls) -> None:
        label = cls._job_label()
        for name in ("unique_for", "debounce_for"):
            if getattr(cls, name, None) is not None:
                raise InvalidJobConfiguration(
                    f"{label}: {name} is not an option of a ThrottledJob. Set the throttle "
                    f"options on a UniqueJob or DebouncedJob instead (T1).")
        if cls.concurrency is None and cls.throttle is None:
            raise InvalidJobConfiguration(
                f"{label}: a ThrottledJob needs concurrency = N or throttle = \"K/s\" (or "
                f"both, or a method for either, L1); it has neither.")
        super().validate_options()

    def apply_async(  # type: ignore[override]
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        retry = task_id is not None and task_id == self.request.id
        if retry:
            # a retry (same id) keeps the slot of the attempt that is ending (T2), while
            # its arguments keep it in that slot (L1)
            self.retry_slot(args, kwargs)
        else:
            if getattr(self, "throttle_id", None) is not None:
                # A4: an id the hook cannot give (not a str or an int, a NUL...) is refused
                # here, naming the hook, rather than running unthrottled at the worker
                self.throttle_key(args, kwargs)
            # L1: a limit method's bad value is refused here, at dispatch, naming it
            check_limits(self, args, kwargs)
        result = super().apply_async(args, kwargs, task_id, **options)
        if not retry:
            # A5: a dispatch published (a deferral's re-publish is counted "deferred" and
            # goes through DedupJob.publish_again; a retry is not a dispatch)
            metrics.decision(self.name, "dispatched")
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)
        slot = admit_throttle(self, args, kwargs, lambda countdown: self.publish_again(
            args, kwargs, countdown))
        metrics.decision(self.name, "ran")
        with holding(slot, type(self), request, keep_on=(Retry,), wake=self.waker()):
            return self.run(*args, **kwargs)
