"""What the admin Overview shows, read from the history tables (never from the store, so the
page costs the same at 100,000 held locks as at none): decisions over time as inline SVG
charts whose range follows the activity, per-job totals, the busiest keys and the stores'
health. What each number counts: docs/monitoring.md, "The Overview"."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import F, Sum

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
from dedup_jobs.metrics.tally import LATENCY_BUCKETS, OUTCOMES, quantile

#: outcomes that are a duplicate prevented (nothing published, or a copy not run)
PREVENTED = ("deduplicated", "superseded", "replaced", "skipped")
#: the per-job table's count columns after "Duplicates prevented", in this order
COLUMNS = ("dispatched", "prevented", *PREVENTED, "deferred", "ran", "lock_lost",
           "store_error")
WIDTH, HEIGHT, PAD = 720, 160, 36
#: the recent chart's spans (seconds), the first that holds the last hour's activity is
#: drawn, and the bin of each (10-second buckets up to 10 minutes, then minutes)
RECENT = ((120, FINE), (300, FINE), (600, FINE), (1800, MINUTE), (HOUR, MINUTE))
#: the same for the day chart (bins of 5, 10, 20 and 30 minutes, from minute buckets)
DAILY = ((3 * HOUR, 300), (6 * HOUR, 600), (12 * HOUR, 1200), (DAY, 1800))
#: the time axis' label intervals (seconds), the shortest that gives at most 7 labels
TICKS = (30, 60, 120, 300, 600, 900, 1800, HOUR, 2 * HOUR, 4 * HOUR)


@dataclass(frozen=True, kw_only=True)
class Chart:
    title: str
    per: str  # "10 s", "1 min", ...
    width: int
    height: int
    pad: int
    bottom: int  # y of the time axis
    right: int  # x of the last bin
    peak: int
    lines: list[dict[str, str]]  # outcome, points
    ticks: list[dict[str, Any]]  # x, label


def _ago(seconds: int) -> str:
    if seconds <= 0:
        return "now"
    if seconds < MINUTE or seconds % MINUTE:
        return f"-{seconds} s" if seconds < MINUTE else f"-{seconds // 60} min {seconds % 60} s"
    if seconds < HOUR or seconds % HOUR:
        return f"-{seconds // 60} min"
    return f"-{seconds // HOUR} h"


def _span(now: float, resolution: int, within: int, choices: tuple[tuple[int, int], ...]
          ) -> tuple[int, int]:
    """The first (span, bin) of ``choices`` whose span holds every decision of the last
    ``within`` seconds (the last one when they go back further or there are none)."""
    first = (DecisionCount.objects.filter(resolution=resolution, start__gte=now - within)
             .order_by("start").values_list("start", flat=True).first())
    if first is None:
        return choices[-1]
    age = now - first
    return next(((span, size) for span, size in choices if age < span - size), choices[-1])


def chart(title: str, now: float, resolution: int, span: int, size: int) -> Chart:
    """Decisions of each outcome per ``size`` seconds over the last ``span`` seconds, from
    the history buckets of ``resolution`` seconds."""
    bins = span // size
    end = int(now // size * size) + size  # the end of the current bin
    first = end - span
    rows = (DecisionCount.objects.filter(resolution=resolution, start__gte=first)
            .values("start", "outcome").annotate(total=Sum("count")))
    series: dict[str, list[int]] = defaultdict(lambda: [0] * bins)
    for row in rows:
        slot = (row["start"] - first) // size
        if 0 <= slot < bins:
            series[row["outcome"]][slot] += row["total"]
    peak = max((max(values) for values in series.values()), default=0) or 1
    right = WIDTH - PAD // 2
    bottom = HEIGHT - PAD
    step = (right - PAD) / max(bins - 1, 1)
    lines = []
    for outcome in OUTCOMES:
        if outcome not in series:
            continue
        points = " ".join(
            f"{PAD + n * step:.1f},{bottom - value / peak * (HEIGHT - 2 * PAD):.1f}"
            for n, value in enumerate(series[outcome]))
        lines.append({"outcome": outcome, "points": points})
    # a label every round number of seconds (30 s, 1 min, ... 4 h), at most 7 of them
    every = next((tick // size for tick in TICKS if tick % size == 0 and span // tick <= 6),
                 max(1, bins // 6))
    ticks = [{"x": round(PAD + n * step, 1), "label": _ago((bins - 1 - n) * size)}
             for n in range(bins - 1, -1, -every)]
    per = _ago(size)[1:]
    return Chart(title=title, per=per, width=WIDTH, height=HEIGHT, pad=PAD, bottom=bottom,
                 right=right, peak=peak, lines=lines, ticks=ticks)


def charts(now: float) -> list[Chart]:
    """The recent chart (the last 2, 5, 10, 30 or 60 minutes: the shortest that holds the
    last hour's decisions, in 10-second bins up to 10 minutes) and the day chart (the last
    3, 6, 12 or 24 hours, likewise, in 5- to 30-minute bins)."""
    span, size = _span(now, FINE, HOUR, RECENT)
    day_span, day_size = _span(now, MINUTE, DAY, DAILY)
    return [
        chart(f"Last {_ago(span)[1:]}", now, FINE if size == FINE else MINUTE, span, size),
        chart(f"Last {_ago(day_span)[1:]}", now, MINUTE, day_span, day_size),
    ]


def per_job(now: float) -> list[dict[str, Any]]:
    """Each job's decisions over the last day, duplicates prevented first."""
    rows = (DecisionCount.objects.filter(resolution=MINUTE, start__gte=now - DAY)
            .values("job", "outcome").annotate(total=Sum("count")))
    jobs: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    for row in rows:
        if row["outcome"] in OUTCOMES:
            jobs[row["job"]][row["outcome"]] += row["total"]
    found = []
    for job, counts in jobs.items():
        counts["prevented"] = sum(counts[o] for o in PREVENTED)
        found.append({"job": job, "cells": [(c, counts[c]) for c in COLUMNS], **counts})
    return sorted(found, key=lambda r: (-r["prevented"], r["job"]))


def busiest_keys(now: float, limit: int = 10) -> list[dict[str, Any]]:
    """The keys with the most decisions over the last day: duplicates prevented and
    deferrals, each in its own column, ranked by their sum."""
    rows = (KeyCount.objects.filter(start__gte=now - DAY).values("digest", "job", "key")
            .annotate(prevented=Sum("count"), deferred=Sum("deferred"))
            .annotate(total=F("prevented") + F("deferred"))
            .order_by("-total", "key")[:limit])
    return [dict(row) for row in rows]


def store_health(now: float) -> list[dict[str, Any]]:
    """Per store: calls and latency p50/p99 over the last hour, and its last error."""
    rows = (StoreLatency.objects.filter(start__gte=now - HOUR).values("store", "slot")
            .annotate(total=Sum("count")))
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    for row in rows:
        if 0 <= row["slot"] <= len(LATENCY_BUCKETS):
            counts[row["store"]][row["slot"]] += row["total"]
    errors = {e.store: e for e in StoreError.objects.all()}
    found = []
    for alias in sorted(set(counts) | set(errors)):
        histogram = counts[alias]
        error = errors.get(alias)
        found.append({"store": alias, "calls": sum(histogram),
                      "p50": quantile(histogram, 0.5), "p99": quantile(histogram, 0.99),
                      "error_at": error.at if error else None,
                      "error": error.message if error else ""})
    return found


def overview(now: float) -> dict[str, Any]:
    return {
        "charts": charts(now),
        "jobs": per_job(now),
        "keys": busiest_keys(now),
        "stores": store_health(now),
        "columns": COLUMNS,
    }
