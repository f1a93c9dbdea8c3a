"""Decision metrics (SPEC A5): every decision counted once, by job and outcome, in the process
that makes it, with no store round trip added.

Where a decision is counted: :func:`decision`, called where the decision is made (dispatch:
``jobs/unique.py``, ``jobs/debounced.py``, ``jobs/replace.py``; worker: ``jobs/admission.py``,
``jobs/debounced.py``; lease: ``engine/lease.py``). Where a store call is timed (and a store
error counted): in the Redis family, ``RedisConnection._eval`` (``stores/redis/connection.py``,
where each script is sent); in the other stores, :func:`timed`, wrapped around every decision
method by ``stores/base.py``.

Each count goes to the process's :class:`~dedup_jobs.metrics.tally.Tally`; its metrics thread
(:mod:`dedup_jobs.metrics.history`) folds the counts, flushes them into the database for the
admin Overview and hands them to the exporters whose library is installed, which otherwise
read the tally when collected: ``prometheus_client`` (:mod:`dedup_jobs.metrics.prometheus`)
and the OpenTelemetry metrics API (:mod:`dedup_jobs.metrics.otel`). Neither library is imported
unless it is installed and ``DEDUP_JOBS["METRICS"]`` is True (the default)."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any, TypeVar

from dedup_jobs.conf import app_settings
from dedup_jobs.metrics.process import exporters, sync, tally
from dedup_jobs.metrics.tally import FOLD_AT, LATENCY_BUCKETS, OUTCOMES

__all__ = ["LATENCY_BUCKETS", "OUTCOMES", "decision", "exporters", "sync", "tally", "timed"]


def decision(job: str, outcome: str, key: str | None = None) -> None:
    """Count one decision of ``job`` (its task name) with ``outcome`` (one of
    :data:`OUTCOMES`); ``key`` (a lock key) for the admin's busiest keys. In-process only:
    one append to the tally's pending counts; the metrics thread does the rest."""
    if not app_settings.raw.get("METRICS", True):
        return
    _decided.append((job, outcome, key))
    if len(_decided) > FOLD_AT:
        tally.fold()
    if not _thread_started:
        _start_thread()


def store_call(alias: str, call: str, seconds: float, error: str | None = None) -> None:
    """Count one store call of ``seconds`` (``error``: it raised StoreUnavailable)."""
    tally.store_call(alias, call, seconds, error)


def call_failed(alias: str, call: str, seconds: float, exc: Exception, job: str) -> None:
    """Count one store call that raised StoreUnavailable, and a ``store_error`` of ``job``."""
    tally.store_call(alias, call, seconds, str(exc))
    decision(job, "store_error")


_decided = tally.decided
_thread_started = False


def _start_thread() -> None:
    """This process's metrics thread (folds, exporter syncs, history flushes), once per
    process (again in a forked child)."""
    global _thread_started
    from dedup_jobs.metrics.history import flusher

    exporters()  # loaded with the first decision: prometheus_client's collector is registered
    flusher.ensure()
    _thread_started = True


def _forked() -> None:
    global _thread_started
    _thread_started = False
    tally.forked()


os.register_at_fork(after_in_child=_forked)


F = TypeVar("F", bound=Callable[..., Any])

_timing = threading.local()


def timed(method: F) -> F:
    """Wrap a store's decision method: time it for the latency histogram and count a
    ``StoreUnavailable`` it raises as a ``store_error`` of the key's job. A call made from
    inside another timed call of the same thread (a store method calling another) is
    counted once, by the outer one. Adds no store call."""
    from dedup_jobs.exceptions import StoreUnavailable

    call = method.__name__

    @functools.wraps(method)
    def wrapper(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        mine = _timing.__dict__  # this thread's own
        if mine.get("busy") or not app_settings.raw.get("METRICS", True):
            return method(self, key, *args, **kwargs)
        mine["busy"] = True
        started = perf_counter()
        try:
            answer = method(self, key, *args, **kwargs)
        except StoreUnavailable as exc:
            call_failed(self.alias, call, perf_counter() - started, exc,
                        str(getattr(key, "task_name", "") or "?"))
            raise
        finally:
            mine["busy"] = False
        tally.store_call(self.alias, call, perf_counter() - started, None)
        return answer

    wrapper.__dedup_timed__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
