"""``python -m benchmarks.stale_index``: the one call that meets a backlog of stale index
entries, for each index of the Redis store.

Keys that expire by themselves leave their entries in an index (a sorted set scored by
expiry) until a trim drops them: locks whose jobs never ran (the ``unique`` index), bursts
nobody claimed (the ``debounce`` index), throttle keys left idle (the ``throttle`` index).
Redis runs one script at a time, so a script that trims a whole backlog stalls every client
of the server for as long. For each ``--stale`` size, on a fresh database, the benchmark fills
one index with that many entries scored in the past and times, alone:

- **release**: the RELEASE that meets them (every release trims the lock index);
- **debounce**: the first DEBOUNCE dispatch that meets them (every dispatch trims the
  debounce index);
- **admission**: the first THROTTLE_ADMIT of a fresh key that trims the throttle index (one
  in about 16 does, by the microseconds of the server's TIME; the stale count dropping shows
  which);
- **operator's trim**: ``clear_stale_locks``' ``trim_index()`` over the whole lock backlog,
  its total time and the longest single server call (``SLOWLOG``, threshold 0 for the run).

Each row prints the entries left after the call, so what the call removed is computable.

Run against a Redis of your own (it flushes database 4 of it; ~0.1 GB at 1,000,000):
    DEDUP_JOBS_BENCH_REDIS=redis://127.0.0.1:<port> DEDUP_JOBS_BENCH_QUEUE=<queue> \\
        uv run python -m benchmarks.stale_index [--stale 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/stale_index.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks import app as bench  # noqa: F401  (Django set up, the jobs registered)
from benchmarks.redisutil import client
from benchmarks.settings import REDIS_URL
from dedup_jobs import clock
from dedup_jobs.jobs.base import new_task_id
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import encode_call
from dedup_jobs.stores.redis.store import RedisStore

DB = 4
HOUR_MS = 3_600_000

# STALE — KEYS[1] an index; ARGV[1] member prefix, ARGV[2] first number, ARGV[3] count,
# ARGV[4] how long ago the entries' keys expired, ms (past any grace the index keeps)
STALE = """
local t = redis.call('TIME')
local past = tonumber(t[1]) * 1000 - tonumber(ARGV[4])
local first = tonumber(ARGV[2])
for i = first, first + tonumber(ARGV[3]) - 1 do
  redis.call('ZADD', KEYS[1], past, ARGV[1] .. i)
end
return tonumber(ARGV[3])
"""


def the_store() -> RedisStore:
    from django.conf import settings

    settings.CACHES = {**settings.CACHES, "stale": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"{REDIS_URL}/{DB}"}}
    store = get_store("stale")
    assert isinstance(store, RedisStore)
    return store


def backlog(store: RedisStore, index: str, count: int) -> None:
    script = store.client.register_script(STALE)
    prefix = store.physical("dedup_jobs:gone=")
    for low in range(0, count, 10_000):
        script(keys=[index], args=[prefix, low, min(10_000, count - low), 2 * HOUR_MS])


def left(store: RedisStore, index: str) -> int:
    return int(store.client.zcount(index, "-inf", int((time.time() - HOUR_MS / 1000) * 1000)))


def timed(action: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    action()
    return (time.perf_counter() - t0) * 1e6


def release(store: RedisStore) -> float:
    key, owner = build_key("unique", "bench.unique", "item=stale"), new_task_id()
    store.acquire(key, owner, 60.0, now=clock.now())
    return timed(lambda: store.release(key, owner))


def debounce(store: RedisStore) -> float:
    key = build_key("debounce", "bench.debounced", "item=stale")
    return timed(lambda: store.debounce(key, new_task_id(), encode_call((1,), {}),
                                        now=clock.now(), debounce_for=60, max_wait=None,
                                        ttl=3600))


def admission(store: RedisStore, most: int) -> float:
    """µs of the first THROTTLE_ADMIT (of fresh keys, at most ``most`` tried) that trimmed
    the throttle index (the index's stale count dropped); 0 when none did."""
    index = store.throttle_index_key()
    before = left(store, index)
    for n in range(most):
        key = build_key("throttle", "bench.throttled", f"item={n}")
        took = timed(lambda key=key: store.throttle_admit(  # type: ignore[misc]
            key, new_task_id(), delivery=new_task_id(), concurrency=2, rate_limit=0,
            rate_period=1.0, lease=60))
        if left(store, index) < before:
            return took
    return 0.0


def warm(store: RedisStore) -> None:
    """Each script once (loaded on the server before anything is timed)."""
    release(store)
    debounce(store)
    admission(store, 1)
    store.trim_index()


def operators_trim(store: RedisStore) -> tuple[float, float]:
    """Total µs of trim_index() and the longest server call of it (SLOWLOG), µs."""
    redis = store.client
    threshold = redis.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    redis.config_set("slowlog-log-slower-than", 0)
    redis.slowlog_reset()
    try:
        total = timed(store.trim_index)
        calls = [entry for entry in redis.slowlog_get(10_000)
                 if entry["command"].split(b" ", 1)[0].lower()
                 in (b"eval", b"evalsha", b"zremrangebyscore")]
    finally:
        redis.config_set("slowlog-log-slower-than", threshold)
    return total, max((entry["duration"] for entry in calls), default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stale_index",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stale", default="10000,100000,1000000")
    parser.add_argument("--admissions", type=int, default=1000,
                        help="admissions tried for one that trims")
    args = parser.parse_args(argv)
    store = the_store()
    client(DB).flushdb()
    warm(store)
    rows = []
    for size in (int(s) for s in args.stale.split(",")):
        row: list[str] = [f"{size:,}"]
        for index, call in ((store.index_key(), lambda: release(store)),
                            (store.debounce_index_key(), lambda: debounce(store)),
                            (store.throttle_index_key(),
                             lambda: admission(store, args.admissions))):
            client(DB).flushdb()
            backlog(store, index, size)
            row += [f"{call():,.0f}", f"{left(store, index):,}"]
        client(DB).flushdb()
        backlog(store, store.index_key(), size)
        total, longest = operators_trim(store)
        row += [f"{total:,.0f}", f"{longest:,.0f}", f"{left(store, store.index_key()):,}"]
        rows.append(row)
        print(f"  {size:,} stale entries measured", flush=True)
    client(DB).flushdb()
    print("\n| stale entries | release µs | left | debounce µs | left | admission that "
          "trimmed µs | left | operator's trim µs | its longest server call µs | left |\n"
          + "|---" * 10 + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
