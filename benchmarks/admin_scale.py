"""Admin and clear_stale_locks at scale: prints a table (not a timed test).

Fills a real Redis (database 3 of DEDUP_JOBS_TEST_REDIS, flushed first) with 100,000 held
locks and 10,000 pending debounces through the store's own Lua scripts, then measures:

- the first page of *Held locks* and *Debounced jobs* (Django test client, full admin view and
  template; the first request of the process apart, as it compiles templates), *Throttles*,
  and the *Overview* with a year of history at its bound (10 jobs x 3 outcomes: 76,500
  decision rows, plus a day of busiest keys) in the database beside the 100,000 locks,
- searches (a rare id: the ZSCAN MATCH walks the whole index; a common word: it stops after
  one page) and the job filter,
- ``clear_stale_locks --dry-run`` over the 100,000 locks (owner states read from the real
  result backend, one MGET per 500), with its peak Python memory (tracemalloc) measured at
  10,000 and at 100,000 locks: bounded memory means both peaks are about the same.

Run:
    DEDUP_JOBS_TEST_REDIS=redis://127.0.0.1:6379 DEDUP_JOBS_TEST_QUEUE=bench \\
        uv run python benchmarks/admin_scale.py [--locks 100000] [--debounces 10000]
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from tests import settings as test_settings  # noqa: E402

BENCH_DB = 3
test_settings.CACHES["redis"]["LOCATION"] = f"{test_settings.REDIS_URL}/{BENCH_DB}"
test_settings.DATABASES["default"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402

from dedup_jobs import clock  # noqa: E402
from dedup_jobs.keys import build_key  # noqa: E402
from dedup_jobs.stores import get_store  # noqa: E402
from dedup_jobs.stores.base import encode_call  # noqa: E402
from dedup_jobs.stores.redis import scripts as lua  # noqa: E402
from tests import jobs, jobs_debounce  # noqa: E402,F401 - registers the test jobs

TASKS = [f"shop.job_{n:02d}" for n in range(19)] + ["tests.unique_sleep"]
PIPELINE = 2000


def fill_locks(count: int) -> None:
    store: Any = get_store("redis")
    script = store.client.register_script(lua.ACQUIRE)
    pipe = store.client.pipeline(transaction=False)
    for i in range(count):
        key = build_key("unique", TASKS[i % len(TASKS)], f"item={i}")
        # the arguments of RedisStore.acquire: owner, ttl ms, deadline ms (0: none),
        # reentrant, task name, readable id
        script(
            keys=list(store.place(key)),
            args=[str(uuid.uuid4()), 3_600_000, 0, "0", key.task_name, key.ident],
            client=pipe,
        )
        if i % PIPELINE == PIPELINE - 1:
            pipe.execute()
    pipe.execute()


def fill_debounces(count: int) -> None:
    store: Any = get_store("redis")
    script = store.client.register_script(lua.DEBOUNCE)
    now = clock.now()
    pipe = store.client.pipeline(transaction=False)
    for i in range(count):
        key = build_key("debounce", "tests.debounce_record", f"item={i}")
        payload = encode_call((i, "<script>x</script>"), {})
        script(
            keys=store._debounce_keys(key),
            args=[
                str(uuid.uuid4()),
                payload,
                int(now * 1000),
                3_600_000,
                7_200_000,
                3_600_000,
                key.task_name,
                key.ident,
                0,  # no deadline (RedisStore.debounce sends its own)
            ],
            client=pipe,
        )
        if i % PIPELINE == PIPELINE - 1:
            pipe.execute()
    pipe.execute()


def fill_history(job_count: int, outcomes: tuple[str, ...]) -> int:
    """A year of Overview history at its bound, as the flushes leave it: for every (job,
    outcome) every minute bucket of a day, hour bucket of 31 days and day bucket of a year,
    and the 50 busiest keys of every hour of a day. Returns the rows written."""
    from dedup_jobs.metrics.models import DAY, HOUR, KEEP, DecisionCount, KeyCount

    now = int(time.time())
    rows = []
    for job in range(job_count):
        for outcome in outcomes:
            for resolution, keep in KEEP.items():
                first = now // resolution * resolution
                rows += [DecisionCount(resolution=resolution, start=first - n * resolution,
                                       job=f"shop.job_{job:02d}", outcome=outcome,
                                       count=1 + n % 97)
                         for n in range(keep // resolution)]
    keys = [KeyCount(start=now // HOUR * HOUR - h * HOUR, digest=f"{h:04d}{k:036d}",
                     job="shop.job_00", key=f"dedup:unique:shop.job_00:item={k}", count=k)
            for h in range(DAY // HOUR) for k in range(50)]
    DecisionCount.objects.bulk_create(rows, batch_size=5000)
    KeyCount.objects.bulk_create(keys, batch_size=5000)
    return len(rows) + len(keys)


def timed(client: Client, url: str, repeat: int = 5) -> tuple[float, float, int]:
    """(first, median of the next ``repeat``) seconds, and the response size."""
    start = time.perf_counter()
    response = client.get(url)
    first = time.perf_counter() - start
    assert response.status_code == 200, (url, response.status_code)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        client.get(url)
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), len(response.content)


class Null(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def command(*args: str, trace: bool) -> tuple[float, float, str]:
    """(seconds, peak MiB under tracemalloc or 0, last line) of clear_stale_locks."""
    out = io.StringIO() if not trace else Null()
    if trace:
        tracemalloc.start()
    start = time.perf_counter()
    call_command("clear_stale_locks", *args, "--store", "redis", "--dry-run", stdout=out)
    seconds = time.perf_counter() - start
    peak = 0.0
    if trace:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    lines = out.getvalue().strip().splitlines() if isinstance(out, io.StringIO) else [""]
    return seconds, peak, lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--locks", type=int, default=100_000)
    parser.add_argument("--debounces", type=int, default=10_000)
    options = parser.parse_args()
    store: Any = get_store("redis")
    store.client.flushdb()
    call_command("migrate", verbosity=0)
    User.objects.create_superuser("bench", password="bench")
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    rows: list[tuple[str, str, str]] = []

    # memory at 10% of the locks first, to compare peaks
    small = options.locks // 10
    fill_locks(small)
    seconds, peak_small, _ = command(trace=True)
    rows.append(
        (
            f"clear_stale_locks --dry-run, {small:,} locks",
            f"{seconds:.2f} s (traced)",
            f"peak {peak_small:.1f} MiB",
        )
    )
    store.client.flushdb()
    start = time.perf_counter()
    fill_locks(options.locks)
    fill_debounces(options.debounces)
    fill_seconds = time.perf_counter() - start
    history_start = time.perf_counter()
    history_rows = fill_history(10, ("dispatched", "deduplicated", "ran"))
    history_seconds = time.perf_counter() - history_start
    index_size = store.client.zcard(store.index_key())
    pending = store.client.zcard(store.debounce_index_key())

    locks = "/admin/dedup_jobs/joblock/"
    debounces = "/admin/dedup_jobs/pendingdebounce/"
    middle = max(1, options.locks // 200)  # halfway through the 100-a-page listing
    pages = [
        ("Held locks, first page", locks),
        (f"Held locks, page {middle}", locks + f"?p={middle}"),
        ("Held locks, search rare id 'item=99999'", locks + "?q=item%3D99999"),
        ("Held locks, search common 'unique_sleep'", locks + "?q=unique_sleep"),
        ("Held locks, search no match 'nothing-here'", locks + "?q=nothing-here"),
        ("Held locks, filter job=tests.unique_sleep", locks + "?job=tests.unique_sleep"),
        ("Debounced jobs, first page", debounces),
        ("Debounced jobs, search 'item=9999'", debounces + "?q=item%3D9999"),
        ("Job classes", "/admin/dedup_jobs/jobclass/"),
        ("Throttles, first page", "/admin/dedup_jobs/throttlekey/"),
        (f"Overview ({history_rows:,} history rows: a year, 30 pairs)",
         "/admin/dedup_jobs/overview/"),
    ]
    client.get("/admin/dedup_jobs/jobclass/")  # compile the shared templates once
    for label, url in pages:
        first, warm, _size = timed(client, url)
        rows.append((label, f"{first * 1000:.0f} ms first", f"{warm * 1000:.0f} ms median"))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seconds, _, summary = command(trace=False)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows.append(
        (
            f"clear_stale_locks --dry-run, {options.locks:,} locks",
            f"{seconds:.2f} s",
            f"max RSS {rss_before:.0f} -> {rss_after:.0f} MiB",
        )
    )
    seconds, peak, _ = command(trace=True)
    rows.append(
        (
            f"clear_stale_locks --dry-run, {options.locks:,} locks",
            f"{seconds:.2f} s (traced)",
            f"peak {peak:.1f} MiB",
        )
    )
    seconds, _, _ = command("--all", trace=False)
    rows.append((f"clear_stale_locks --all --dry-run, {options.locks:,}", f"{seconds:.2f} s", ""))

    print(
        f"\nRedis {store.client.connection_pool.connection_kwargs.get('port')} db {BENCH_DB}: "
        f"{index_size:,} held locks in the index, {pending:,} pending debounces "
        f"(filled in {fill_seconds:.1f} s); Overview history {history_rows:,} rows in SQLite "
        f"(written in {history_seconds:.1f} s)"
    )
    print(f"command summary: {summary}\n")
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'time':<22}  other")
    print(f"{'-' * width}  {'-' * 22}  {'-' * 28}")
    for label, a, b in rows:
        print(f"{label:<{width}}  {a:<22}  {b}")
    store.client.flushdb()


if __name__ == "__main__":
    main()
