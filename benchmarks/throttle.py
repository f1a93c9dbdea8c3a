"""Throttle benchmark (Deliver 6 of issue 15; SPEC T2-T4): prints a table, asserts nothing.

1,000 messages of one hot throttle key, dispatched at once, drained by a prefork worker with
4 processes on the Redis store and the Redis broker; counted on the Redis server (MONITOR, in
a thread): the store's EVALSHAs per script (admissions, slot releases, renewals) and the
broker's LPUSHes onto the queue (the first publish of every message plus every deferral).

- ``concurrency=2``, a 20 ms body: the drain takes >= 1,000 x 0.02 / 2 = 10 s;
- ``throttle="10/s"``, an empty body: the drain takes >= 99.9 s (100 windows of 10 starts);
- the reference (``--only plain``): the same 1,000 messages of a plain Celery task with the
  20 ms body on a worker with 2 processes, nothing throttled: the practical full rate of two
  slots on this machine (>= 10 s; Celery's own time per task is in it).

Run (it flushes Redis databases 9-12 of DEDUP_JOBS_TEST_REDIS, like the tests; use a Redis
of your own):
    DEDUP_JOBS_TEST_REDIS=redis://127.0.0.1:<port> DEDUP_JOBS_TEST_QUEUE=bench_throttle \\
        uv run python benchmarks/throttle.py [--messages 1000] [--only concurrency|rate] \\
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402

from tests import jobs_throttle  # noqa: E402
from tests.celery_app import app  # noqa: E402
from tests.throttle_support import ServerCounts  # noqa: E402
from tests.workers import process_worker  # noqa: E402

BODY = 0.02  # seconds, the concurrency case's body


def flush() -> None:
    for db in (9, 10, 11, 12):
        redis.Redis.from_url(f"{settings.REDIS_URL}/{db}").flushdb()


def drain(case: str, messages: int) -> dict[str, Any]:
    """Dispatch ``messages`` of one key at once, wait for every result, count on the server."""
    flush()
    queue = app.conf.task_default_queue
    counts = ServerCounts(store_db=9, broker_db=10, queue=queue)
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_throttle", "DEDUP_JOBS_TEST_LEASE": "60",
           "DEDUP_JOBS_TEST_FLOW_STORE": "redis"}
    processes = 4
    if case == "concurrency":
        task: Any = jobs_throttle.bench_two_at_once
        def one(i: int) -> Any:
            return task.delay(tag=i, seconds=BODY)
        limit = "concurrency=2"
    elif case == "plain":
        # the practical full rate: plain Celery tasks, two processes, nothing throttled
        task = jobs_throttle.bench_plain_sleep
        def one(i: int) -> Any:
            return task.delay(tag=i, seconds=BODY)
        limit, processes = "none: plain Celery, -c 2", 2
    else:
        task = jobs_throttle.bench_ten_per_second
        def one(i: int) -> Any:
            return task.delay(tag=i)
        limit = 'throttle="10/s"'
    seconds: list[float] = []
    with process_worker(concurrency=processes, env=env):
        task.delay(tag=-1).get(timeout=60) if case != "rate" else None
        time.sleep(1.1)

        def run() -> None:
            began = time.monotonic()
            results = [one(i) for i in range(messages)]
            for result in results:
                result.get(timeout=600)
            seconds.append(time.monotonic() - began)

        counts.run(run)
    extra = 1 if case == "concurrency" else 0  # the warm-up message, sent before counting
    del extra
    return {
        "limit": limit, "messages": messages, "seconds": seconds[0],
        "admissions": counts.scripts["THROTTLE_ADMIT"],
        "releases": counts.scripts["THROTTLE_RELEASE"],
        "renewals": counts.scripts["THROTTLE_RENEW"],
        "other": sum(counts.other_store.values()),
        "published": counts.published + counts.wakes,
        "wakes": counts.wakes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--only", help="comma-separated cases: concurrency, plain, rate")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the rows (drain()'s dicts) to PATH, for benchmarks.table")
    options = parser.parse_args()
    cases = options.only.split(",") if options.only else ["concurrency", "plain", "rate"]
    unknown = set(cases) - {"concurrency", "plain", "rate"}
    if unknown:
        parser.error(f"--only: unknown case(s) {sorted(unknown)}; use concurrency, plain, rate")
    rows = [drain(case, options.messages) for case in cases]
    if options.json:
        Path(options.json).write_text(json.dumps({"body": BODY, "rows": rows}))
    head = ("limit", "messages", "drain s", "admissions", "releases", "renewals",
            "store calls", "per msg", "wakes", "broker msgs", "per msg", "deferrals", "per msg")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for row in rows:
        n = row["messages"]
        calls = row["admissions"] + row["releases"] + row["renewals"] + row["other"]
        deferrals = row["admissions"] - n if row["admissions"] else 0
        print("| " + " | ".join([
            row["limit"], str(n), f"{row['seconds']:.1f}", str(row["admissions"]),
            str(row["releases"]), str(row["renewals"]), str(calls), f"{calls / n:.2f}",
            str(row["wakes"]), str(row["published"]), f"{row['published'] / n:.2f}",
            str(deferrals),
            f"{deferrals / n:.2f}",
        ]) + " |")
    print()
    plain = next((row for row in rows if row["limit"].startswith("none")), None)
    for row in rows:
        n = row["messages"]
        if row is plain:
            continue
        if plain is not None and row["limit"] == "concurrency=2":
            print(f"concurrency=2 drain x the plain -c 2 drain's rate: {plain['seconds']:.1f} s "
                  f"/ {row['seconds']:.1f} s = {plain['seconds'] / row['seconds']:.2f}; x the "
                  f"slots' full rate: {n * BODY / 2:.1f} s / {row['seconds']:.1f} s = "
                  f"{n * BODY / 2 / row['seconds']:.2f}")
        calls = row["admissions"] + row["releases"] + row["renewals"] + row["other"]
        within = calls <= 3 * n and row["published"] <= 3 * n
        print(f"{row['limit']}: {calls} store calls / {n} messages = {calls / n:.3f}, "
              f"{row['published']} broker messages / {n} = {row['published'] / n:.3f}: "
              f"{'within' if within else 'over'} the budget of 3 and 3.")
    print()
    print("store calls = admissions + releases + renewals (+ any other command on the store's "
          "database); broker msgs = LPUSH onto the queue (1 per message + 1 per deferral) + "
          "wakes (a PUBLISH of dedup_jobs_wake on the workers' control channel); "
          "deferrals = admissions - messages. Budget (issue 15): <= 3 store calls and <= 3 "
          "broker messages per message over the whole drain.")


if __name__ == "__main__":
    main()
