"""The admin Overview's shared history (A5): each process's tally is flushed into the
database (``dedup_jobs.metrics.models``) on an interval by a daemon thread of that process,
never on the decision path, so counting adds no round trip to any decision. A flush is a
few statements per (job, outcome) counted since the last one, in one transaction; a flush
that fails (the database down, the table not migrated) keeps its counts for the next one.

Every process shows in the Overview within ``DEDUP_JOBS["METRICS_FLUSH_SECONDS"]`` (30 s;
SPEC A5: 60 s; 0 keeps no history). A process
that exits flushes what is left (``atexit``, and Celery's ``worker_process_shutdown`` for
prefork children, which leave through ``os._exit``)."""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import threading
import time
from collections import Counter
from typing import Any

from dedup_jobs.conf import app_settings
from dedup_jobs.metrics.process import exporters, loaded, sync, tally
from dedup_jobs.metrics.tally import FOLD_SECONDS, Taken

logger = logging.getLogger("dedup_jobs")

#: keys of one flush written to the history (the busiest of the interval)
KEYS_PER_FLUSH = 50
#: seconds between two prunings of old buckets by one process
PRUNE_SECONDS = 600.0
#: seconds between two syncs of the exporters that keep their own values (a
#: prometheus_client multi-process directory)
SYNC_SECONDS = 1.0


class Flusher:
    """The metrics thread of this process: started on its first decision, again after a
    fork. It folds the tally's pending counts every ``FOLD_SECONDS``, hands them to the
    exporters that keep their own values every ``SYNC_SECONDS``
    (:func:`dedup_jobs.metrics.process.sync`) and flushes the history every
    ``METRICS_FLUSH_SECONDS``."""

    def __init__(self) -> None:
        self._pid = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pruned = 0.0

    def ensure(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._wake = threading.Event()
            thread = threading.Thread(target=self._loop, name="dedup_jobs-metrics",
                                      daemon=True)
            thread.start()

    def _loop(self) -> None:
        pid = os.getpid()
        flushed = synced = time.monotonic()
        while self._pid == pid:
            self._wake.wait(FOLD_SECONDS)
            woken = self._wake.is_set()
            self._wake.clear()
            tally.fold()
            now = time.monotonic()
            if exporters() and (woken or now - synced >= SYNC_SECONDS):
                synced = now
                sync()
            every = app_settings.METRICS_FLUSH_SECONDS
            if every and (woken or now - flushed >= every):
                flushed = now
                self.flush()

    def flush(self) -> bool:
        """Write what this process counted since the last flush; False if it could not be
        written (kept for the next flush)."""
        taken = tally.take()
        if taken.empty():
            return True
        try:
            write(taken, time.time())
            if time.monotonic() - self._pruned > PRUNE_SECONDS:
                self._pruned = time.monotonic()
                prune(time.time())
        except Exception:
            tally.give_back(taken)
            logger.debug("dedup_jobs metrics: flush failed; kept for the next one.",
                         exc_info=True)
            return False
        finally:
            from django.db import connections

            if threading.current_thread() is not threading.main_thread():
                connections.close_all()  # this thread's own connections
        return True


def _add(model: Any, lookup: dict[str, Any], count: int, field: str = "count",
         **extra: Any) -> None:
    """``count`` more in ``field`` of the row at ``lookup`` (made if missing; a racing insert
    of another process is met by adding to its row)."""
    from django.db import IntegrityError, transaction
    from django.db.models import F

    if model.objects.filter(**lookup).update(**{field: F(field) + count}):
        return
    try:
        with transaction.atomic():
            model.objects.create(**lookup, **{field: count}, **extra)
    except IntegrityError:
        model.objects.filter(**lookup).update(**{field: F(field) + count})


def write(taken: Taken, now: float) -> None:
    """Add one flush's counts to the history: each decision to the buckets of when it was
    counted (``taken.timed``, to FINE_SECONDS), any counted without a time to those of
    ``now``."""
    from django.db import transaction

    from dedup_jobs.metrics.models import (
        DAY,
        FINE,
        HOUR,
        MINUTE,
        DecisionCount,
        KeyCount,
        StoreError,
        StoreLatency,
    )

    minute = int(now // MINUTE * MINUTE)
    with transaction.atomic():
        untimed = Counter(taken.decisions)
        buckets: Counter[tuple[int, int, str, str]] = Counter()
        for (job, outcome, counted), count in taken.timed.items():
            untimed[(job, outcome)] -= count
            for resolution in (FINE, MINUTE, HOUR, DAY):
                buckets[(resolution, int(counted // resolution * resolution), job,
                         outcome)] += count
        for (job, outcome), count in untimed.items():
            for resolution in (FINE, MINUTE, HOUR, DAY):
                if count > 0:
                    buckets[(resolution, int(now // resolution * resolution), job,
                             outcome)] += count
        for (resolution, start, job, outcome), count in buckets.items():
            _add(DecisionCount, {"resolution": resolution, "start": start, "job": job,
                                 "outcome": outcome}, count)
        hour = int(now // HOUR * HOUR)
        for field, keys in (("count", taken.keys), ("deferred", taken.deferred_keys)):
            for (job, key), count in keys.most_common(KEYS_PER_FLUSH):
                digest = hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()
                _add(KeyCount, {"start": hour, "digest": digest}, count, field, job=job,
                     key=key)
        for alias, counts in taken.latency.items():
            for slot, count in enumerate(counts):
                if count:
                    _add(StoreLatency, {"start": minute, "store": alias, "slot": slot}, count)
        if taken.last_error is not None:
            at, alias, message = taken.last_error
            StoreError.objects.update_or_create(store=alias, defaults={
                "at": at, "message": message[:2000]})


def prune(now: float) -> None:
    """Drop buckets past their resolution's keep (bounded history)."""
    from dedup_jobs.metrics.models import DAY, KEEP, DecisionCount, KeyCount, StoreLatency

    for resolution, keep in KEEP.items():
        DecisionCount.objects.filter(resolution=resolution, start__lt=now - keep).delete()
    KeyCount.objects.filter(start__lt=now - DAY).delete()
    StoreLatency.objects.filter(start__lt=now - DAY).delete()


flusher = Flusher()


def flush_at_exit(**kwargs: Any) -> None:
    """The process is ending: hand the last counts to the exporters, and flush what is left
    if this process keeps history."""
    if loaded():
        sync()
    if flusher._pid == os.getpid() and app_settings.METRICS_FLUSH_SECONDS:
        flusher.flush()


atexit.register(flush_at_exit)
