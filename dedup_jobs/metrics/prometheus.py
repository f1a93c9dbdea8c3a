"""The ``prometheus_client`` exporter (``pip install dedup-jobs[prometheus]``): the counter
``dedup_jobs_decisions_total{job, outcome}`` and the histogram
``dedup_jobs_store_call_seconds{store, call}``, registered in prometheus_client's default
registry.

Nothing of it runs on the decision path: a decision counts into the process's tally only.

- In one process (no ``PROMETHEUS_MULTIPROC_DIR``), a collector reads the tally's running
  totals when the registry is scraped (:class:`TallyCollector`).
- Under a prefork Celery worker, set ``PROMETHEUS_MULTIPROC_DIR`` before the worker starts:
  every process then keeps a prometheus_client ``Counter`` and ``Histogram`` (whose values
  live in files there, read by one ``MultiProcessCollector``, docs/monitoring.md), and its
  metrics thread adds what the tally counted to them every second and once more as the
  process exits (:class:`MultiProcessSync`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from dedup_jobs.metrics.tally import LATENCY_BUCKETS

NAME = "dedup_jobs_decisions"
HELP = "Decisions of dedup_jobs, by job (task name) and outcome (SPEC A5)."
SECONDS = "dedup_jobs_store_call_seconds"
SECONDS_HELP = "Seconds one dedup_jobs store call took, by store alias and call."
#: the ``le`` labels, as prometheus_client writes them (``floatToGoString``)
BOUNDS = [*(repr(bound) for bound in LATENCY_BUCKETS), "+Inf"]


class TallyCollector(Collector):
    """The tally's running totals, read at scrape time (one process)."""

    def collect(self) -> Iterator[Any]:
        from dedup_jobs.metrics import tally

        totals, calls = tally.snapshot()
        decisions = CounterMetricFamily(NAME, HELP, labels=["job", "outcome"])
        for (job, outcome), count in sorted(totals.items()):
            decisions.add_metric([job, outcome], count)
        yield decisions
        seconds = HistogramMetricFamily(SECONDS, SECONDS_HELP, labels=["store", "call"])
        for (alias, call), counts in sorted(calls.items()):
            seen, buckets = 0.0, list[tuple[str, float]]()
            for bound, in_bucket in zip(BOUNDS, counts[:-1], strict=True):
                seen += in_bucket
                buckets.append((bound, seen))
            seconds.add_metric([alias, call], buckets, counts[-1])
        yield seconds


class MultiProcessSync:
    """Adds the tally's counts since the last sync to this process's prometheus_client
    values (multi-process mode: they are written to ``PROMETHEUS_MULTIPROC_DIR``)."""

    def __init__(self) -> None:
        self.decisions = Counter(NAME, HELP, ["job", "outcome"])
        self.seconds = Histogram(SECONDS, SECONDS_HELP, ["store", "call"],
                                 buckets=LATENCY_BUCKETS)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._decided: dict[tuple[str, str], int] = {}
        self._called: dict[tuple[str, str], list[float]] = {}

    def sync(self) -> None:
        from dedup_jobs.metrics import tally

        with self._lock:
            totals, calls = tally.snapshot()
            if self._pid != os.getpid():  # a forked child: the parent's counts are its own
                self._pid = os.getpid()
                self._decided, self._called = totals, calls
            for name, count in totals.items():
                added = count - self._decided.get(name, 0)
                if added:
                    self.decisions.labels(*name).inc(added)
                    self._decided[name] = count
            for name, counts in calls.items():
                before = self._called.get(name) or [0.0] * len(counts)
                if counts != before:
                    add_to_histogram(self.seconds.labels(*name), counts, before)
                    self._called[name] = counts


def add_to_histogram(child: Any, counts: list[float], before: list[float]) -> None:
    """Add bucket counts (and the sum, last) to one labelled ``Histogram`` child.

    prometheus_client's only public way in is ``observe(seconds)``, one call per observation;
    this adds whole bucket counts to the child's per-bucket values (``_buckets``, ``_sum``,
    which ``observe`` itself increments) instead. Checked against prometheus_client 0.26;
    ``tests/test_metrics_export.py`` fails if those attributes change."""
    buckets, total = child._buckets, child._sum
    for slot, value in enumerate(buckets):
        added = counts[slot] - before[slot]
        if added:
            value.inc(added)
    if counts[-1] != before[-1]:
        total.inc(counts[-1] - before[-1])


def multiprocess() -> bool:
    """prometheus_client's own test (``values.get_value_class``), read the same way."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


_collector: TallyCollector | None = None


def exporter() -> MultiProcessSync | None:
    """Multi-process mode: the syncer (one per process). One process: register the collector
    once; nothing to sync, so None."""
    global _collector
    if multiprocess():
        return MultiProcessSync()
    if _collector is None:
        _collector = TallyCollector()
        REGISTRY.register(_collector)
    return None
