"""Metrics on vs off (SPEC A5, budget "0 extra per decision"): dispatch latency of a
``UniqueJob`` with ``DEDUP_JOBS["METRICS"]`` True (counting into the tally, prometheus_client
and an OpenTelemetry SDK meter provider) and False, interleaved in one run (the order rotates
every round), and the store commands of each mode (Redis INFO commandstats). Prints a table;
not a timed test.

Run (it flushes the benchmark's Redis databases 13-15 of DEDUP_JOBS_TEST_REDIS):
    DEDUP_JOBS_TEST_REDIS=redis://127.0.0.1:6379 uv run python benchmarks/metrics.py [rounds]
"""

from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.app import unique  # noqa: E402  (sets Django up)
from benchmarks.redisutil import clean, commandstats  # noqa: E402
from benchmarks.timing import _batch  # noqa: E402

BATCH = 300
STORE_COMMANDS = ("evalsha", "eval")


def main(rounds: int) -> None:
    from django.conf import settings
    from opentelemetry import metrics as otel
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from dedup_jobs import metrics
    from dedup_jobs.conf import app_settings

    otel.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    clean()
    fresh = itertools.count(1_000_000)
    unique.delay(0)  # warm up: connections, scripts
    samples: dict[tuple[str, str], list[float]] = {}
    commands: dict[str, int] = {"on": 0, "off": 0}
    modes = [("on", True), ("off", False)]
    for number in range(rounds):
        order = modes if number % 2 == 0 else modes[::-1]
        for mode, enabled in order:
            settings.DEDUP_JOBS["METRICS"] = enabled  # in place: the stores stay connected
            app_settings.reload()
            items = [next(fresh) for _ in range(BATCH)]
            before = commandstats()
            first = _batch(lambda i: unique.delay(i), items)
            duplicate = _batch(lambda i: unique.delay(i), items)
            after = commandstats()
            commands[mode] += sum(after[c] - before[c] for c in STORE_COMMANDS)
            samples.setdefault((mode, "first"), []).append(first)
            samples.setdefault((mode, "duplicate"), []).append(duplicate)
        clean()
    counted = metrics.tally.take().decisions
    print(f"\n{rounds} rounds x {BATCH} dispatches per mode and kind, interleaved\n")
    print("| kind | metrics on (µs, median) | metrics off (µs, median) | on / off (ratio of "
          "the medians) | on / off per round: median (min-max) | target <= 1.03 |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for kind in ("first", "duplicate"):
        on_rounds, off_rounds = samples[("on", kind)], samples[("off", kind)]
        on, off = statistics.median(on_rounds), statistics.median(off_rounds)
        paired = [a / b for a, b in zip(on_rounds, off_rounds, strict=True)]
        print(f"| {kind} dispatch | {on:.1f} | {off:.1f} | {on / off:.3f} | "
              f"{statistics.median(paired):.3f} ({min(paired):.2f}-{max(paired):.2f}) | "
              f"{'yes' if on / off <= 1.03 else 'no'} |")
    print(f"\nstore commands (EVALSHA/EVAL): on {commands['on']}, off {commands['off']} "
          f"({2 * BATCH * rounds} dispatches each)")
    print(f"decisions counted with metrics on: {dict(counted)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
