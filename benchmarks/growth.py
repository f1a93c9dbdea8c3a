"""``python -m benchmarks.growth``: does a decision get slower as the store holds more locks?

The store (the benchmark's django-redis cache, database 14) is filled with 1,000, then
100,000, then 1,000,000 held locks of ``bench.unique``, each made as ACQUIRE makes one (the
same hash fields, PEXPIRE, and its entry in the ``unique`` index zset, scored by its expiry;
the benchmark checks a filled lock against a real one before it measures), by a Lua script
taking a batch of locks per call. At each size, ``--samples`` times over: a first acquire of a
fresh key, a duplicate acquire of a random held key, the worker's start of the fresh lock and
its release (the store API, one round trip each: the decisions of a UniqueJob's dispatch,
duplicate, worker start and finish), each timed alone. ``used_memory`` (INFO memory) before
and after each fill gives the bytes per held lock.

Last, the **stale index** case: locks that expired by themselves (never-run jobs, killed
workers) leave their index entries behind until an index trim removes them; the release that
meets ``--stale`` of them is timed alone.

Run against a Redis of your own (it flushes databases 13-15 of it, and fills 14):
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

from benchmarks import app as bench
from benchmarks.redisutil import clean, client
from benchmarks.settings import STORE_DB
from dedup_jobs import clock
from dedup_jobs.jobs.base import new_task_id
from dedup_jobs.keys import JobKey
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

# STALE — index entries of locks that expired by themselves: scored in the past, no hash.
# KEYS[1] the index; ARGV[1] physical key prefix, ARGV[2] first number, ARGV[3] count
STALE = """
local t = redis.call('TIME')
local past = tonumber(t[1]) * 1000 - 60000
local first = tonumber(ARGV[2])
for i = first, first + tonumber(ARGV[3]) - 1 do
  redis.call('ZADD', KEYS[1], past, ARGV[1] .. i)
end
return tonumber(ARGV[3])
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
    redis = client(STORE_DB)
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
    redis = client(STORE_DB)
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
    redis = client(STORE_DB)
    script = redis.register_script(STALE)
    index = store.index_key()
    prefix = store.physical("dedup_jobs:unique:bench.unique:gone=")
    for low in range(0, stale, 10_000):
        script(keys=[index], args=[prefix, low, min(10_000, stale - low)])
    key, owner = key_of(-2), new_task_id()
    store.acquire(key, owner, 60.0, now=clock.now())
    t0 = time.perf_counter()
    store.release(key, owner)
    elapsed = (time.perf_counter() - t0) * 1e6
    left = redis.zcount(index, "-inf", int(time.time() * 1000) - 1)
    say(f"  stale: {stale:,} expired entries; the release took {elapsed:,.0f} µs, {left:,} left")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.growth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--samples", type=int, default=2000, help="per decision and size")
    parser.add_argument("--stale", type=int, default=100_000, help="0: skip that case")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    def say(text: str) -> None:
        print(text, flush=True)

    store = bench.unique.store()
    assert isinstance(store, RedisStore)
    clean()
    say(
        f"growth: sizes {sizes}, {args.samples} samples per decision, load {os.getloadavg()[0]:.2f}"
    )
    rows: list[tuple[int, dict[str, list[float]], float]] = []
    held, base_memory = 0, used_memory()
    fresh = [10 * max(sizes)]
    for size in sizes:
        fill(store, held, size - held, say)
        held = size
        if len(rows) == 0:
            check_fill(store)
        per_lock = (used_memory() - base_memory) / held
        got = measure(store, held, 200, fresh)  # warm up
        got = measure(store, held, args.samples, fresh)
        rows.append((size, got, per_lock))
        say(
            f"  {size:,}: "
            + ", ".join(f"{name} {statistics.median(v):.0f} µs" for name, v in got.items())
        )
    stale = stale_release(store, args.stale, say) if args.stale else None
    clean()
    first = {name: statistics.median(v) for name, v in rows[0][1].items()}
    head = " | ".join(f"{name} median µs (p99) | x 1,000 row" for name in DECISIONS)
    lines = [
        "",
        f"| held locks | {head} | bytes per lock |",
        "|---" * (2 + 2 * len(DECISIONS)) + "|",
    ]
    for size, got, per_lock in rows:
        cells = []
        for name in DECISIONS:
            median = statistics.median(got[name])
            cells.append(f"{median:.0f} ({p99(got[name]):.0f}) | {median / first[name]:.2f}")
        lines.append(f"| {size:,} | {' | '.join(cells)} | {per_lock:.0f} |")
    if stale is not None:
        lines += ["", f"- release meeting {args.stale:,} stale index entries: {stale:,.0f} µs"]
    say("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
