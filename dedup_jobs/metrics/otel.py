"""The OpenTelemetry exporter (``pip install dedup-jobs[otel]``): through the OpenTelemetry
metrics API, the counter ``dedup_jobs.decisions`` (attributes ``job``, ``outcome``) and the
histogram ``dedup_jobs.store.duration`` (seconds; attributes ``store``, ``call``), on the
meter ``dedup_jobs`` of the global meter provider. The application configures the SDK (a
``MeterProvider`` with its readers and exporters); until it does, the API's proxy records
nothing."""

from __future__ import annotations

from opentelemetry.metrics import get_meter

from dedup_jobs.metrics.tally import LATENCY_BUCKETS


class OtelExporter:
    """Counts through instruments of the ``dedup_jobs`` meter; one attribute dict per label
    set, made once."""

    def __init__(self) -> None:
        meter = get_meter("dedup_jobs")
        self._decisions = meter.create_counter(
            "dedup_jobs.decisions", unit="{decision}",
            description="Decisions of dedup_jobs, by job (task name) and outcome (SPEC A5).",
        )
        self._seconds = meter.create_histogram(
            "dedup_jobs.store.duration", unit="s",
            description="Seconds one dedup_jobs store call took, by store alias and call.",
            explicit_bucket_boundaries_advisory=list(LATENCY_BUCKETS),
        )
        self._attributes: dict[tuple[str, str], dict[str, str]] = {}
        self._call_attributes: dict[tuple[str, str], dict[str, str]] = {}

    def decision(self, job: str, outcome: str) -> None:
        attributes = self._attributes.get((job, outcome))
        if attributes is None:
            attributes = self._attributes[(job, outcome)] = {"job": job, "outcome": outcome}
        self._decisions.add(1, attributes)

    def store_call(self, alias: str, call: str, seconds: float) -> None:
        attributes = self._call_attributes.get((alias, call))
        if attributes is None:
            attributes = self._call_attributes[(alias, call)] = {"store": alias, "call": call}
        self._seconds.record(seconds, attributes)


def exporter() -> OtelExporter:
    return OtelExporter()
