"""The in-process tally of decisions and store calls (A5): plain counters under one lock,
kept by every process for the admin's history (see :mod:`dedup_jobs.metrics.history`), and
taken (swapped for empty ones) when they are flushed. No store call, no I/O here."""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

#: every outcome a decision is counted under (SPEC A5), in the order the docs list them
OUTCOMES = (
    "dispatched",  # a dispatch was published (a lock taken, a burst started, or no lock: S4)
    "deduplicated",  # a dispatch found the lock held: nothing published (U2)
    "skipped",  # a message reached a worker while another owner held its lock (W3)
    "superseded",  # a debounced dispatch was superseded by a later one of its burst (D3)
    "deferred",  # a message reached a worker and waits: re-published with a countdown
    "replaced",  # a queued copy was replaced by a later dispatch (R1)
    "ran",  # a message's body runs at a worker
    "lock_lost",  # a running job's lease found its lock held by another owner (W6)
    "store_error",  # a store call failed (StoreUnavailable)
)

#: upper bounds (seconds) of the store-call latency histogram's buckets; one more bucket
#: past the last bound (+Inf)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)

#: distinct keys remembered per flush interval for "busiest keys" (the rest are dropped)
MAX_KEYS = 1000


@dataclass(kw_only=True)
class Taken:
    """What one process counted since the last flush."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (job, outcome)
    keys: Counter[tuple[str, str]] = field(default_factory=Counter)  # (job, key): duplicates
    latency: dict[str, list[int]] = field(default_factory=dict)  # store alias: bucket counts
    last_error: tuple[float, str, str] | None = None  # (epoch seconds, store alias, message)

    def empty(self) -> bool:
        return not (self.decisions or self.keys or self.latency or self.last_error)


class Tally:
    """Counters of one process since the last :meth:`take`, and since the process started
    (``totals``, ``calls``: what the OpenTelemetry exporter observes at collection time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = Taken()
        #: decisions since the process started, by (job, outcome)
        self.totals: Counter[tuple[str, str]] = Counter()
        #: store calls since the process started, by (alias, call): bucket counts, then the
        #: sum of their seconds last
        self.calls: dict[tuple[str, str], list[float]] = {}

    def decision(self, job: str, outcome: str, key: str | None) -> None:
        with self._lock:
            self.totals[(job, outcome)] += 1
            now = self._now
            now.decisions[(job, outcome)] += 1
            if key is not None and (len(now.keys) < MAX_KEYS or (job, key) in now.keys):
                now.keys[(job, key)] += 1

    def store_call(self, alias: str, call: str, seconds: float, error: str | None) -> None:
        slot = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            totals = self.calls.get((alias, call))
            if totals is None:
                totals = self.calls[(alias, call)] = [0.0] * (len(LATENCY_BUCKETS) + 2)
            totals[slot] += 1
            totals[-1] += seconds
            now = self._now
            counts = now.latency.get(alias)
            if counts is None:
                counts = now.latency[alias] = [0] * (len(LATENCY_BUCKETS) + 1)
            counts[slot] += 1
            if error is not None:
                now.last_error = (time.time(), alias, error)

    def take(self) -> Taken:
        """Everything counted so far; the tally starts again from zero."""
        with self._lock:
            taken, self._now = self._now, Taken()
        return taken

    def give_back(self, taken: Taken) -> None:
        """A flush that failed: its counts are added back, so they go with the next one."""
        with self._lock:
            now = self._now
            now.decisions.update(taken.decisions)
            now.keys.update(taken.keys)
            for alias, counts in taken.latency.items():
                mine = now.latency.setdefault(alias, [0] * len(counts))
                for slot, count in enumerate(counts):
                    mine[slot] += count
            if now.last_error is None:
                now.last_error = taken.last_error


def quantile(counts: list[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a latency histogram, as the upper bound of the bucket it
    falls in (the last bound for the +Inf bucket); None when nothing was counted."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    for slot, count in enumerate(counts):
        seen += count
        if seen >= rank and count:
            return LATENCY_BUCKETS[min(slot, len(LATENCY_BUCKETS) - 1)]
    return LATENCY_BUCKETS[-1]
