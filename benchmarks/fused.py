"""The fused dispatch (issue 26, docs/semantics.md#fused): a UniqueJob dispatch on one Redis
that is both broker and store, two round trips (kombu's own Redis transport) against one
(``broker_transport = "dedup_jobs.transport:Transport"``), beside plain Celery's publish on
each transport. Prints a table (not a timed test).

ROUNDS rounds; in each, BATCH dispatches of every contender, one of each in turn (first
dispatches: a fresh key each call; duplicates: one held key), each call timed alone, the
turn's order rotating from round to round, the queue and the locks emptied after each round;
µs per dispatch is the median over rounds of each round's median. Redis round trips
are the server's ``total_reads_processed`` per dispatch over one batch; commands are what
MONITOR shows per dispatch (commands a script runs are not counted: MONITOR marks them
"lua"). Every ratio is of figures printed beside it. The fused duplicates are a job of their
own: a job whose recent dispatches are mostly duplicates takes two round trips
(``jobs/fused.py`` ``MOSTLY_DUPLICATES``), which the table shows.

Run:
    DEDUP_JOBS_TEST_REDIS=redis://127.0.0.1:6379 uv run --group bench python -m benchmarks.fused
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django

django.setup()

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from django.conf import settings  # noqa: E402

from benchmarks import app as bench  # noqa: E402
from benchmarks.app import UNIQUE_FOR  # noqa: E402
from benchmarks.redisutil import client  # noqa: E402
from benchmarks.settings import BROKER_DB, QUEUE, STORE_DB  # noqa: E402
from dedup_jobs.jobs.unique import UniqueJob  # noqa: E402

fused_app = Celery("bench_fused", fixups=[], set_as_current=False)
fused_app.config_from_object("django.conf:settings", namespace="CELERY")
fused_app.conf.update(task_default_queue=QUEUE, task_ignore_result=True,
                      broker_transport="dedup_jobs.transport:Transport")


@fused_app.task(name="bench_fused.plain")
def plain_fused(item: int, seconds: float = 0.0) -> int:
    return item


@fused_app.task(name="bench_fused.unique", base=UniqueJob, unique_for=UNIQUE_FOR,
                unique_on=("item",))
def unique_fused(item: int, seconds: float = 0.0) -> int:
    return item


@fused_app.task(name="bench_fused.unique_dup", base=UniqueJob, unique_for=UNIQUE_FOR,
                unique_on=("item",))
def unique_fused_dup(item: int, seconds: float = 0.0) -> int:
    """The duplicates' job: a job of its own, as a job that is mostly dispatched while held
    is (its dispatches then take two round trips: jobs/fused.py MOSTLY_DUPLICATES)."""
    return item


fresh = count(10_000_000)
HELD = 1  # the duplicates' key

PLAIN, PLAIN_F = "plain Celery publish", "plain Celery publish, dedup_jobs transport"
TWO, FUSED = "UniqueJob first dispatch, two round trips", "UniqueJob first dispatch, fused"
TWO_DUP, FUSED_DUP = "UniqueJob duplicate, two round trips", "UniqueJob duplicate, fused"
CONTENDERS: dict[str, Callable[[], Any]] = {
    PLAIN: lambda: bench.plain.delay(next(fresh)),
    PLAIN_F: lambda: plain_fused.delay(next(fresh)),
    TWO: lambda: bench.unique.delay(next(fresh)),
    FUSED: lambda: unique_fused.delay(next(fresh)),
    TWO_DUP: lambda: bench.unique.delay(HELD),
    FUSED_DUP: lambda: unique_fused_dup.delay(HELD),
}


def _reads() -> int:
    return int(client(STORE_DB).info("stats")["total_reads_processed"])


def _empty() -> None:
    client(BROKER_DB).flushdb()
    client(STORE_DB).flushdb()


def _hold() -> None:
    """The duplicates' key held (by a dispatch of each job kind's own path)."""
    bench.unique.delay(HELD)
    unique_fused_dup.delay(HELD)


def _batch(call: Callable[[], Any], n: int) -> tuple[float, float]:
    gc.disable()
    try:
        before, started = _reads(), time.perf_counter()
        for _ in range(n):
            call()
        elapsed = time.perf_counter() - started
        reads = _reads() - before - 1  # less the INFO that reads the count
    finally:
        gc.enable()
    return elapsed / n * 1e6, reads / n


def _monitored(call: Callable[[], Any], n: int = 20) -> float:
    """Commands per dispatch as MONITOR sees them (not those a script runs)."""
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    watcher = redis.Redis.from_url(f"{settings.REDIS_URL}/0")  # its GET below: a new
    # connection (HELLO), not counted

    def watch() -> None:
        with watcher.monitor() as m:
            ready.set()
            for command in m.listen():
                if "BENCH-STOP" in command["command"]:
                    return
                seen.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.2)
    for _ in range(n):
        call()
    watcher.get("BENCH-STOP")
    thread.join(5)
    mine = [c for c in seen if c.get("client_type") != "lua"
            and not c["command"].startswith(("INFO", "CLIENT", "FLUSHDB", "HELLO"))]
    return len(mine) / n


def _interleaved(n: int, names: list[str], offset: int) -> dict[str, list[float]]:
    """``n`` calls of every contender, one of each in turn (the order rotating by
    ``offset``): each call timed alone, so a drift of the machine's speed hits all alike."""
    order = names[offset % len(names):] + names[:offset % len(names)]
    timed: dict[str, list[float]] = {name: [] for name in names}
    gc.disable()
    try:
        for _ in range(n):
            for name in order:
                started = time.perf_counter()
                CONTENDERS[name]()
                timed[name].append((time.perf_counter() - started) * 1e6)
    finally:
        gc.enable()
    return timed


@dataclass(kw_only=True)
class Fused:
    """Per contender: µs per dispatch (median over rounds of each round's median), round
    trips and MONITOR commands per dispatch."""

    batch: int
    rounds: int
    micros: dict[str, float]
    trips: dict[str, float]
    commands: dict[str, float]


def measure(*, batch: int = 500, rounds: int = 7) -> Fused:
    _empty()
    for call in CONTENDERS.values():  # scripts loaded, servers compared, connections made
        call()
    _empty()
    micros: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    trips: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    names = list(CONTENDERS)
    for r in range(rounds):
        _hold()
        for name, values in _interleaved(batch, names, r).items():
            micros[name].append(statistics.median(values))
        _empty()
    for name in names:  # round trips: one contender at a time, counted on the server
        _hold()
        trips[name].append(_batch(CONTENDERS[name], 100)[1])
        _empty()
    _hold()
    commands = {name: _monitored(CONTENDERS[name]) for name in names}
    _empty()
    return Fused(batch=batch, rounds=rounds,
                 micros={name: statistics.median(micros[name]) for name in names},
                 trips={name: statistics.median(trips[name]) for name in names},
                 commands=commands)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    found = measure(batch=args.batch, rounds=args.rounds)
    mid, names = found.micros, list(CONTENDERS)
    print(f"{args.batch} dispatches per round, median of {args.rounds} rounds; one Redis "
          f"(broker db {BROKER_DB}, store db {STORE_DB}); round trips: the server's "
          f"total_reads_processed per dispatch; commands: MONITOR, per dispatch")
    print()
    print("| contender | µs per dispatch | x plain Celery publish | round trips | commands |")
    print("|---|---|---|---|---|")
    for name in names:
        print(f"| {name} | {mid[name]:.1f} | {mid[name] / mid[PLAIN]:.2f}x | "
              f"{found.trips[name]:.2f} | {found.commands[name]:.2f} |")
    print()
    print(f"fused first dispatch / plain Celery publish: {mid[FUSED]:.1f} / {mid[PLAIN]:.1f} "
          f"= {mid[FUSED] / mid[PLAIN]:.3f} (target <= 1.05)")
    print(f"two-round-trip first dispatch / plain Celery publish: {mid[TWO]:.1f} / "
          f"{mid[PLAIN]:.1f} = {mid[TWO] / mid[PLAIN]:.3f}")
    print(f"fused / two-round-trip first dispatch: {mid[FUSED]:.1f} / {mid[TWO]:.1f} = "
          f"{mid[FUSED] / mid[TWO]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
