"""The OpenTelemetry exporter (``pip install dedup-jobs[otel]``), through the OpenTelemetry
metrics API, on the meter ``dedup_jobs`` of the global meter provider:

- ``dedup_jobs.decisions`` (counter; attributes ``job``, ``outcome``);
- ``dedup_jobs.store.calls`` (counter; attributes ``store``, ``call``, ``le``: the calls that
  took at most ``le`` seconds, cumulative like Prometheus' ``_bucket`` series, ``le="+Inf"``
  counting them all) and ``dedup_jobs.store.duration`` (counter, seconds: their sum).

They are *observable* instruments: the SDK reads the process's running totals (kept by the
tally anyway) when it collects, so a decision pays nothing for OpenTelemetry (a synchronous
``add`` costs several µs in the SDK). The application configures the SDK (a ``MeterProvider``
with its readers and exporters); until it does, nothing is observed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation, get_meter

from dedup_jobs.metrics.tally import LATENCY_BUCKETS

BOUNDS = [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]


def _decisions(options: CallbackOptions) -> Iterable[Observation]:
    from dedup_jobs.metrics import tally

    for (job, outcome), count in tally.snapshot()[0].items():
        yield Observation(count, {"job": job, "outcome": outcome})


def _calls(options: CallbackOptions) -> Iterable[Observation]:
    from dedup_jobs.metrics import tally

    for (alias, call), counts in tally.snapshot()[1].items():
        seen = 0.0
        for bound, count in zip(BOUNDS, counts[:-1], strict=True):
            seen += count
            yield Observation(int(seen), {"store": alias, "call": call, "le": bound})


def _seconds(options: CallbackOptions) -> Iterable[Observation]:
    from dedup_jobs.metrics import tally

    for (alias, call), counts in tally.snapshot()[1].items():
        yield Observation(counts[-1], {"store": alias, "call": call})


#: the registered instruments (kept referenced)
instruments: list[Any] = []


def exporter() -> None:
    """Register the observable instruments once; nothing to do per decision or store call,
    so no exporter object is returned."""
    if instruments:
        return
    meter = get_meter("dedup_jobs")
    instruments.extend([
        meter.create_observable_counter(
            "dedup_jobs.decisions", [_decisions], unit="{decision}",
            description="Decisions of dedup_jobs, by job (task name) and outcome (A5)."),
        meter.create_observable_counter(
            "dedup_jobs.store.calls", [_calls], unit="{call}",
            description="dedup_jobs store calls that took at most le seconds."),
        meter.create_observable_counter(
            "dedup_jobs.store.duration", [_seconds], unit="s",
            description="Seconds spent in dedup_jobs store calls, in all."),
    ])
