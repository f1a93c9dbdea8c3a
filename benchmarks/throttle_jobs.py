"""The job of ``benchmarks.throttle_idle``, imported by the client and by the worker
(``celery worker -I benchmarks.throttle_jobs``): a ThrottledJob with ``concurrency=1`` on one
throttle key (no ``throttle_on``: every call shares the task's key), whose body sleeps the
seconds it is given and records its start and end in server time (Redis ``TIME``) on a list
of the record database, so the client can measure the gaps between runs.
"""

from __future__ import annotations

import json
import os
import time

from benchmarks import app as bench
from dedup_jobs import ThrottledJob

#: the list (RESULT_DB) of runs: JSON {"item", "start", "end", "pid"}, server seconds
RUNS = "throttle_idle:runs"


def server_now() -> float:
    """The Redis server's clock (seconds): one clock for every worker process."""
    seconds, micros = bench.records().time()
    return float(seconds) + float(micros) / 1e6


@bench.app.task(name="bench.throttle_one_at_once", base=ThrottledJob, concurrency=1)
def one_at_once(item: int, seconds: float = 0.0) -> int:
    start = server_now()
    time.sleep(seconds)
    end = server_now()
    bench.records().rpush(
        RUNS, json.dumps({"item": item, "start": start, "end": end, "pid": os.getpid()})
    )
    return item
