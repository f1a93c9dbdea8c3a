"""What the worker benchmarks (``benchmarks.throughput``) add to the benchmark app, imported
by the client and by the worker (``celery worker -I benchmarks.throughput_jobs``).

In a worker started with ``BENCH_THROUGHPUT=1`` the job bodies record nothing (they return at
once, or sleep), and every finished message costs one bookkeeping call, the same for every
contender: an EVALSHA that counts it and, at the count the client set, pushes onto a list the
client is blocked on (so the last result is seen without polling). ``task_prerun`` counts
started bodies too (the lease measurement waits for all of them to be running).
"""

from __future__ import annotations

import os
from typing import Any

from celery.signals import task_postrun, task_prerun

from benchmarks import app as bench
from benchmarks.redisutil import client
from benchmarks.settings import RESULT_DB
from dedup_jobs import DebouncedJob

#: keys of the bookkeeping (RESULT_DB): finished count, the count to signal at, the signal
DONE, TARGET, SIGNAL, STARTED = "tp:done", "tp:target", "tp:signal", "tp:started"
#: seconds of quiet before a DebouncedJob's message runs: short, so that its message is due by
#: the time it is taken; its claim (the worker's one store call) is what is measured
DEBOUNCE_FOR = 0.01

COUNT = """
local n = redis.call('INCR', KEYS[1])
if n == tonumber(redis.call('GET', KEYS[2]) or '-1') then redis.call('RPUSH', KEYS[3], n) end
return n
"""


@bench.app.task(
    name="bench.debounced_fast",
    base=DebouncedJob,
    debounce_for=DEBOUNCE_FOR,
    debounce_on=("item",),
)
def debounced_fast(item: int, seconds: float = 0.0) -> int:
    return bench._body("DebouncedJob", item, seconds)


_count: list[Any] = []


def _counter() -> Any:
    if not _count:
        _count.append(client(RESULT_DB).register_script(COUNT))
    return _count[0]


def _finished(**kwargs: Any) -> None:
    _counter()(keys=[DONE, TARGET, SIGNAL])


def _started(**kwargs: Any) -> None:
    client(RESULT_DB).incr(STARTED)


if os.environ.get("BENCH_THROUGHPUT") == "1":
    bench.RECORD = False  # the bodies return at once: no run lists, no "finished" list
    task_postrun.connect(_finished, weak=False)
    if os.environ.get("BENCH_COUNT_STARTED") == "1":
        task_prerun.connect(_started, weak=False)
