"""Dispatch latency: first dispatch (a fresh key each call) and duplicate dispatch (a held
key), for every contender, interleaved, next to a raw ``SET NX PX`` on the store's own
connection (the floor of any one-round-trip lock decision)."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

from django_redis import get_redis_connection

from benchmarks.contenders import Contender
from benchmarks.redisutil import broker, clean
from benchmarks.settings import QUEUE

FLOOR = "raw SET NX PX"
#: the least any lock-then-publish can cost: one SET NX round trip, then plain Celery's publish
LOCK_FLOOR = "SET NX PX + plain Celery"


@dataclass(kw_only=True)
class Samples:
    """µs per call, one value per batch."""

    first: list[float] = field(default_factory=list)
    duplicate: list[float] = field(default_factory=list)

    @staticmethod
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")


def _batch(call: Callable[[int], object], items: list[int]) -> float:
    gc_was = gc.isenabled()
    gc.disable()
    try:
        started = time.perf_counter()
        for item in items:
            call(item)
        elapsed = time.perf_counter() - started
    finally:
        if gc_was:
            gc.enable()
    return elapsed / len(items) * 1e6


def time_dispatch(
    contenders: list[Contender], *, rounds: int, batch: int, progress: Callable[[str], None] = print
) -> dict[str, Samples]:
    """``rounds`` rounds; in each, every contender (and the floor) runs one batch of first
    dispatches and one of duplicates, in an order that rotates from round to round."""
    samples = {c.name: Samples() for c in contenders}
    samples[FLOOR] = Samples()
    floor_client = get_redis_connection("default")
    fresh = count(1_000_000)

    def floor_set(item: int) -> object:
        return floor_client.set(f"bench:floor:{item}", "owner-token", nx=True, px=60_000)

    entries: list[tuple[str, Callable[[int], object]]] = [
        (c.name, c.dispatch) for c in contenders
    ] + [(FLOOR, floor_set)]
    plain = next((c for c in contenders if c.family == "plain"), None)
    if plain is not None:

        def lock_then_publish(item: int) -> object:
            floor_set(item)
            return plain.dispatch(item)

        samples[LOCK_FLOOR] = Samples()
        entries.append((LOCK_FLOOR, lock_then_publish))
    for _name, call in entries:  # warm up connections, scripts and caches
        call(next(fresh))
    for round_no in range(rounds):
        clean()
        shift = round_no % len(entries)
        for name, call in entries[shift:] + entries[:shift]:
            samples[name].first.append(_batch(call, [next(fresh) for _ in range(batch)]))
            if name == LOCK_FLOOR:
                continue  # its duplicate is the floor itself
            held = next(fresh)
            call(held)
            samples[name].duplicate.append(_batch(call, [held] * batch))
            broker().delete(QUEUE)
        if (round_no + 1) % max(1, rounds // 4) == 0:
            progress(f"  timing: round {round_no + 1}/{rounds}")
    clean()
    return samples


@dataclass(frozen=True)
class Ratio:
    """The ratio of two medians (what a table prints beside them, so a reader can check it),
    and the spread of the same ratio round by round (both measured in the same round)."""

    value: float
    low: float
    high: float

    def __format__(self, spec: str) -> str:
        if math.isnan(self.value):
            return "—"
        return f"{self.value:.2f}x ({self.low:.2f} to {self.high:.2f})"


def ratio(numerator: list[float], denominator: list[float]) -> Ratio:
    """median(numerator) / median(denominator), with the min-max of the per-round ratios."""
    if not numerator or not denominator:
        return Ratio(float("nan"), float("nan"), float("nan"))
    rounds = [a / b for a, b in zip(numerator, denominator, strict=False) if b]
    return Ratio(statistics.median(numerator) / statistics.median(denominator),
                 min(rounds, default=float("nan")), max(rounds, default=float("nan")))
