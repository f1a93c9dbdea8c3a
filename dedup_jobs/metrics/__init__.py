"""Decision metrics (SPEC A5): every decision counted once, by job and outcome, in the process
that makes it, with no store round trip added.

Where a decision is counted: :func:`decision`, called where the decision is made (dispatch:
``jobs/unique.py``, ``jobs/debounced.py``, ``jobs/replace.py``; worker: ``jobs/admission.py``,
``jobs/debounced.py``; lease: ``jobs/lease.py``). Where a store call is timed (and a store
error counted): :func:`timed`, wrapped around every decision method of every store by
``stores/base.py``.

Each count goes to the process's :class:`~dedup_jobs.metrics.tally.Tally` (flushed into the
database for the admin Overview, :mod:`dedup_jobs.metrics.history`) and to the exporters
whose library is installed: ``prometheus_client`` (:mod:`dedup_jobs.metrics.prometheus`) and
the OpenTelemetry metrics API (:mod:`dedup_jobs.metrics.otel`). Neither library is imported
unless it is installed and ``DEDUP_JOBS["METRICS"]`` is True (the default)."""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from dedup_jobs.conf import app_settings
from dedup_jobs.metrics.tally import LATENCY_BUCKETS, OUTCOMES, Tally

__all__ = ["LATENCY_BUCKETS", "OUTCOMES", "decision", "exporters", "tally", "timed"]


class Exporter(Protocol):
    def decision(self, job: str, outcome: str) -> None: ...

    def store_call(self, alias: str, call: str, seconds: float) -> None: ...


#: the tally of this process (see dedup_jobs.metrics.history for where it goes)
tally = Tally()

#: (module of ours, library it needs): loaded when the library is installed
EXPORTERS = (
    ("dedup_jobs.metrics.prometheus", "prometheus_client"),
    ("dedup_jobs.metrics.otel", "opentelemetry.metrics"),
)

_exporters: list[Exporter] | None = None
_loading = threading.Lock()


def _installed(name: str) -> bool:
    top = name.partition(".")[0]
    try:
        return importlib.util.find_spec(top) is not None and importlib.util.find_spec(
            name) is not None
    except (ImportError, ValueError):
        return False


def exporters() -> list[Exporter]:
    """The exporters of this process, loaded on first use."""
    global _exporters
    found = _exporters
    if found is None:
        with _loading:
            found = _exporters
            if found is None:
                found = []
                for module, library in EXPORTERS:
                    if _installed(library):
                        made = importlib.import_module(module).exporter()
                        if made is not None:  # None: it observes the tally, no per-call work
                            found.append(made)
                _exporters = found
    return found


def decision(job: str, outcome: str, key: str | None = None) -> None:
    """Count one decision of ``job`` (its task name) with ``outcome`` (one of
    :data:`OUTCOMES`); ``key`` (a lock key) for the admin's busiest keys. In-process only."""
    if not app_settings.raw.get("METRICS", True):
        return
    tally.decision(job, outcome, key)
    for exporter in _exporters if _exporters is not None else exporters():
        exporter.decision(job, outcome)
    if _flusher is None:
        _start_flusher()
    elif _flusher._pid != os.getpid():
        _flusher.ensure()


def store_call(alias: str, call: str, seconds: float, error: str | None = None) -> None:
    """Count one store call of ``seconds`` (``error``: it raised StoreUnavailable)."""
    tally.store_call(alias, call, seconds, error)
    for exporter in _exporters if _exporters is not None else exporters():
        exporter.store_call(alias, call, seconds)


_flusher: Any = None


def _start_flusher() -> None:
    global _flusher
    from dedup_jobs.metrics.history import flusher

    _flusher = flusher
    flusher.ensure()


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
        if getattr(_timing, "busy", False) or not app_settings.raw.get("METRICS", True):
            return method(self, key, *args, **kwargs)
        _timing.busy = True
        started = time.perf_counter()
        try:
            answer = method(self, key, *args, **kwargs)
        except StoreUnavailable as exc:
            store_call(self.alias, call, time.perf_counter() - started, str(exc))
            decision(str(getattr(key, "task_name", "") or "?"), "store_error")
            raise
        finally:
            _timing.busy = False
        store_call(self.alias, call, time.perf_counter() - started)
        return answer

    wrapper.__dedup_timed__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
