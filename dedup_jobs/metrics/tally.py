"""The in-process tally of decisions and store calls (A5): counters kept by every process,
read by the exporters and, as differences since the last flush, by the admin's history
(see :mod:`dedup_jobs.metrics.history`). No store call, no I/O here."""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

#: every outcome a decision is counted under (SPEC A5), in the order the docs list them
OUTCOMES = (
    "dispatched",  # a dispatch was published (a lock taken, a burst started, or no lock: S4)
    "deduplicated",  # a dispatch found the lock held: nothing published (U2)
    "skipped",  # a message reached a worker while another owner held its lock (W3)
    "superseded",  # a debounced dispatch was superseded by a later one of its burst (D3)
    "deferred",  # a message reached a worker and waits: re-published with a countdown
    "replaced",  # a queued copy was replaced by a later dispatch (R1)
    "cancelled",  # a running copy was asked to stop by a later dispatch (L2)
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
#: counts pending before a decision folds them itself (the metrics thread did not)
FOLD_AT = 4096
#: seconds between two folds by the metrics thread
FOLD_SECONDS = 0.1
#: seconds of the finest time buckets of the history (the Overview's recent chart): each
#: decision is put in the bucket of the fold that counted it (at most FOLD_SECONDS late)
FINE_SECONDS = 10


@dataclass(kw_only=True)
class Taken:
    """What one process counted since the last flush."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (job, outcome)
    keys: Counter[tuple[str, str]] = field(default_factory=Counter)  # (job, key): duplicates
    #: (job, key): deferrals (kept apart from the duplicates prevented)
    deferred_keys: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (job, outcome, start of its FINE_SECONDS bucket): when the decisions were counted
    timed: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    latency: dict[str, list[int]] = field(default_factory=dict)  # store alias: bucket counts
    last_error: tuple[float, str, str] | None = None  # (epoch seconds, store alias, message)

    def empty(self) -> bool:
        return not (self.decisions or self.keys or self.deferred_keys or self.timed
                    or self.latency or self.last_error)


class Tally:
    """Counters of one process since it started: ``totals`` (decisions by (job, outcome))
    and ``calls`` (store calls by (store alias, call): bucket counts, then the sum of their
    seconds last). What the exporters read (prometheus_client at scrape time,
    OpenTelemetry at collection), and what :meth:`take` turns into the counts since the
    last flush for the admin's history.

    On the decision path a count is one ``deque.append`` (thread-safe, no lock): of
    ``(job, outcome, key)`` to ``decided``, of a call's seconds to its label's deque in
    ``timings``. :meth:`fold` adds the pending counts to the counters, in batches counted in
    C (``Counter.update``, ``sorted`` and ``bisect``). The metrics thread folds every
    ``FOLD_SECONDS``, every reader folds first, and a decision folds itself only when
    ``FOLD_AT`` are pending in one deque (the thread is not keeping up), so the pending
    memory is bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one folder at a time; guards everything below
        #: decisions not folded yet: (job, outcome, key)
        self.decided: deque[tuple[str, str, str | None]] = deque()
        #: store calls not folded yet: seconds, by (alias, call)
        self.timings: dict[tuple[str, str], deque[float]] = {}
        #: store calls that failed, not folded yet: (alias, call, seconds, error)
        self.failed: deque[tuple[str, str, float, str]] = deque()
        #: decisions since the process started, by (job, outcome)
        self.totals: Counter[tuple[str, str]] = Counter()
        #: store calls since the process started, by (alias, call): bucket counts (the last
        #: one +Inf), then the sum of their seconds
        self.calls: dict[tuple[str, str], list[float]] = {}
        self._keys: Counter[tuple[str, str]] = Counter()  # since the last take
        self._deferred_keys: Counter[tuple[str, str]] = Counter()  # since the last take
        self._timed: Counter[tuple[str, str, int]] = Counter()  # since the last take
        self._error: tuple[float, str, str] | None = None  # since the last take
        # what the last take saw of totals and calls (the next one hands on the difference)
        self._taken: dict[tuple[str, str], int] = {}
        self._taken_calls: dict[tuple[str, str], list[float]] = {}
        self._given_back: Taken | None = None

    def timing(self, alias: str, call: str) -> deque[float]:
        """The deque the seconds of ``alias``'s ``call`` calls are appended to."""
        found = self.timings.get((alias, call))
        if found is None:
            with self._lock:
                found = self.timings.setdefault((alias, call), deque())
        return found

    def decision(self, job: str, outcome: str, key: str | None) -> None:
        self.decided.append((job, outcome, key))
        if len(self.decided) > FOLD_AT:
            self.fold()

    def store_call(self, alias: str, call: str, seconds: float, error: str | None) -> None:
        if error is not None:
            self.failed.append((alias, call, seconds, error))
            return
        queue = self.timing(alias, call)
        queue.append(seconds)
        if len(queue) > FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Add the pending counts to the counters."""
        with self._lock:
            self._fold()

    def _fold(self) -> None:
        decided = _drain(self.decided)
        if decided:
            self.totals.update([(job, outcome) for job, outcome, _key in decided])
            start = int(time.time() // FINE_SECONDS * FINE_SECONDS)
            self._timed.update([(job, outcome, start) for job, outcome, _key in decided])
            keyed = [(job, key) for job, outcome, key in decided
                     if key is not None and outcome != "deferred"]
            _count_keys(self._keys, keyed)
            _count_keys(self._deferred_keys, [(job, key) for job, outcome, key in decided
                                              if key is not None and outcome == "deferred"])
        for label, queue in list(self.timings.items()):
            seconds = _drain(queue)
            if seconds:
                self._add_calls(label, sorted(seconds))
        for alias, call, took, error in _drain(self.failed):
            self._add_calls((alias, call), [took])
            self._error = (time.time(), alias, error)

    def _add_calls(self, label: tuple[str, str], seconds: list[float]) -> None:
        """Add sorted ``seconds`` to the histogram of ``label`` (a call falls in the first
        bucket whose bound it does not exceed, as in Prometheus)."""
        counts = self.calls.get(label)
        if counts is None:
            counts = self.calls[label] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        below = 0
        for slot, bound in enumerate(LATENCY_BUCKETS):
            upto = bisect.bisect_right(seconds, bound)
            counts[slot] += upto - below
            below = upto
        counts[len(LATENCY_BUCKETS)] += len(seconds) - below
        counts[-1] += sum(seconds)

    def snapshot(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], list[float]]]:
        """Copies of ``totals`` and ``calls`` (all counted so far), taken together."""
        with self._lock:
            self._fold()
            return dict(self.totals), {name: list(c) for name, c in self.calls.items()}

    def forked(self) -> None:
        """In a forked child: what the parent counted is the parent's to flush."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        # the parent's counts, not folded yet: the parent folds them (cleared in place: the
        # stores keep references to their deques)
        self.decided.clear()
        self.failed.clear()
        for queue in self.timings.values():
            queue.clear()
        self._taken, self._taken_calls = self.snapshot()
        self._keys, self._error, self._given_back = Counter(), None, None
        self._deferred_keys, self._timed = Counter(), Counter()

    def take(self) -> Taken:
        """Everything counted since the last take (the difference of the running totals)."""
        with self._lock:
            self._fold()
            totals = dict(self.totals)
            calls = {name: list(counts) for name, counts in self.calls.items()}
            keys, self._keys = self._keys, Counter()
            deferred_keys, self._deferred_keys = self._deferred_keys, Counter()
            timed, self._timed = self._timed, Counter()
            error, self._error = self._error, None
            back, self._given_back = self._given_back, None
        taken = Taken(keys=keys, deferred_keys=deferred_keys, timed=timed, last_error=error)
        last = self._taken
        for name, count in totals.items():
            if count != last.get(name, 0):
                taken.decisions[name] = count - last.get(name, 0)
        last_calls = self._taken_calls
        for (alias, _call), counts in calls.items():
            before = last_calls.get((alias, _call))
            mine = taken.latency.setdefault(alias, [0] * (len(LATENCY_BUCKETS) + 1))
            for slot in range(len(LATENCY_BUCKETS) + 1):
                mine[slot] += int(counts[slot] - (before[slot] if before else 0))
        taken.latency = {a: c for a, c in taken.latency.items() if any(c)}
        self._taken, self._taken_calls = totals, calls
        if back is not None:
            merge(taken, back)
        return taken

    def give_back(self, taken: Taken) -> None:
        """A flush that failed: its counts go with the next one."""
        with self._lock:
            if self._given_back is None:
                self._given_back = taken
            else:
                merge(self._given_back, taken)


def _count_keys(keys: Counter[tuple[str, str]], keyed: list[tuple[str, str]]) -> None:
    """Add ``keyed`` to ``keys``, remembering at most MAX_KEYS distinct keys."""
    if len(keys) + len(keyed) <= MAX_KEYS:
        keys.update(keyed)
        return
    for pair in keyed:
        if len(keys) < MAX_KEYS or pair in keys:
            keys[pair] += 1


def _drain(queue: deque[Any]) -> list[Any]:
    """Take what ``queue`` holds now (appends made meanwhile stay for the next drain)."""
    take = queue.popleft
    return [take() for _ in range(len(queue))]


def merge(into: Taken, other: Taken) -> None:
    """Add ``other``'s counts to ``into``."""
    into.decisions.update(other.decisions)
    into.keys.update(other.keys)
    into.deferred_keys.update(other.deferred_keys)
    into.timed.update(other.timed)
    for alias, counts in other.latency.items():
        mine = into.latency.setdefault(alias, [0] * len(counts))
        for slot, count in enumerate(counts):
            mine[slot] += count
    if into.last_error is None:
        into.last_error = other.last_error


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
