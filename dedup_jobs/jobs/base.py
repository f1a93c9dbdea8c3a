"""What every dedup job shares: option validation at class creation, keys, store lookup and
the message header that carries the key and owner token from dispatch to worker."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from celery.contrib.django.task import DjangoTask

from dedup_jobs import keys
from dedup_jobs.conf import app_settings, is_seconds, not_finite
from dedup_jobs.engine.throttle import ThrottleOptions
from dedup_jobs.exceptions import DedupError, InvalidJobConfiguration, InvalidJobId
from dedup_jobs.jobs.calls import check_each, checked_calls, refuse_one_message_options
from dedup_jobs.jobs.wake import AGAIN, wakeable, waker
from dedup_jobs.keys import JobKey, fields_problem
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import BaseStore

logger = logging.getLogger("dedup_jobs")

#: message header carrying {"key", "task", "id", "via"} from the dispatch to the worker
HEADER = "dedup_jobs"


def _run_parameters(cls: type) -> list[inspect.Parameter] | None:
    """Parameters of ``cls.run`` as the caller passes them (no ``self``); None if unknown."""
    raw = inspect.getattr_static(cls, "run", None)
    if raw is None:
        return None
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    if not isinstance(raw, staticmethod) and params:
        params = params[1:]  # self (class style, or bind=True)
    return params


def new_task_id() -> str:
    """A random (version 4) UUID string, as Celery's ``uuid()`` makes for a task id, without
    building a ``uuid.UUID`` on the dispatch path."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


class DedupJob(ThrottleOptions, DjangoTask):  # type: ignore[type-arg]
    """Base of the job kinds. Not used directly. Every kind takes the throttle options
    (``engine/throttle.py``, T1)."""

    #: "unique" or "debounce": set by each kind; a class that is both is refused (U0)
    dedup_kind: ClassVar[str] = ""
    #: names of the options that define the key: unique_on/debounce_on etc., per kind
    _key_fields_option: ClassVar[str] = ""
    _id_hook: ClassVar[str] = ""
    _via_option: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kinds = {getattr(base, "dedup_kind", "") for base in cls.__mro__} - {""}
        if len(kinds) > 1:
            raise InvalidJobConfiguration(
                f"{cls.__qualname__} is both unique and debounced. A job is either one: "
                f"keep UniqueJob/UniqueUntilProcessingJob or DebouncedJob, not both."
            )
        if "run" in cls.__dict__:
            cls.validate_options()

    @classmethod
    def validate_options(cls) -> None:
        """Raise InvalidJobConfiguration for options that cannot work. Extended per kind."""
        cls.validate_throttle(cls._job_label())
        cls._check_fields(cls._key_fields_option)
        if cls._key_fields_option != "throttle_on":
            cls._check_fields("throttle_on")

    @classmethod
    def _check_fields(cls, option: str) -> None:
        """The argument names of ``option`` (unique_on, debounce_on, throttle_on) must be
        arguments of run."""
        fields = getattr(cls, option, None)
        if fields is None:
            return
        problem = fields_problem(option, fields)
        if problem:
            raise InvalidJobConfiguration(f"{cls._job_label()}: {problem}")
        params = _run_parameters(cls)
        if params is None:
            return
        names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in params)
        unknown = [f for f in fields if f not in names]
        if unknown and not accepts_any:
            raise InvalidJobConfiguration(
                f"{cls._job_label()}: {option} names {unknown!r}, which "
                f"run() does not take. Its arguments are {names!r}."
            )

    @classmethod
    def _job_label(cls) -> str:
        return str(cls.__dict__.get("name") or cls.__qualname__)

    @staticmethod
    def _positive(cls_label: str, option: str, value: Any) -> None:
        if value is None:
            return
        if not is_seconds(value) or value <= 0:
            raise InvalidJobConfiguration(
                f"{cls_label}: {option} = {value!r} must be a number of seconds above 0"
                f"{not_finite(value)}."
            )

    #: L3: how a batch of this kind is dispatched at once (``jobs/bulk.py``
    #: ``dispatch_batch`` for the unique kinds); None: one call at a time
    _batch: ClassVar[Callable[..., list[Any]] | None] = None

    def dispatch_many(self, calls: Iterable[Any], **options: Any) -> list[Any]:
        """L3: dispatch each ``(args, kwargs)`` of ``calls`` with ``options`` (what
        ``apply_async`` takes, but a task id, links or a canvas); one ``AsyncResult`` per
        call, in order, as a single dispatch would return it. A unique kind takes every lock
        of the batch in one store round trip (docs/jobs.md#dispatch-many)."""
        checked = checked_calls(self, calls)
        refuse_one_message_options(self, options)
        batch = type(self)._batch
        if batch is None:
            check_each(self, checked)
            return [self.apply_async(args, kwargs, **options) for args, kwargs in checked]
        return batch(self, checked, options)

    # -- keys and stores ----------------------------------------------------------------

    def store_alias(self) -> str:
        via = getattr(self, self._via_option, None)
        if callable(via):
            via = via()
        return str(via) if via else app_settings.STORE

    def store(self, alias: str | None = None) -> BaseStore:
        return get_store(alias or self.store_alias())

    def job_id(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> str:
        """The id part of the key: the job's hook (unique_id/debounce_id) or the bound
        arguments named by unique_on/debounce_on (all arguments by default)."""
        hook = getattr(self, self._id_hook, None)
        if hook is not None:
            value = hook(*(args or ()), **(kwargs or {}))
            ident = keys.hook_id(value)
            if ident is None:  # A4: None, bytes, objects... raise naming the hook
                raise InvalidJobId(self.name, f"{self._id_hook}()", value,
                                   keys.HOOK_TYPE_PROBLEM)
            return ident
        return keys.default_id(
            self.name,
            self.run,
            args,
            kwargs,
            getattr(self, self._key_fields_option, None),
            self._id_hook,
        )

    def job_key(
        self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
        store: BaseStore | None = None,
    ) -> JobKey:
        """The key of a dispatch with these arguments (``store``: the job's store, when the
        caller has it already). An id its store cannot hold raises :class:`InvalidJobId`
        here, before any store call (A4)."""
        ident = self.job_id(args, kwargs)
        problem = keys.id_problem(ident)
        if problem is None:
            key = keys.build_key(self.dedup_kind, self.name, ident)
            if store is None:
                try:
                    store = self.store()
                except DedupError:
                    return key  # an unknown store: the caller's own lookup says so
            problem = store.key_problem(key)
            if problem is None:
                return key
        raise InvalidJobId(self.name, self._id_source(), ident, problem)

    def _id_source(self) -> str:
        """Where the id came from, for error messages."""
        if getattr(self, self._id_hook, None) is not None:
            return f"{self._id_hook}()"
        fields = getattr(self, self._key_fields_option, None)
        chosen = f"{self._key_fields_option} = {tuple(fields)!r}" if fields else "all arguments"
        return f"the default key ({chosen}; define {self._id_hook}() to choose the id)"

    def header(self) -> dict[str, Any] | None:
        """The dedup header of the message being executed, if it has one."""
        request = self.request
        value = (getattr(request, "headers", None) or {}).get(HEADER)
        if value is None:
            value = getattr(request, HEADER, None)
        return value if isinstance(value, dict) else None

    @staticmethod
    def key_from_header(header: Mapping[str, Any]) -> JobKey:
        return JobKey(key=header["key"], task_name=header["task"], ident=header["id"])

    @staticmethod
    def with_header(options: dict[str, Any], header: dict[str, Any]) -> dict[str, Any]:
        headers = dict(options.get("headers") or {})
        headers[HEADER] = header
        return {**options, "headers": headers}

    def waker(self) -> Callable[[str], None] | None:
        """T2's wake for this job's app: a release that calls a waiter brings its held
        message forward (``jobs/wake.py``); None where its workers cannot be woken (then a
        release calls nobody)."""
        return waker(self.app) if wakeable(self.app) else None

    def retry_slot(self, args: Any, kwargs: Any) -> None:
        """T2: a retry (same task id) of the run being executed keeps that run's slot only
        while its arguments keep it in that slot (``retry_keeps_slot``: the same throttle
        key, with a concurrency limit); otherwise the slot is freed when the attempt ends."""
        if self.throttled():
            request = self.request
            request.update(dedup_slot_kept=self.retry_keeps_slot(
                (request.args, request.kwargs), args, kwargs))

    def publish_again(self, args: Any, kwargs: Any, countdown: float,
                      finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        """Publish the message being executed again, same task id, after ``countdown``: the
        one re-publish of every kind (a message that waits for a slot, a start, an overlapping
        run, its first delivery, a take-over's outcome or the store). Its options are the
        request's, as Celery's own ``retry`` builds them (headers, routing, links kept; no
        ``eta``); ``finish`` sets the dedup header the next delivery reads. A plain Celery
        publish: no dedup decision is taken again."""
        request = self.request
        signature = self.signature_from_request(request, args, kwargs, countdown=countdown)
        options = dict(signature.options)
        task_id = str(options.pop("task_id", None) or request.id)
        options.pop("eta", None)
        # AGAIN: the wake may move it (jobs/wake.py); a retry copies it with one more retry
        headers = {**(options.get("headers") or {}), AGAIN: int(request.retries or 0)}
        options = {**options, "countdown": countdown, "headers": headers}
        if finish is not None:
            options = finish(options)
        DjangoTask.apply_async(self, args, kwargs, task_id, **options)


def message_wait(options: dict[str, Any], now: float) -> float:
    """Seconds a message waits before a worker may take it (countdown or eta)."""
    countdown = options.get("countdown")
    if countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if eta is None:
        return 0.0
    if isinstance(eta, str):
        from datetime import datetime

        eta = datetime.fromisoformat(eta)
    if eta.tzinfo is None:
        from django.utils import timezone as dj_timezone

        eta = dj_timezone.make_aware(eta, dj_timezone.get_default_timezone())
    return max(0.0, eta.timestamp() - now)
