"""What the admin Overview shows, read from the history tables (never from the store, so the
page costs the same at 100,000 held locks as at none): decisions per minute as inline SVG
charts, per-job totals, the busiest keys and the stores' health."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Sum

from dedup_jobs.metrics.models import (
    DAY,
    HOUR,
    MINUTE,
    DecisionCount,
    KeyCount,
    StoreError,
    StoreLatency,
)
from dedup_jobs.metrics.tally import LATENCY_BUCKETS, OUTCOMES, quantile

#: outcomes that are a duplicate prevented (nothing published, or a copy not run)
PREVENTED = ("deduplicated", "skipped", "superseded", "replaced")
WIDTH, HEIGHT, PAD = 720, 160, 36


@dataclass(frozen=True, kw_only=True)
class Chart:
    title: str
    width: int
    height: int
    pad: int
    peak: int
    lines: list[dict[str, str]]  # outcome, points
    ticks: list[dict[str, Any]]  # x, label


def chart(title: str, now: float, span: int) -> Chart:
    """Decisions per minute of each outcome over the last ``span`` seconds."""
    first = int(now // MINUTE * MINUTE) - span + MINUTE
    rows = (DecisionCount.objects.filter(resolution=MINUTE, start__gte=first)
            .values("start", "outcome").annotate(total=Sum("count")))
    minutes = span // MINUTE
    series: dict[str, list[int]] = defaultdict(lambda: [0] * minutes)
    for row in rows:
        slot = (row["start"] - first) // MINUTE
        if 0 <= slot < minutes:
            series[row["outcome"]][slot] += row["total"]
    peak = max((max(values) for values in series.values()), default=0) or 1
    step = (WIDTH - 2 * PAD) / max(minutes - 1, 1)
    lines = []
    for outcome in OUTCOMES:
        if outcome not in series:
            continue
        points = " ".join(
            f"{PAD + n * step:.1f},{HEIGHT - PAD - value / peak * (HEIGHT - 2 * PAD):.1f}"
            for n, value in enumerate(series[outcome]))
        lines.append({"outcome": outcome, "points": points})
    every = 15 if span <= HOUR else 240
    ticks = [{"x": round(PAD + n * step, 1), "label": f"-{(minutes - 1 - n)} min"
              if span <= HOUR else f"-{(minutes - 1 - n) // 60} h"}
             for n in range(minutes - 1, -1, -every)]
    return Chart(title=title, width=WIDTH, height=HEIGHT, pad=PAD, peak=peak, lines=lines,
                 ticks=ticks)


def per_job(now: float) -> list[dict[str, Any]]:
    """Each job's decisions over the last day, duplicates prevented first."""
    rows = (DecisionCount.objects.filter(resolution=MINUTE, start__gte=now - DAY)
            .values("job", "outcome").annotate(total=Sum("count")))
    jobs: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    for row in rows:
        if row["outcome"] in OUTCOMES:
            jobs[row["job"]][row["outcome"]] += row["total"]
    found = [{"job": job, "prevented": sum(counts[o] for o in PREVENTED),
              "cells": list(counts.items()), **counts} for job, counts in jobs.items()]
    return sorted(found, key=lambda r: (-r["prevented"], r["job"]))


def busiest_keys(now: float, limit: int = 10) -> list[dict[str, Any]]:
    """The keys with the most duplicates prevented over the last day."""
    rows = (KeyCount.objects.filter(start__gte=now - DAY).values("digest", "job", "key")
            .annotate(total=Sum("count")).order_by("-total", "key")[:limit])
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
        "charts": [chart("Last hour", now, HOUR), chart("Last day", now, DAY)],
        "jobs": per_job(now),
        "keys": busiest_keys(now),
        "stores": store_health(now),
        "outcomes": OUTCOMES,
    }
