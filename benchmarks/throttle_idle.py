"""``python -m benchmarks.throttle_idle``: how long a freed throttle slot stays idle while a
waiter exists (issue 26: a freed slot taken within 0.5 s). Prints a table; asserts nothing.

One ThrottledJob with ``concurrency=1`` on one throttle key (``benchmarks/throttle_jobs.py``),
a real prefork worker (``-c 4``: processes are free to take a waiter at once), ``--messages``
messages dispatched at once whose bodies sleep a deterministic pseudo-random time between
``--low`` and ``--high`` seconds (``--seed``). Each body records its start and end in the
Redis server's time; a gap is the start of run i+1 minus the end of run i, for every run but
the last (a waiter existed after each of them: every message was dispatched before the first
run ended). The slot is freed by the release the worker sends after the body, so a gap is the
slot's idle time plus that release's round trip.

Counted on the Redis server as ``benchmarks/throttle.py`` counts them (MONITOR, in a thread,
``tests/throttle_support.ServerCounts``): the store's EVALSHAs per script (admissions,
releases, renewals), the broker's LPUSHes onto the queue (one per message plus one per
deferral) and the wakes (a PUBLISH of ``dedup_jobs_wake`` on the workers' control channel).

The lease is ``--lease`` seconds (default 60, the default LEASE_SECONDS, as in
``benchmarks/throttle.py``): a waiter's countdown is capped at a third of the lease (the
longest wait of THROTTLE_ADMIT), so a short lease would cut the countdowns and hide the
planning this measures.

Run against a Redis of your own (it flushes databases 13-15 of it):
    DEDUP_JOBS_BENCH_REDIS=redis://127.0.0.1:<port> DEDUP_JOBS_BENCH_QUEUE=<queue> \\
        uv run --group bench python -m benchmarks.throttle_idle [--messages 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/throttle_idle.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks import throttle_jobs as jobs  # sets Django up
from benchmarks.redisutil import clean, client
from benchmarks.settings import BROKER_DB, QUEUE, RESULT_DB, STORE_DB
from benchmarks.workers import wait_for, worker
from tests.throttle_support import ServerCounts

TARGET = 0.5  # seconds: issue 26's longest idle of a freed slot while a waiter exists


@dataclass(frozen=True)
class Run:
    item: int
    start: float  # server seconds
    end: float
    deferrals: int  # admissions of its message that deferred it


@dataclass(kw_only=True)
class Idle:
    messages: int
    lease: float
    began: float  # server seconds, just before the first dispatch
    runs: list[Run] = field(default_factory=list)
    scripts: Counter[str] = field(default_factory=Counter)
    other_store: int = 0
    published: int = 0  # LPUSH onto the queue + wakes
    wakes: int = 0  # PUBLISH of dedup_jobs_wake on the workers' control channel

    @property
    def gaps(self) -> list[float]:
        """Start of run i+1 - end of run i, for every run but the last (a waiter existed)."""
        return [b.start - a.end for a, b in zip(self.runs, self.runs[1:], strict=False)]

    @property
    def store_calls(self) -> int:
        return sum(self.scripts.values()) + self.other_store

    @property
    def drain(self) -> float:
        return self.runs[-1].end - self.began if self.runs else float("nan")


def durations(messages: int, low: float, high: float, seed: int) -> list[float]:
    pick = random.Random(seed)
    return [round(pick.uniform(low, high), 2) for _ in range(messages)]


def measure(
    *,
    messages: int = 8,
    low: float = 1.0,
    high: float = 3.0,
    seed: int = 26,
    lease: float = 60.0,
    processes: int = 4,
    say: Callable[[str], None] = print,
) -> Idle:
    """Dispatch ``messages`` at once to a ``-c processes`` worker, wait for every run."""
    sleeps = durations(messages, low, high, seed)
    clean()
    counts = ServerCounts(store_db=STORE_DB, broker_db=BROKER_DB, queue=QUEUE)
    found = Idle(messages=messages, lease=lease, began=0.0)
    ids: dict[int, str] = {}
    with worker(concurrency=processes, lease=lease, include="benchmarks.throttle_jobs"):
        jobs.one_at_once.delay(-1, seconds=0.0)  # warm-up: connections, scripts, pool
        wait_for(lambda: client(RESULT_DB).llen(jobs.RUNS) >= 1, 60, what="the warm-up run")
        time.sleep(0.5)  # its release
        clean()  # a fresh throttle key: no run measured yet, no waiter
        say(f"  throttle idle: {messages} messages of {low:g}-{high:g} s, concurrency=1, "
            f"prefork -c {processes}, LEASE_SECONDS={lease:g}")

        def run() -> None:
            found.began = jobs.server_now()
            for item, seconds in enumerate(sleeps):
                ids[item] = jobs.one_at_once.delay(item, seconds=seconds).id
            wait_for(
                lambda: client(RESULT_DB).llen(jobs.RUNS) >= messages,
                sum(sleeps) + 30.0 * messages + 60.0,
                interval=0.1,
                what="every run",
            )
            time.sleep(0.5)  # the last run's release, counted too

        counts.run(run)
    admitted = Counter(
        next((i for i, task_id in ids.items() if task_id in command), -1)
        for _at, command in counts.admissions
    )
    runs = [json.loads(raw) for raw in client(RESULT_DB).lrange(jobs.RUNS, 0, -1)]
    found.runs = sorted(
        (Run(r["item"], r["start"], r["end"], admitted[r["item"]] - 1) for r in runs),
        key=lambda r: r.start,
    )
    found.scripts = Counter(counts.scripts)
    found.other_store = sum(counts.other_store.values())
    found.published = counts.published + counts.wakes
    found.wakes = counts.wakes
    clean()
    return found


def summary(found: Idle) -> str:
    """The one-line figure: median and max idle seconds of a freed slot."""
    gaps = found.gaps
    if not gaps:
        return "no gap (fewer than 2 runs)"
    return (f"median {statistics.median(gaps):.2f} s, max {max(gaps):.2f} s over "
            f"{len(gaps)} gaps")


def lines(found: Idle) -> list[str]:
    n, t0 = found.messages, found.began
    out = [
        "| gap | run ends (s) | next run starts (s) | slot idle s | next run's length s | "
        "its deferrals |",
        "|---|---|---|---|---|---|",
    ]
    for i, (a, b) in enumerate(zip(found.runs, found.runs[1:], strict=False), start=1):
        out.append(f"| {i} | {a.end - t0:.2f} | {b.start - t0:.2f} | {b.start - a.end:.2f} | "
                   f"{b.end - b.start:.2f} | {b.deferrals} |")
    busy = sum(r.end - r.start for r in found.runs)
    overlaps = sum(1 for g in found.gaps if g < 0)
    admissions = found.scripts["THROTTLE_ADMIT"]
    out += [
        "",
        f"- freed slot idle while a waiter exists: {summary(found)} (target <= {TARGET:g} s)",
        f"- drain: {found.drain:.2f} s from the first dispatch to the last run's end, "
        f"{busy:.2f} s of it running ({busy / found.drain:.0%} busy)"
        + (f"; {overlaps} runs overlapped (concurrency=1 broken)" if overlaps else ""),
        f"- store calls: {admissions} admissions + {found.scripts['THROTTLE_RELEASE']} "
        f"releases + {found.scripts['THROTTLE_RENEW']} renewals + {found.other_store} other "
        f"= {found.store_calls} / {n} messages = {found.store_calls / n:.2f} per message",
        f"- broker messages: {found.published - found.wakes} LPUSH + {found.wakes} wakes = "
        f"{found.published} / {n} messages = "
        f"{found.published / n:.2f} per message ({admissions - n} deferrals)",
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throttle_idle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=8, help="default 8")
    parser.add_argument("--low", type=float, default=1.0, help="shortest body, s (default 1)")
    parser.add_argument("--high", type=float, default=3.0, help="longest body, s (default 3)")
    parser.add_argument("--seed", type=int, default=26, help="of the bodies' lengths")
    parser.add_argument("--lease", type=float, default=60.0, help="LEASE_SECONDS (default 60)")
    parser.add_argument("--processes", type=int, default=4, help="worker -c (default 4)")
    args = parser.parse_args(argv)
    found = measure(messages=args.messages, low=args.low, high=args.high, seed=args.seed,
                    lease=args.lease, processes=args.processes)
    print("\n".join(["", *lines(found)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
