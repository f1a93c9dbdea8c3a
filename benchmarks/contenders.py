"""The contenders: plain Celery, celery-once, celery-singleton and the dedup_jobs job kinds,
each the same job body, with a way to dispatch it and to find its lock in Redis."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import app as bench


@dataclass(frozen=True, kw_only=True)
class Contender:
    name: str
    task: Any
    #: the Redis key (store database) of the lock for ``item``; None if there is no lock
    lock_key: Callable[[int], str | None]
    #: "plain", "peer", "dedup" (the unique kinds) or "debounce"
    family: str
    #: does the lock live while the job runs (False: released when the worker takes it)
    held_while_running: bool = True

    def dispatch(self, item: int, **options: Any) -> Any:
        return self.task.apply_async((item,), **options)


def _no_lock(item: int) -> None:
    return None


def _once_key(item: int) -> str:
    return str(bench.once.get_key((item,), {}))


def _singleton_key(item: int) -> str:
    return str(bench.singleton.generate_lock(bench.singleton.name, [item], {}))


def _dedup_key(task: Any) -> Callable[[int], str]:
    def key(item: int) -> str:
        return str(task.store().physical(task.job_key((item,), {}).key))

    return key


def all_contenders() -> list[Contender]:
    found = [
        Contender(name="plain Celery", task=bench.plain, lock_key=_no_lock, family="plain"),
        Contender(name="celery-once", task=bench.once, lock_key=_once_key, family="peer"),
        Contender(
            name="celery-singleton", task=bench.singleton, lock_key=_singleton_key, family="peer"
        ),
        Contender(
            name="UniqueJob", task=bench.unique, lock_key=_dedup_key(bench.unique), family="dedup"
        ),
        Contender(
            name="UniqueUntilProcessingJob",
            task=bench.until_processing,
            lock_key=_dedup_key(bench.until_processing),
            family="dedup",
            held_while_running=False,
        ),
    ]
    return found


def debounced_contender() -> Contender | None:
    if bench.debounced is None:
        return None
    return Contender(
        name="DebouncedJob",
        task=bench.debounced,
        lock_key=_dedup_key(bench.debounced),
        family="debounce",
    )


#: the UniqueJob contender whose store is Django's own RedisCache (timed beside the others)
DJANGO_CACHE = "UniqueJob on Django's RedisCache"


def django_cache_contender() -> Contender:
    return Contender(
        name=DJANGO_CACHE,
        task=bench.unique_django_cache,
        lock_key=_dedup_key(bench.unique_django_cache),
        family="dedup",
    )
