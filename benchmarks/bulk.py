"""Bulk dispatch (L3, issue 26): 10,000 dispatches of distinct keys, one ``delay`` at a time
against ``dispatch_many`` in batches, on one Redis that is both broker and store (the
benchmark's settings), beside plain Celery; on kombu's own Redis transport (a lock round trip
per batch, then the winners' messages in one pipelined publish) and on dedup_jobs' transport
(``benchmarks.fused``'s app: ``delay`` is one round trip each, a batch one in all, its
messages built from the first Celery builds, ``jobs/fused_many.py``). Prints a table (not a
timed test).

Every contender runs ROUNDS rounds, taking turns in an order that rotates from round to
round; the queue is emptied after each. The ratios are of the medians printed beside them.
Redis reads are counted on the server (``total_reads_processed``), per 10,000 calls (a round
trip is one read, but the server reads a write of more than 16 KB, a batch's, in pieces);
the CPU column is the dispatching process's own CPU time per dispatch (``process_time``):
what is left when no round trip is waited for.

Run:
    DEDUP_JOBS_TEST_REDIS=redis://127.0.0.1:6379 uv run --group bench python -m benchmarks.bulk
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django

django.setup()

from benchmarks import app as bench  # noqa: E402
from benchmarks.redisutil import client  # noqa: E402
from benchmarks.settings import BROKER_DB, STORE_DB  # noqa: E402

fresh = count(10_000_000)


def _plain(n: int, batch: int) -> None:
    for _ in range(n):
        bench.plain.delay(next(fresh))


def _one_by_one(n: int, batch: int) -> None:
    for _ in range(n):
        bench.unique.delay(next(fresh))


def _many(n: int, batch: int) -> None:
    for _ in range(0, n, batch):
        bench.unique.dispatch_many([((next(fresh),), {}) for _ in range(batch)])


def _fused_one_by_one(n: int, batch: int) -> None:
    from benchmarks.fused import unique_fused

    for _ in range(n):
        unique_fused.delay(next(fresh))


def _fused_many(n: int, batch: int) -> None:
    from benchmarks.fused import unique_fused

    for _ in range(0, n, batch):
        unique_fused.dispatch_many([((next(fresh),), {}) for _ in range(batch)])


#: the contenders on dedup_jobs' transport
FUSED_DELAY, FUSED_MANY = "UniqueJob, delay, fused", "UniqueJob, dispatch_many, fused"
CONTENDERS: dict[str, Callable[[int, int], None]] = {
    "plain Celery, delay": _plain,
    "UniqueJob, delay": _one_by_one,
    "UniqueJob, dispatch_many": _many,
    FUSED_DELAY: _fused_one_by_one,
    FUSED_MANY: _fused_many,
}


def _reads() -> int:
    return int(client(STORE_DB).info("stats")["total_reads_processed"])


@dataclass(kw_only=True)
class Bulk:
    """Per contender, one value per round: seconds, CPU seconds, Redis reads."""

    calls: int
    batch: int
    rounds: int
    seconds: dict[str, list[float]]
    cpu: dict[str, list[float]]
    reads: dict[str, list[int]]


def measure(*, calls: int = 10_000, batch: int = 500, rounds: int = 5) -> Bulk:
    client(STORE_DB).flushdb()
    client(BROKER_DB).flushdb()
    found = Bulk(calls=calls, batch=batch, rounds=rounds,
                 seconds={name: [] for name in CONTENDERS},
                 cpu={name: [] for name in CONTENDERS}, reads={name: [] for name in CONTENDERS})
    names = list(CONTENDERS)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before, started, used = _reads(), time.perf_counter(), time.process_time()
            CONTENDERS[name](calls, batch)
            found.seconds[name].append(time.perf_counter() - started)
            found.cpu[name].append(time.process_time() - used)
            found.reads[name].append(_reads() - before - 1)  # less the INFO that reads it
            client(BROKER_DB).flushdb()
            client(STORE_DB).flushdb()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    found = measure(calls=args.calls, batch=args.batch, rounds=args.rounds)
    seconds, cpu, reads, names = found.seconds, found.cpu, found.reads, list(CONTENDERS)
    base = statistics.median(seconds["plain Celery, delay"])
    one = statistics.median(seconds["UniqueJob, delay"])
    print(f"{args.calls:,} dispatches of distinct keys, batches of {args.batch}, "
          f"median of {args.rounds} rounds; Redis reads on the server per run (one a round "
          f"trip, but the server reads a write of more than 16 KB in pieces); "
          f"CPU: this process's CPU time per dispatch")
    print()
    fused_one = statistics.median(seconds[FUSED_DELAY])
    print("| contender | seconds | dispatches/s | x plain Celery's rate | "
          "x UniqueJob delay's rate (same transport) | Redis reads | CPU µs per dispatch |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        mid = statistics.median(seconds[name])
        same = fused_one if "fused" in name else one
        print(f"| {name} | {mid:.3f} | {args.calls / mid:,.0f} | {base / mid:.2f}x | "
              f"{same / mid:.2f}x | {statistics.median(reads[name]):,.0f} | "
              f"{statistics.median(cpu[name]) / args.calls * 1e6:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
