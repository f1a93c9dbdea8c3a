"""Contention: PROCESSES processes dispatch the same key DISPATCHES times each, all at once,
ROUNDS rounds per contender (contenders interleaved); no worker runs, so every message
published is still in the queue afterwards and is counted there."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.redisutil import broker, clean, queue_length
from benchmarks.settings import QUEUE

PROCESSES = 8
DISPATCHES = 200
ROUNDS = 10


@dataclass(kw_only=True)
class Contention:
    published: list[int] = field(default_factory=list)  # messages per round


def _dispatcher(names: list[str], rounds: int, dispatches: int, barrier: Any) -> None:
    from benchmarks.contenders import all_contenders

    by_name = {c.name: c for c in all_contenders()}
    for round_no in range(rounds):
        for name in names:
            barrier.wait()  # the parent has cleaned up: go
            contender = by_name[name]
            item = 500_000 + round_no
            for _ in range(dispatches):
                contender.dispatch(item)
            barrier.wait()  # all done: the parent counts


def run_contention(
    names: list[str],
    *,
    processes: int = PROCESSES,
    dispatches: int = DISPATCHES,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] = print,
) -> dict[str, Contention]:
    results = {name: Contention() for name in names}
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes + 1, timeout=300)
    workers = [
        ctx.Process(target=_dispatcher, args=(names, rounds, dispatches, barrier), daemon=True)
        for _ in range(processes)
    ]
    clean()
    for proc in workers:
        proc.start()
    try:
        for round_no in range(rounds):
            for name in names:
                barrier.wait()
                barrier.wait()
                results[name].published.append(queue_length())
                clean()
                broker().delete(QUEUE)
            progress(f"  contention: round {round_no + 1}/{rounds}")
    finally:
        for proc in workers:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return results
