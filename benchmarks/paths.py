"""Worker entry paths: how many times the job body runs when the same job (same key) reaches
the worker a second way while its owner's message is queued or running.

- ``send_task``: by name from a client without the class (no dispatch check can run).
- by-name signature: ``app.signature(name, args).delay()`` in a process that has the class.
- ``chain(job, noop)``: the job as the first link of a chain.
- finished bypass run vs queued owner: the owner's message waits (countdown); a copy sent with
  ``send_task`` reaches the worker and finishes; then the job is dispatched again; then the
  owner runs. A lock that a bypass run releases by key lets that second dispatch through.

The owner is dispatched first with a countdown, so its message waits in the worker (queued,
lock held) while the second copy arrives. A real prefork worker runs throughout. Correct is
1 execution.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery import chain

from benchmarks import app as bench
from benchmarks.contenders import Contender
from benchmarks.redisutil import clean, commandstats
from benchmarks.workers import finished, runs, settle, wait_for, worker

ETA_SECONDS = 2.0


def _send_task(contender: Contender, item: int) -> None:
    bench.app.send_task(contender.task.name, args=(item,))


def _by_name(contender: Contender, item: int) -> None:
    bench.app.signature(contender.task.name, args=(item,)).delay()


def _chain(contender: Contender, item: int) -> None:
    chain(contender.task.s(item), bench.noop.s()).delay()


SECOND_COPY: dict[str, Callable[[Contender, int], None]] = {
    "send_task": _send_task,
    "by-name signature": _by_name,
    "chain(job, noop)": _chain,
}
PATHS = [*SECOND_COPY, "finished bypass vs queued owner"]


def _second_copy(contender: Contender, item: int, second: Callable[[Contender, int], None]) -> int:
    lpush = commandstats()["lpush"]
    contender.task.apply_async((item,), countdown=ETA_SECONDS)  # the queued owner
    second(contender, item)
    time.sleep(ETA_SECONDS)
    settle(lpush)
    return runs(contender.name)


def _bypass(contender: Contender, item: int) -> int:
    lpush = commandstats()["lpush"]
    contender.task.apply_async((item,), countdown=ETA_SECONDS)  # the queued owner
    done = finished()
    bench.app.send_task(contender.task.name, args=(item,))  # the bypass copy
    wait_for(lambda: finished() > done, 20, what=f"{contender.name} bypass finished")
    contender.dispatch(item)  # dispatched again while the owner still waits
    time.sleep(ETA_SECONDS)
    settle(lpush)
    return runs(contender.name)


def run_paths(
    contenders: list[Contender], *, progress: Callable[[str], None] = print
) -> dict[str, dict[str, int]]:
    """Executions of the job body per contender and entry path."""
    results: dict[str, dict[str, int]] = {c.name: {} for c in contenders}
    clean()
    with worker(concurrency=2):
        for index, path in enumerate(PATHS):
            for contender in contenders:
                clean()
                item = 700_000 + index
                if path in SECOND_COPY:
                    count = _second_copy(contender, item, SECOND_COPY[path])
                else:
                    count = _bypass(contender, item)
                results[contender.name][path] = count
            progress(f"  entry paths: {path} done")
    clean()
    return results


def as_rows(results: dict[str, dict[str, int]]) -> list[list[Any]]:
    return [[name, *(per.get(path, "") for path in PATHS)] for name, per in results.items()]
