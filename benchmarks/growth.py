"""``python -m benchmarks.growth``: does a decision get slower as the store holds more locks?

Three stores (django-redis caches on databases 1, 2 and 3 of the benchmark's Redis: the
server's dict of a database is what grows) are filled with 1,000, 100,000 and 1,000,000 held
locks of ``bench.unique``, each made as ACQUIRE makes one (the same hash fields, PEXPIRE, and
its entry in the ``unique`` index zset, scored by its expiry; the benchmark checks a filled
lock against a real one before it measures), by a Lua script taking a batch of locks per
call. At each size, ``--samples`` times over (in ``--rounds`` rounds, the sizes' order
rotating): a first acquire of a fresh key, a duplicate acquire of a random held key, the
worker's start of the fresh lock and its release (the store API, one round trip each: the
decisions of a UniqueJob's dispatch, duplicate, worker start and finish), each timed alone.
``used_memory`` (INFO memory) before and after each fill gives the bytes per held lock.

Last, the **stale index** case: locks that expired by themselves (never-run jobs, killed
workers) leave their index entries behind until an index trim removes them; the release that
meets ``--stale`` of them is timed alone.

Run against a Redis of your own (it flushes databases 1-3 of it, and fills them; ~0.5 GB):
    DEDUP_JOBS_BENCH_REDIS=redis://127.0.0.1:<port> DEDUP_JOBS_BENCH_QUEUE=<queue> \\
        uv run python -m benchmarks.growth [--sizes 1000,100000,1000000] [--samples 2000]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/growth.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks import app as bench  # noqa: F401  (Django set up, the job registered)
from benchmarks.redisutil import client
from benchmarks.settings import REDIS_URL
from benchmarks.stale_index import STALE  # index entries of keys long gone
from dedup_jobs import clock
from dedup_jobs.jobs.base import new_task_id
from dedup_jobs.keys import JobKey
from dedup_jobs.stores import get_store
from dedup_jobs.stores.redis.store import RedisStore

HOLD_MS = 3_600_000  # the filled locks outlive the run
BATCH = 1000  # locks per fill call

# FILL — KEYS[1] the index, KEYS[2..] lock keys; ARGV[1] ttl ms, ARGV[2] task name,
# ARGV[2 + 2i - 1], ARGV[2 + 2i] owner and readable id of KEYS[1 + i]. As ACQUIRE writes a
# free lock (scripts.py), with the server's TIME.
FILL = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = now + tonumber(ARGV[1])
for i = 2, #KEYS do
  redis.call('HSET', KEYS[i], 'owner', ARGV[2 * i - 1], 'state', 'queued', 'acquired', now,
             'expires', expires, 'task', ARGV[2], 'id', ARGV[2 * i])
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
  redis.call('ZADD', KEYS[1], expires, KEYS[i])
end
return #KEYS - 1
"""

DECISIONS = ("first dispatch", "duplicate", "worker start", "release")


def key_of(n: int) -> JobKey:
    """The key of ``bench.unique`` for item ``n`` (as ``job_key`` builds it, without the
    signature binding, which would dominate a million-lock fill)."""
    return JobKey(
        key=f"dedup_jobs:unique:bench.unique:item={n}", task_name="bench.unique", ident=f"item={n}"
    )


def used_memory() -> int:
    return int(client(0).info("memory")["used_memory"])


def fill(store: RedisStore, first: int, count: int, say: Callable[[str], None]) -> None:
    redis = store.client
    script = redis.register_script(FILL)
    index = store.index_key()
    started = time.monotonic()
    for low in range(first, first + count, BATCH):
        high = min(low + BATCH, first + count)
        keys = [index] + [store.physical(key_of(n).key) for n in range(low, high)]
        args: list[object] = [HOLD_MS, "bench.unique"]
        for n in range(low, high):
            args += [new_task_id(), f"item={n}"]
        script(keys=keys, args=args)
    say(f"  filled {count:,} locks in {time.monotonic() - started:.1f} s")


def check_fill(store: RedisStore) -> None:
    """A filled lock is what ACQUIRE leaves: same fields, encodings and index entry."""
    redis = store.client
    real = key_of(-1)
    store.acquire(real, new_task_id(), HOLD_MS / 1000, now=clock.now())
    real_key, filled_key = store.physical(real.key), store.physical(key_of(0).key)
    a, b = redis.hgetall(real_key), redis.hgetall(filled_key)
    assert sorted(a) == sorted(b), (a, b)
    assert redis.object("encoding", real_key) == redis.object("encoding", filled_key)
    assert redis.zscore(store.index_key(), filled_key) is not None
    store.release(real, a[b"owner"].decode())


def measure(store: RedisStore, held: int, samples: int, fresh: list[int]) -> dict[str, list[float]]:
    """µs of each decision, ``samples`` of each, interleaved."""
    got: dict[str, list[float]] = {name: [] for name in DECISIONS}
    perf = time.perf_counter
    s = store
    for _ in range(samples):
        fresh[0] += 1
        key, owner = key_of(fresh[0]), new_task_id()
        dup = key_of(random.randrange(held))
        t0 = perf()
        s.acquire(key, owner, 60.0, now=clock.now())
        t1 = perf()
        s.acquire(dup, new_task_id(), 60.0, now=clock.now())
        t2 = perf()
        s.start(key, owner, 3.0, now=clock.now(), release=False)
        t3 = perf()
        s.release(key, owner)
        t4 = perf()
        for name, value in zip(DECISIONS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            got[name].append(value * 1e6)
    return got


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def stale_release(store: RedisStore, stale: int, say: Callable[[str], None]) -> float:
    """µs of the release that meets ``stale`` index entries of expired locks."""
    redis = store.client
    script = redis.register_script(STALE)
    index = store.index_key()
    prefix = store.physical("dedup_jobs:unique:bench.unique:gone=")
    for low in range(0, stale, 10_000):
        script(keys=[index], args=[prefix, low, min(10_000, stale - low), 60_000])
    key, owner = key_of(-2), new_task_id()
    store.acquire(key, owner, 60.0, now=clock.now())
    t0 = time.perf_counter()
    store.release(key, owner)
    elapsed = (time.perf_counter() - t0) * 1e6
    left = redis.zcount(index, "-inf", int(time.time() * 1000) - 1)
    say(f"  stale: {stale:,} expired entries; the release took {elapsed:,.0f} µs, {left:,} left")
    return elapsed


#: "flat": each decision's median at the largest size at most this many times its median at the
#: smallest (the run-to-run spread of one size on the shared 2-core machine is about 1.1x)
FLAT = 1.25

#: one database per size (the server's dict of a database is what grows), 1, 2, 3, ...
FIRST_DB = 1


def stores_for(sizes: list[int]) -> list[RedisStore]:
    """One store per size, each on a database of its own of the benchmark's Redis."""
    from django.conf import settings

    caches = {**settings.CACHES}
    for n, size in enumerate(sizes):
        caches[f"growth{size}"] = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{REDIS_URL}/{FIRST_DB + n}",
        }
    settings.CACHES = caches  # before any store of them is made (caches are lazy)
    found = [get_store(f"growth{size}") for size in sizes]
    assert all(isinstance(store, RedisStore) for store in found)
    return found  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.growth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--samples", type=int, default=2000, help="per decision and size")
    parser.add_argument("--rounds", type=int, default=10, help="the samples come in rounds")
    parser.add_argument("--stale", type=int, default=100_000, help="0: skip that case")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    def say(text: str) -> None:
        print(text, flush=True)

    stores = stores_for(sizes)
    for n in range(len(sizes)):
        client(FIRST_DB + n).flushdb()
    say(
        f"growth: sizes {sizes}, {args.samples} samples per decision and size in "
        f"{args.rounds} interleaved rounds, load {os.getloadavg()[0]:.2f}"
    )
    per_lock: list[float] = []
    for store, size in zip(stores, sizes, strict=True):
        before = used_memory()
        fill(store, 0, size, say)
        per_lock.append((used_memory() - before) / size)
    check_fill(stores[0])
    got: list[dict[str, list[float]]] = [{name: [] for name in DECISIONS} for _ in sizes]
    fresh = [10 * max(sizes)]
    for store, size in zip(stores, sizes, strict=True):
        measure(store, size, 200, fresh)  # warm up
    for round_no in range(args.rounds):
        shift = round_no % len(sizes)
        for n in list(range(len(sizes)))[shift:] + list(range(len(sizes)))[:shift]:
            for name, values in measure(
                stores[n], sizes[n], args.samples // args.rounds, fresh
            ).items():
                got[n][name] += values
    stale = stale_release(stores[0], args.stale, say) if args.stale else None
    for n in range(len(sizes)):
        client(FIRST_DB + n).flushdb()
    first = {name: statistics.median(v) for name, v in got[0].items()}
    head = " | ".join(
        f"{name} median µs (p99) | x {sizes[0]:,} row (ratio of medians)" for name in DECISIONS
    )
    lines = [
        "",
        f"| held locks | {head} | bytes per lock |",
        "|---" * (2 + 2 * len(DECISIONS)) + "|",
    ]
    for size, row, memory in zip(sizes, got, per_lock, strict=True):
        cells = []
        for name in DECISIONS:
            median = statistics.median(row[name])
            cells.append(f"{median:.1f} ({p99(row[name]):.0f}) | {median / first[name]:.2f}")
        lines.append(f"| {size:,} | {' | '.join(cells)} | {memory:.0f} |")
    worst = max(statistics.median(got[-1][name]) / first[name] for name in DECISIONS)
    flat = worst <= FLAT
    lines += ["", f"- target flat latency (every decision at {sizes[-1]:,} held locks within "
              f"{FLAT:.2f}x its median at {sizes[0]:,}): **{'yes' if flat else 'no'}** (worst "
              f"{worst:.2f}x); bytes per held lock: "
              + ", ".join(f"{m:.0f} at {n:,}" for n, m in zip(sizes, per_lock, strict=True))]
    if stale is not None:
        lines += [f"- release meeting {args.stale:,} stale index entries: {stale:,.0f} µs"]
    say("\n".join(lines))
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
