"""``python -m benchmarks.throughput``: worker throughput of tiny tasks, plain Celery against
celery-once, celery-singleton and the dedup_jobs kinds, through one real prefork worker
(``-c 2``), one Redis as broker and store; then the lease thread's cost with 1,000 jobs
running at once (threads pool). Prints markdown tables; asserts nothing.

Throughput (``--messages`` 2,000 a round, distinct keys, a body that returns at once; rounds
interleaved, the order rotating from round to round), measured two ways:

- **end to end**: timed from the first publish to the last result, the client publishing
  while the worker consumes (the dispatch cost is in it);
- **drain**: the messages are published first into a staging list no worker reads, then moved
  onto the worker's queue in one ``RENAME``; timed from the ``RENAME`` to the last result (the
  worker side alone).

"The last result" is the worker's ``task_postrun`` bookkeeping call (one EVALSHA per message,
every contender alike: ``benchmarks/throughput_jobs.py``). Worker CPU is user + system time of
the worker's process tree (main process and pool processes, from ``/proc`` via psutil) over
the round, divided by the messages; Redis CPU is the server's, likewise.

Lease cost: ``-P threads -c 1000``, 1,000 messages whose bodies sleep; once all 1,000 run, the
worker process's CPU and the store's EVALSHA calls are counted over a window, UniqueJob (every
job leased, renewed every LEASE_SECONDS / 3) against plain Celery (no lease).

Run against a Redis of your own (it flushes databases 13-15 of it):
    DEDUP_JOBS_BENCH_REDIS=redis://127.0.0.1:<port> DEDUP_JOBS_BENCH_QUEUE=<queue> \\
        uv run python -m benchmarks.throughput [--rounds 5] [--messages 2000] [--skip lease]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/throughput.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import psutil

from benchmarks import throughput_jobs as jobs
from benchmarks.contenders import Contender, all_contenders
from benchmarks.redisutil import client, commandstats
from benchmarks.settings import BROKER_DB, QUEUE, RESULT_DB, STORE_DB
from benchmarks.workers import wait_for, worker

STAGE = f"{QUEUE}_stage"  # a queue no worker reads; moved onto QUEUE by RENAME
WORKER_ENV = {"BENCH_THROUGHPUT": "1"}
LEASE_SECONDS = 3.0  # the benchmark's lease (renewed every second); the default is 60


@dataclass(kw_only=True)
class Rounds:
    seconds: list[float] = field(default_factory=list)
    worker_cpu: list[float] = field(default_factory=list)  # µs per message
    redis_cpu: list[float] = field(default_factory=list)  # µs per message


def contenders() -> list[Contender]:
    found = all_contenders()
    found.append(
        Contender(
            name="DebouncedJob",
            task=jobs.debounced_fast,
            lock_key=lambda i: None,
            family="debounce",
        )
    )
    return found


def tree_cpu(pid: int) -> float:
    """User + system seconds of ``pid`` and its descendants (live ones)."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def redis_pid() -> int:
    return int(client(0).info("server")["process_id"])


def _arm(target: int) -> None:
    results = client(RESULT_DB)
    results.delete(jobs.DONE, jobs.SIGNAL, jobs.STARTED)
    results.set(jobs.TARGET, target)


def _await_last(timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while client(RESULT_DB).blpop([jobs.SIGNAL], timeout=1) is None:  # under socket_timeout
        if time.monotonic() > deadline:
            raise TimeoutError(f"the last result did not come within {timeout}s")


def one_round(
    contender: Contender, items: list[int], *, drain: bool, worker_pid: int, server_pid: int
) -> tuple[float, float, float]:
    """Seconds, worker CPU seconds and Redis CPU seconds of one batch of ``items``."""
    client(STORE_DB).flushdb()
    _arm(len(items))
    if drain:
        for item in items:
            contender.dispatch(item, queue=STAGE)
        if contender.family == "debounce":
            time.sleep(3 * jobs.DEBOUNCE_FOR)  # every message due when it is taken
    cpu0, rcpu0 = tree_cpu(worker_pid), psutil.Process(server_pid).cpu_times()
    started = time.perf_counter()
    if drain:
        client(BROKER_DB).rename(STAGE, QUEUE)
    else:
        for item in items:
            contender.dispatch(item)
    _await_last()
    elapsed = time.perf_counter() - started
    time.sleep(0.05)  # the worker's acks and the pool's result messages after the last body
    rcpu1 = psutil.Process(server_pid).cpu_times()
    return (
        elapsed,
        tree_cpu(worker_pid) - cpu0,
        rcpu1.user + rcpu1.system - rcpu0.user - rcpu0.system,
    )


MODES = {"end to end": False, "drain": True}  # mode: staged first (drain) or not


def run_throughput(
    found: list[Contender],
    *,
    rounds: int,
    messages: int,
    say: Callable[[str], None],
    modes: tuple[str, ...] = tuple(MODES),
) -> dict[str, dict[str, Rounds]]:
    fresh = count(1)
    samples = {mode: {c.name: Rounds() for c in found} for mode in modes}
    server = redis_pid()
    with worker(
        concurrency=2, lease=LEASE_SECONDS, include="benchmarks.throughput_jobs", env=WORKER_ENV
    ) as proc:
        for contender in found:  # warm up: connections, scripts, the pool processes
            for mode in modes:
                one_round(
                    contender,
                    [next(fresh) for _ in range(50)],
                    drain=MODES[mode],
                    worker_pid=proc.pid,
                    server_pid=server,
                )
        for round_no in range(rounds):
            shift = round_no % len(found)
            for contender in found[shift:] + found[:shift]:
                for mode in modes:
                    seconds, wcpu, rcpu = one_round(
                        contender,
                        [next(fresh) for _ in range(messages)],
                        drain=MODES[mode],
                        worker_pid=proc.pid,
                        server_pid=server,
                    )
                    got = samples[mode][contender.name]
                    got.seconds.append(seconds)
                    got.worker_cpu.append(wcpu / messages * 1e6)
                    got.redis_cpu.append(rcpu / messages * 1e6)
            say(f"  throughput: round {round_no + 1}/{rounds}")
    return samples


@dataclass(kw_only=True)
class LeaseRound:
    cpu: float  # worker CPU seconds over the window
    evalsha: int  # store EVALSHA calls over the window
    window: float


def _started() -> int:
    return int(client(RESULT_DB).get(jobs.STARTED) or 0)


def run_lease(
    *, jobs_running: int, window: float, rounds: int, say: Callable[[str], None]
) -> dict[str, list[LeaseRound]]:
    """``jobs_running`` sleeping jobs at once on ``-P threads``: the worker's CPU and the
    store's EVALSHAs over ``window`` seconds, plain Celery against UniqueJob."""
    by_name = {c.name: c for c in all_contenders()}
    pair = [by_name["plain Celery"], by_name["UniqueJob"]]
    sleep = 8.0 + window  # publishing, every job started, a second of renewals, the window
    fresh = count(10_000_000)
    found: dict[str, list[LeaseRound]] = {c.name: [] for c in pair}
    env = {**WORKER_ENV, "BENCH_COUNT_STARTED": "1"}
    with worker(
        pool="threads",
        concurrency=jobs_running,
        lease=LEASE_SECONDS,
        include="benchmarks.throughput_jobs",
        env=env,
    ) as proc:
        for round_no in range(rounds):
            for contender in pair if round_no % 2 == 0 else pair[::-1]:
                client(STORE_DB).flushdb()
                _arm(jobs_running)
                for _ in range(jobs_running):
                    contender.task.apply_async((next(fresh),), {"seconds": sleep})
                wait_for(
                    lambda: _started() >= jobs_running, 60, interval=0.05, what="every job running"
                )
                time.sleep(LEASE_SECONDS / 3 + 0.5)  # every lease renewed once already
                cpu0, calls0 = tree_cpu(proc.pid), commandstats()["evalsha"]
                t0 = time.perf_counter()
                time.sleep(window)
                cpu1, calls1 = tree_cpu(proc.pid), commandstats()["evalsha"]
                found[contender.name].append(
                    LeaseRound(
                        cpu=cpu1 - cpu0, evalsha=calls1 - calls0, window=time.perf_counter() - t0
                    )
                )
                _await_last(timeout=sleep + 60)
                say(f"  lease: round {round_no + 1}/{rounds}, {contender.name}")
    return found


def _median(values: list[float]) -> float:
    return statistics.median(values)


def paired(got: dict[str, Rounds], name: str) -> list[float]:
    """Per round: plain's seconds / ``name``'s seconds (the two ran in the same round)."""
    plain = got["plain Celery"].seconds
    return [p / c for p, c in zip(plain, got[name].seconds, strict=True)]


def throughput_table(mode: str, got: dict[str, Rounds], messages: int) -> list[str]:
    plain = _median(got["plain Celery"].seconds)
    lines = [
        f"| contender ({mode}, {messages:,} messages) | median s | tasks/s | min-max s | "
        f"x plain (ratio of medians) | x plain per round, median (min-max) | "
        f"worker CPU µs/task | Redis CPU µs/task |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in got.items():
        median = _median(r.seconds)
        rounds = paired(got, name)
        lines.append(
            f"| {name} | {median:.3f} | {messages / median:,.0f} | {min(r.seconds):.3f}-"
            f"{max(r.seconds):.3f} | {plain / median:.2f} | {_median(rounds):.2f} "
            f"({min(rounds):.2f}-{max(rounds):.2f}) | {_median(r.worker_cpu):,.0f} | "
            f"{_median(r.redis_cpu):,.0f} |"
        )
    return lines


def target_line(mode: str, got: dict[str, Rounds], messages: int) -> str:
    plain, unique = _median(got["plain Celery"].seconds), _median(got["UniqueJob"].seconds)
    ratio = plain / unique
    rounds = paired(got, "UniqueJob")
    return (
        f"- target UniqueJob ≥ 0.95 x plain throughput ({mode}): "
        f"{messages / unique:,.0f} / {messages / plain:,.0f} tasks/s = {ratio:.2f}: "
        f"**{'yes' if ratio >= 0.95 else 'no'}** (per round: median {_median(rounds):.2f}, "
        f"{sum(r >= 0.95 for r in rounds)} of {len(rounds)} rounds ≥ 0.95)"
    )


def lease_table(found: dict[str, list[LeaseRound]], jobs_running: int) -> list[str]:
    lines = [
        f"| {jobs_running:,} jobs running (threads pool) | worker CPU % of a core, median "
        f"(min-max) | store EVALSHA/s, median (min-max) |",
        "|---|---|---|",
    ]
    for name, rounds in found.items():
        cpu = [r.cpu / r.window * 100 for r in rounds]
        calls = [r.evalsha / r.window for r in rounds]
        lines.append(
            f"| {name} | {_median(cpu):.1f} ({min(cpu):.1f}-{max(cpu):.1f}) | "
            f"{_median(calls):,.0f} ({min(calls):,.0f}-{max(calls):,.0f}) |"
        )
    plain = _median([r.cpu / r.window for r in found["plain Celery"]])
    unique = _median([r.cpu / r.window for r in found["UniqueJob"]])
    renewals = _median([r.evalsha / r.window for r in found["UniqueJob"]])
    if renewals:
        lines.append("")
        lines.append(
            f"- lease thread: ({unique * 100:.1f} - {plain * 100:.1f}) % of a core for "
            f"{renewals:,.0f} renewals/s = {(unique - plain) / renewals * 1e6:,.0f} µs of "
            f"worker CPU per renewal (LEASE_SECONDS={LEASE_SECONDS:g}: each lease renewed "
            f"every {LEASE_SECONDS / 3:g} s; at the default 60, 20 times less often)"
        )
    return lines


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (default 5)")
    parser.add_argument("--messages", type=int, default=2000, help="per round (default 2000)")
    parser.add_argument("--lease-jobs", type=int, default=1000, help="default 1000")
    parser.add_argument("--lease-window", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--lease-rounds", type=int, default=2, help="default 2")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["throughput", "lease"],
        help="leave a part out",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)

    def say(text: str) -> None:
        print(text, flush=True)

    say(
        f"Redis {client(0).connection_pool.connection_kwargs.get('host')}:"
        f"{client(0).connection_pool.connection_kwargs.get('port')}, queue {QUEUE}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    for db in (BROKER_DB, STORE_DB, RESULT_DB):
        client(db).flushdb()
    out: list[str] = []
    if "throughput" not in args.skip:
        found = contenders()
        say(
            f"throughput: {args.rounds} rounds x {len(found)} contenders x 2 modes x "
            f"{args.messages} messages, prefork -c 2"
        )
        samples = run_throughput(found, rounds=args.rounds, messages=args.messages, say=say)
        for mode, got in samples.items():
            out += [
                "",
                *throughput_table(mode, got, args.messages),
                "",
                target_line(mode, got, args.messages),
            ]
    if "lease" not in args.skip:
        say(f"lease: {args.lease_jobs} jobs at once, -P threads, {args.lease_rounds} rounds")
        found_lease = run_lease(
            jobs_running=args.lease_jobs,
            window=args.lease_window,
            rounds=args.lease_rounds,
            say=say,
        )
        out += ["", *lease_table(found_lease, args.lease_jobs)]
    say("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
