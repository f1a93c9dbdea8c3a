"""``python -m benchmarks.django_tasks_enqueue``: the cost of a unique Django task's
``enqueue`` on django-tasks-db's DatabaseBackend, against the plain ``enqueue`` of the same
task and one bare store decision, on SQLite and on PostgreSQL (issue 24: a unique enqueue
costs at most the plain enqueue plus one store decision).

Per database, in one process of its own (``--database``), rounds interleaved (the order
rotating from round to round), ``--batch`` calls per batch, a fresh key per call (every
unique enqueue takes a lock):

- ``plain enqueue``: ``task.enqueue(n)`` (one INSERT, its commit, ``task_enqueued``);
- ``plain, in transaction.atomic``: the same inside ``transaction.atomic()``, as a unique
  enqueue runs it (a duplicate's row must roll back): BEGIN and COMMIT of its own;
- ``unique, database store``: ``@unique(unique_via="database")``: the row and the lock in one
  transaction (the lock's statement rides in the row's transaction: one commit for both);
- ``unique, redis store``: ``@unique(unique_via="redis")``: the row's transaction, and one
  Redis round trip inside it;
- ``decision alone``: ``store.acquire`` on that store, by itself (the database store's pays
  its own commit, which inside an enqueue it shares with the row).

Prints a markdown table (median µs per call over the rounds, the ratio to the plain enqueue,
plain + decision and plain-in-a-transaction + decision beside the unique enqueue, and the
unique enqueue's own store call timed where it happens); asserts nothing. PostgreSQL: a database of
its own, created and dropped here. Redis: ``DEDUP_JOBS_BENCH_REDIS`` (database 14 flushed).

    uv run python -m benchmarks.django_tasks_enqueue [--rounds 7] [--batch 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_NAME = f"dedup_bench_tasks_{os.getpid()}"
VARIANTS = ("plain enqueue", "plain, in transaction.atomic", "unique, database store",
            "database decision alone", "unique, redis store", "redis decision alone")


def configure(database: str, name: str) -> None:
    from django.conf import settings

    redis_url = os.environ.get("DEDUP_JOBS_BENCH_REDIS",
                               os.environ.get("DEDUP_JOBS_TEST_REDIS", "redis://127.0.0.1:6379"))
    if database == "sqlite":
        db = {"ENGINE": "django.db.backends.sqlite3", "NAME": name,
              "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"}}
    else:
        db = {"ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": "postgres",
              "HOST": os.environ.get("DEDUP_JOBS_TEST_PG_HOST", "127.0.0.1"), "PORT": 5432}
    settings.configure(
        SECRET_KEY="benchmarks-only", USE_TZ=True, DEBUG=False,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "dedup_jobs",
                        "django_tasks_db"],
        DATABASES={"default": db},
        CACHES={"redis": {"BACKEND": "django_redis.cache.RedisCache",
                          "LOCATION": f"{redis_url}/14"},
                "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}},
        DEDUP_JOBS={"STORE": "database",
                    "METRICS": os.environ.get("DEDUP_JOBS_BENCH_METRICS", "1") == "1"},
        LOGGING_CONFIG=None,
    )


def measure(database: str, pg_name: str, rounds: int, batch: int) -> dict[str, list[float]]:
    """µs per call of each variant, one value per round."""
    import django

    name = (str(Path(tempfile.mkdtemp()) / "tasks.sqlite3") if database == "sqlite"
            else pg_name)
    configure(database, name)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from benchmarks import django_tasks_jobs as bench
    from dedup_jobs import clock
    from dedup_jobs.keys import build_key
    from dedup_jobs.stores import get_store

    fresh = count()
    stores = {"database": get_store("database"), "redis": get_store("redis")}
    stores["redis"].client.flushdb()  # type: ignore[attr-defined]

    def decision(alias: str) -> Callable[[], object]:
        store = stores[alias]

        def call() -> object:
            key = build_key("unique", "benchmarks.decision", str(next(fresh)))
            return store.acquire(key, f"owner-{next(fresh)}", 600, now=clock.now())

        return call

    from django.db import transaction

    def plain_atomic() -> object:
        with transaction.atomic():
            return bench.plain.enqueue(next(fresh))

    calls: dict[str, Callable[[], object]] = {
        "plain enqueue": lambda: bench.plain.enqueue(next(fresh)),
        "plain, in transaction.atomic": plain_atomic,
        "unique, database store": lambda: bench.unique_database.enqueue(next(fresh)),
        "database decision alone": decision("database"),
        "unique, redis store": lambda: bench.unique_redis.enqueue(next(fresh)),
        "redis decision alone": decision("redis"),
    }
    from dedup_jobs.django_tasks import enqueue

    # the lock's store call timed where it happens, inside the unique enqueue (the store
    # answers later there than in a loop of nothing else: its server was idle meanwhile)
    in_place = [0.0]
    take = enqueue.Decision.take

    def timed_take(self: enqueue.Decision, owner: str) -> None:
        started = time.perf_counter()
        try:
            take(self, owner)
        finally:
            in_place[0] += time.perf_counter() - started

    enqueue.Decision.take = timed_take  # type: ignore[method-assign]
    for call in calls.values():  # warm up: connections, scripts, statement caches
        for _ in range(20):
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    samples.update({f"{name} (in place)": [] for name in calls if name.startswith("unique")})
    order = list(calls)
    for round_ in range(rounds):
        for name in order[round_ % len(order):] + order[:round_ % len(order)]:
            in_place[0] = 0.0
            started = time.perf_counter()
            for _ in range(batch):
                calls[name]()
            samples[name].append((time.perf_counter() - started) / batch * 1e6)
            if name.startswith("unique"):
                samples[f"{name} (in place)"].append(in_place[0] / batch * 1e6)
    from django.db import connections

    connections.close_all()
    return samples


def _pg(statement: str) -> None:
    import psycopg

    with psycopg.connect(host=os.environ.get("DEDUP_JOBS_TEST_PG_HOST", "127.0.0.1"),
                         user="postgres", dbname="postgres", autocommit=True) as db:
        db.execute(statement)


def table(results: dict[str, dict[str, float]]) -> str:
    lines = ["| database | enqueue | µs per call (median) | ÷ plain | plain + decision (µs) "
             "| plain in atomic + decision (µs) | its decision, timed in place (µs) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for database, figures in results.items():
        plain = figures["plain enqueue"]
        atomic = figures["plain, in transaction.atomic"]
        for name in VARIANTS:
            value = figures[name]
            plus = in_atomic = in_place = ""
            if name.startswith("unique, "):
                decision = figures[f"{name.split(', ')[1].split()[0]} decision alone"]
                plus, in_atomic = f"{plain + decision:.0f}", f"{atomic + decision:.0f}"
                in_place = f"{figures[f'{name} (in place)']:.0f}"
            lines.append(f"| {database} | {name} | {value:.0f} | {value / plain:.2f} | "
                         f"{plus} | {in_atomic} | {in_place} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--database", choices=("sqlite", "postgres"))
    parser.add_argument("--pg-name", default=PG_NAME)
    options = parser.parse_args()
    if options.database:  # one database, in this process: JSON of the medians
        samples = measure(options.database, options.pg_name, options.rounds, options.batch)
        print(json.dumps({name: statistics.median(v) for name, v in samples.items()}))
        return
    results: dict[str, dict[str, float]] = {}
    for database in ("sqlite", "postgres"):
        if database == "postgres":
            _pg(f'CREATE DATABASE "{PG_NAME}"')
        try:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.django_tasks_enqueue", "--database",
                 database, "--pg-name", PG_NAME, "--rounds", str(options.rounds),
                 "--batch", str(options.batch)],
                cwd=ROOT, check=True, capture_output=True, text=True).stdout
        finally:
            if database == "postgres":
                _pg(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')
        results[database] = json.loads(out.strip().splitlines()[-1])
    print(f"Unique enqueue on django-tasks-db, {options.rounds} rounds x {options.batch} "
          f"calls, a fresh key per call (µs per call, median of the rounds)\n")
    print(table(results))


if __name__ == "__main__":
    main()
