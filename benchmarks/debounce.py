"""Debounce benchmark: prints a table (not a timed test).

1. Store round trips per debounced dispatch: Redis ``INFO commandstats`` deltas on the
   django-redis store (publishing to an in-memory broker, so only the store's commands count),
   Django's captured queries on the database store (SQLite), cache calls on locmem.
2. Broker messages published for 10,000 dispatches of one debounce id inside one window, with
   a real worker on the broker (Redis, or RabbitMQ as below): messages, runs, the arguments
   of the run, results.
3. A steady stream (a dispatch every 0.5 s, debounce_for=1.5, max_wait=4, for 20 s): the delay
   of the first run after the first dispatch and the gaps between runs (must be <= max_wait + 1).

Run (it flushes Redis databases 9-12 of DEDUP_JOBS_TEST_REDIS, like the tests):
    DEDUP_JOBS_TEST_REDIS=redis://127.0.0.1:6379 DEDUP_JOBS_TEST_QUEUE=bench \
        uv run python benchmarks/debounce.py
On RabbitMQ (parts 2 and 3; the store and results stay in Redis), add
    CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672//
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import kombu  # noqa: E402
import redis  # noqa: E402
from celery.signals import after_task_publish  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.cache import caches  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.test.utils import CaptureQueriesContext, override_settings  # noqa: E402

from dedup_jobs import DebouncedJob  # noqa: E402
from dedup_jobs.stores import _stores  # noqa: E402
from tests import jobs_debounce  # noqa: E402
from tests.celery_app import app  # noqa: E402
from tests.workers import thread_worker, wait_for  # noqa: E402

BACKEND = ("subscribe", "unsubscribe")  # Celery's result backend, not the store
DISPATCHES = 10_000
BURST_WINDOW = 10.0  # debounce_for of the burst job: 10,000 dispatches fit in one window
STREAM_SECONDS, STREAM_EVERY = 20.0, 0.5
STREAM_DEBOUNCE, STREAM_MAX_WAIT = 1.5, 4.0


@app.task(
    base=DebouncedJob, debounce_for=BURST_WINDOW, debounce_on=("item",), name="bench.debounce_burst"
)
def debounce_burst(item: int, value: int) -> int:
    jobs_debounce.record("bench_burst", value)
    return value


published: Counter[str] = Counter()


@after_task_publish.connect(weak=False)
def _count_publish(sender: str | None = None, **kwargs: Any) -> None:
    published[str(sender)] += 1


def rows(title: str, header: tuple[str, ...], lines: list[tuple[Any, ...]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=False)]
    print(f"\n{title}")
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*header))
    print("-+-".join("-" * w for w in widths))
    for line in lines:
        print(fmt.format(*(str(x) for x in line)))


def flush() -> None:
    for db in (9, 10, 11, 12):
        redis.Redis.from_url(f"{settings.REDIS_URL}/{db}").flushdb()
    caches["locmem"].clear()
    _stores.clear()
    app.control.purge()  # our queue on the broker in use (RabbitMQ keeps it across runs)


def commandstats(client: redis.Redis) -> dict[str, int]:
    return {name: int(v["calls"]) for name, v in client.info("commandstats").items()}


def round_trips() -> list[tuple[Any, ...]]:
    lines: list[tuple[Any, ...]] = []
    n = 1000
    client = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
    task = jobs_debounce.debounce_record
    with override_settings(DEDUP_JOBS={"STORE": "redis"}), kombu.Connection("memory://") as mem:
        task.apply_async((0, 0), connection=mem)  # load the script
        for label, item in (
            ("django-redis, first dispatch of a burst", None),
            ("django-redis, absorbed dispatch", 1),
        ):
            before = commandstats(client)
            for i in range(n):
                task.apply_async((i + 10 if item is None else item, i), connection=mem)
            after = commandstats(client)
            delta = {k.removeprefix("cmdstat_"): after.get(k, 0) - before.get(k, 0) for k in after}
            delta["info"] -= 1  # our own INFO
            inside = ", ".join(
                f"{k} {v / n:g}"
                for k, v in sorted(delta.items())
                if v >= n / 2 and k not in ("evalsha", *BACKEND)
            )
            lines.append(
                (
                    label,
                    f"{delta.get('evalsha', 0) / n:.3f}",
                    f"commandstats: EVALSHA; inside the script: {inside}"
                    + (
                        "; (result backend on publish: SUBSCRIBE/UNSUBSCRIBE)"
                        if any(delta.get(k) for k in BACKEND)
                        else ""
                    ),
                )
            )
    db = settings.DATABASES["default"]["NAME"]  # a file of this process's own (pid in name)
    with (
        override_settings(
            DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": "default"},
        ),
        kombu.Connection("memory://") as mem,
    ):
        call_command("migrate", verbosity=0, database="default")
        for label, item in (
            ("database (SQLite), first dispatch", None),
            ("database (SQLite), absorbed dispatch", 1),
        ):
            with CaptureQueriesContext(connections["default"]) as queries:
                for i in range(200):
                    task.apply_async((i + 10 if item is None else item, i), connection=mem)
            lines.append(
                (
                    label,
                    f"{len(queries) / 200:.3f}",
                    "SQL statements: " + queries[-1]["sql"].split()[0],
                )
            )
        connections["default"].close()
    os.unlink(db)
    cache = caches["locmem"]
    calls: Counter[str] = Counter()
    originals = {name: getattr(cache, name) for name in ("add", "get", "set_many", "delete")}

    def counting(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return originals[name](*args, **kwargs)

        return call

    with override_settings(DEDUP_JOBS={"STORE": "locmem"}), kombu.Connection("memory://") as mem:
        _stores.clear()
        for name in originals:
            setattr(cache, name, counting(name))
        try:
            for i in range(200):
                task.apply_async((1, i), connection=mem)
        finally:
            for name in originals:
                delattr(cache, name)
    per = sum(calls.values()) / 200
    lines.append(
        (
            "locmem (generic cache, in-process)",
            f"{per:.3f}",
            "cache calls (mutex add/get/delete + state get/set_many): "
            + ", ".join(f"{k} {v / 200:g}" for k, v in sorted(calls.items())),
        )
    )
    return lines


def burst() -> list[tuple[Any, ...]]:
    flush()
    published.clear()
    with override_settings(DEDUP_JOBS={"STORE": "redis"}), thread_worker(app):
        start = time.monotonic()
        results = [debounce_burst.delay(1, value) for value in range(DISPATCHES)]
        spent = time.monotonic() - start
        wait_for(lambda: jobs_debounce.runs("bench_burst"), timeout=60)
        time.sleep(BURST_WINDOW / 2)  # any stray message would show up here
        done = time.monotonic()
        backend = app.backend
        metas = backend.client.mget([backend.get_key_for_task(r.id) for r in results])
        ready = [backend.decode_result(m) for m in metas if m]
    values = jobs_debounce.values("bench_burst")
    good = sum(1 for m in ready if m["status"] == "SUCCESS" and m["result"] == DISPATCHES - 1)
    return [
        ("dispatches (one debounce id)", DISPATCHES),
        ("dispatch time", f"{spent:.2f} s ({spent / DISPATCHES * 1e6:.0f} us each)"),
        (
            "window (debounce_for)",
            f"{BURST_WINDOW} s (messages = 1 + one per wake-up that finds the burst moved)",
        ),
        ("broker messages published", published["bench.debounce_burst"]),
        ("runs observed", len(values)),
        (
            "arguments of the run",
            f"value={values[0] if values else None} (last dispatched: {DISPATCHES - 1})",
        ),
        ("AsyncResults with the run's result", f"{good} / {DISPATCHES}"),
        ("first dispatch -> results ready", f"{done - start:.1f} s (incl. the wait for strays)"),
    ]


def stream() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], bool]:
    flush()
    published.clear()
    task = jobs_debounce.debounce_stream
    assert (task.debounce_for, task.max_wait) == (STREAM_DEBOUNCE, STREAM_MAX_WAIT)
    with override_settings(DEDUP_JOBS={"STORE": "redis"}), thread_worker(app):
        first = time.time()
        value = 0
        results = []
        while time.time() - first < STREAM_SECONDS:
            results.append(task.delay(1, value))
            value += 1
            time.sleep(STREAM_EVERY)
        last = time.time()
        outcomes = [r.get(timeout=30) for r in results]
    ran = jobs_debounce.runs("stream")
    times = [first] + [at for at, _ in ran]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    runs_table = [
        (i + 1, f"{at - first:6.2f} s", f"{gap:.2f} s", v)
        for i, ((at, v), gap) in enumerate(zip(ran, gaps, strict=True))
    ]
    ok = max(gaps[:-1] or [0]) <= STREAM_MAX_WAIT + 1 and ran[-1][1] == value - 1
    summary = [
        ("dispatches", f"{value} (every {STREAM_EVERY} s for {STREAM_SECONDS:g} s)"),
        ("debounce_for / max_wait", f"{STREAM_DEBOUNCE} s / {STREAM_MAX_WAIT} s"),
        ("runs", len(ran)),
        ("first dispatch -> first run", f"{gaps[0]:.2f} s"),
        (
            "largest gap while the stream lasts",
            f"{max(gaps[:-1] or [0]):.2f} s (limit {STREAM_MAX_WAIT + 1:g} s)",
        ),
        (
            "last dispatch -> last run",
            f"{ran[-1][0] - last + STREAM_EVERY:.2f} s (<= debounce_for {STREAM_DEBOUNCE} s)",
        ),
        ("last run's value / last dispatched", f"{ran[-1][1]} / {value - 1}"),
        ("every dispatch resolved to its run", sorted(set(outcomes)) == [v for _, v in ran]),
        ("broker messages published", published["tests.debounce_stream"]),
        ("verdict (gaps <= max_wait + 1 s, last value ran)", "PASS" if ok else "FAIL"),
    ]
    return summary, runs_table, ok


def main() -> int:
    flush()
    rows(
        "1. Store round trips per debounced dispatch",
        ("store / case", "round trips per dispatch", "measured by"),
        round_trips(),
    )
    burst_rows = burst()
    broker = str(app.conf.broker_url).split(":", 1)[0]
    rows(
        f"2. {DISPATCHES:,} dispatches of one id inside one window ({broker} broker, real worker)",
        ("figure", "value"),
        burst_rows,
    )
    summary, runs_table, ok = stream()
    rows(
        "3. Steady stream: runs (time after the first dispatch, gap since the previous run)",
        ("run", "at", "gap", "value"),
        runs_table,
    )
    rows(f"3. Steady stream: summary ({broker} broker)", ("figure", "value"), summary)
    messages = dict(burst_rows)["broker messages published"]
    runs = dict(burst_rows)["runs observed"]
    accepted = int(messages) <= 3 and runs == 1 and ok
    print(
        f"\nAcceptance: <= 3 messages and exactly 1 run for {DISPATCHES:,} dispatches "
        f"({messages} messages, {runs} run); steady-stream gaps <= max_wait + 1 s: "
        f"{'PASS' if accepted else 'FAIL'}"
    )
    return 0 if accepted else 1


if __name__ == "__main__":
    sys.exit(main())
