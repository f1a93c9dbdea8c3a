"""The ``prometheus_client`` exporter (``pip install dedup-jobs[prometheus]``): the counter
``dedup_jobs_decisions_total{job, outcome}`` and the histogram
``dedup_jobs_store_call_seconds{store, call}``, registered in prometheus_client's default
registry. Under a prefork Celery worker, set ``PROMETHEUS_MULTIPROC_DIR`` before the worker
starts: every process then writes its counts to files there, and one
``MultiProcessCollector`` reads them all (docs/monitoring.md)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

from dedup_jobs.metrics.tally import LATENCY_BUCKETS

DECISIONS = Counter(
    "dedup_jobs_decisions",
    "Decisions of dedup_jobs, by job (task name) and outcome (SPEC A5).",
    ["job", "outcome"],
)
STORE_SECONDS = Histogram(
    "dedup_jobs_store_call_seconds",
    "Seconds one dedup_jobs store call took, by store alias and call.",
    ["store", "call"],
    buckets=LATENCY_BUCKETS,
)


class PrometheusExporter:
    """Counts into the collectors above; a labelled child is looked up once per label set."""

    def __init__(self) -> None:
        self._decisions: dict[tuple[str, str], Any] = {}
        self._calls: dict[tuple[str, str], Any] = {}

    def decision(self, job: str, outcome: str) -> None:
        child = self._decisions.get((job, outcome))
        if child is None:
            child = self._decisions[(job, outcome)] = DECISIONS.labels(job, outcome)
        child.inc()

    def store_call(self, alias: str, call: str, seconds: float) -> None:
        child = self._calls.get((alias, call))
        if child is None:
            child = self._calls[(alias, call)] = STORE_SECONDS.labels(alias, call)
        child.observe(seconds)


def exporter() -> PrometheusExporter:
    return PrometheusExporter()
