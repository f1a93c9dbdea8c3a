"""Turning the measurements into tables (printed and written to docs/benchmarks.md), the
acceptance verdicts, and the chart (docs/img/benchmarks.png)."""

from __future__ import annotations

import math
import platform
import statistics
import subprocess
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from benchmarks.commands import OPS, OpCount
from benchmarks.contention import Contention
from benchmarks.paths import PATHS
from benchmarks.sigkill import Lifetime
from benchmarks.timing import LOCK_FLOOR, Samples
from benchmarks.verdicts import LATENCY_HEADER, latency_rows, verdicts

ROOT = Path(__file__).resolve().parent.parent
#: the line of docs/benchmarks.md below which the other benchmarks' sections are written by
#: hand (from their own runs); ``python -m benchmarks.peers`` rewrites what is above it
KEEP_BELOW = ("<!-- Written by hand below this line, from the runs of the benchmarks each "
              "section names; python -m benchmarks.peers keeps it. -->")


@dataclass(kw_only=True)
class Results:
    timing: dict[str, Samples]
    rounds: int
    batch: int
    ops: dict[str, dict[str, OpCount]]
    contention: dict[str, Contention]
    processes: int
    dispatches: int
    paths: dict[str, dict[str, int]]
    kills: dict[str, Lifetime]
    lease: float
    window: float
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


WHERE_THE_TIME_GOES = (
    "From profiling the dispatch path (cProfile over 5,000 calls, and single calls of each "
    "variant interleaved in random order over thousands of rounds):\n\n"
    "- *Duplicate dispatch* is one `EVALSHA` whose script runs one `HGET`. The store keeps "
    "its connections between decisions (taken from django-redis's pool, up to 8), packs the "
    "command itself and reads the reply with redis-py's parser, skipping redis-py's "
    "per-command pool checkout (a lock, metrics hooks and a `recv()` poll of the socket). "
    "What is left on our side is the key (positional calls skip `Signature.bind`), a task "
    "id, and the holder's `AsyncResult`, which Celery builds as it would for any result.\n"
    "- *First dispatch* is one `EVALSHA` (five commands inside: `HGET`, `TIME`, `HSET`, "
    "`PEXPIRE`, `ZADD`) and then Celery's own publish with a small header. A trivial script "
    "in its place makes the dispatch cost exactly the *SET NX PX + plain Celery* reference; "
    "each command inside the script adds to the caller's wait, which is why the index of "
    "held locks is trimmed on release and only now and then on acquire.\n"
    "- The ratios move by a few hundredths from run to run on a shared 2-CPU machine (two "
    "contenders with the same dispatch path, UniqueJob and UniqueUntilProcessingJob, show "
    "the spread); the reference rows are measured in the same rounds, so compare against "
    "them."
)


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _us(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0f}"


def ops_rows(r: Results) -> list[list[Any]]:
    rows = []
    for name, ops in r.ops.items():
        rows.append(
            [
                name,
                *(ops[op].describe() if op in ops else "n/a" for op in OPS),
                f"{ops['dispatch'].published:g} / {ops['duplicate'].published:g}",
            ]
        )
    return rows


def contention_rows(r: Results) -> list[list[Any]]:
    rows = []
    for name, c in r.contention.items():
        dupes = sum(max(0, p - 1) for p in c.published)
        rows.append(
            [name, f"{statistics.median(c.published):g}", min(c.published), max(c.published), dupes]
        )
    return rows


def path_rows(r: Results) -> list[list[Any]]:
    return [[name, *(per.get(p, "") for p in PATHS)] for name, per in r.paths.items()]


def kill_rows(r: Results) -> list[list[Any]]:
    return [[name, life.describe(r.window)] for name, life in r.kills.items()]


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def machine(redis_info: dict[str, Any]) -> list[list[Any]]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    rows = [
        ["machine", f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} CPUs"],
        ["Python", platform.python_version()],
        [
            "Redis server",
            f"{redis_info.get('redis_version', '?')} (loopback; broker and store in one server)",
        ],
        ["dedup_jobs", f"commit {_git('rev-parse', '--short', 'HEAD')}"],
    ]
    for package in (
        "celery",
        "kombu",
        "redis",
        "django",
        "django-redis",
        "celery-once",
        "celery-singleton",
    ):
        try:
            rows.append([package, version(package)])
        except PackageNotFoundError:
            rows.append([package, "not installed"])
    return rows


def render(r: Results, redis_info: dict[str, Any], command: str) -> str:
    """The whole docs/benchmarks.md, from one run."""
    parts = [
        "# Benchmarks",
        "",
        "dedup_jobs side by side with plain Celery and its peers "
        "([celery-once](https://pypi.org/project/celery-once/), "
        "[celery-singleton](https://pypi.org/project/celery-singleton/)), "
        "all against **one real Redis that is both the Celery broker and the lock store**, "
        f"in one run of `{command}` ({r.seconds / 60:.1f} min). "
        "Every contender runs the same job body; its key is the `item` argument; every lock "
        "lives 60 s (`unique_for`, celery-once `timeout`, celery-singleton `lock_expiry`); "
        "no result backend. The [budgets](semantics.md#budgets) (store round trips and "
        "broker messages per operation, SPEC section 8) are checked line by line below.",
        "",
        "![benchmark chart](img/benchmarks.png)",
        "",
        "The sections at the end ([metrics on vs off](#metrics), [throttle](#throttle), "
        "[worker throughput](#throughput), [cost growth](#growth)) come from the other "
        "benchmarks under `benchmarks/`, each from a run of its own, as each says.",
        "",
        "## Acceptance",
        "",
        table(
            ["target", "met", "measured"],
            [[t, "yes" if ok else "**NO**", m] for t, ok, m in verdicts(r)],
        ),
        "",
        "## Dispatch latency",
        "",
        f"Median µs per call over {r.rounds} rounds of {r.batch} calls per contender; the "
        "contenders (and the references) take turns inside each round, in an order that "
        "rotates from round to round. *First dispatch*: a key nobody holds (takes the lock "
        "and publishes). *Duplicate*: the key is held (publishes nothing; plain Celery "
        f"publishes again). The reference row *{LOCK_FLOOR}* is one raw `SET key token NX "
        "PX 60000` on the store's own redis-py connection and then plain Celery's publish: "
        "no lock that decides before publishing can be cheaper. The row *raw SET NX PX* is "
        "that `SET` alone: no lock decision can take less than that round trip. **Every "
        "ratio is the ratio of the two medians printed in its row and column** (first "
        "dispatch ÷ plain Celery's, ÷ the reference's; the SET NX rate is the raw SET NX's "
        "duplicate µs ÷ this duplicate µs), followed in brackets by the lowest and highest "
        "value of the same ratio taken round by round: the spread of this run.",
        "",
        table(LATENCY_HEADER, latency_rows(r)),
        "",
        "## Store commands per operation",
        "",
        "Round trips to the store per call (counted on the client in redis-py; a pipeline "
        "would be one) and, in brackets, the commands the server ran, from `INFO "
        "commandstats` deltas. Commands run inside a Lua script are listed under their own "
        "names, so `evalsha 1, hget 1` is one round trip. The broker's share of a publish "
        "(what plain Celery needs: one `LPUSH`) is subtracted. *Worker start* and *finish* "
        "run the real messages through Celery's tracer (the code a worker runs per message), "
        "split where the job body starts. The scripts are in the server's script cache before "
        "counting: a script is loaded once per Redis server, so the first decision after a "
        "restart or `SCRIPT FLUSH` pays one more round trip (`SCRIPT LOAD`) and none after. "
        "Last column: messages published per dispatch / per duplicate.",
        "",
        table(["contender", *OPS, "messages"], ops_rows(r)),
        "",
        "## Contention",
        "",
        f"{r.processes} processes x {r.dispatches} dispatches of one key, all at once, "
        f"{len(next(iter(r.contention.values())).published)} rounds per contender "
        "(interleaved); no worker runs, so every published message is counted in the queue.",
        "",
        table(
            ["contender", "messages per round (median)", "min", "max", "duplicates in all rounds"],
            contention_rows(r),
        ),
        "",
        "## Worker entry paths",
        "",
        "Executions of the job body when a second copy of the job (same key) reaches the "
        "worker while its owner's message is queued (dispatched first with a 2 s countdown). "
        "*send_task*: `app.send_task(name, args)`, as a client without the class sends it. "
        "*by-name signature*: `app.signature(name, args).delay()`. *chain*: `chain(job.s(x), "
        "noop.s()).delay()`. *finished bypass vs queued owner*: a `send_task` copy runs and "
        "finishes, then the job is dispatched again, then the owner runs: a lock released by "
        "key instead of by owner lets that dispatch through. A real prefork worker runs "
        "throughout. Correct is 1; plain Celery shows what happens without a lock.",
        "",
        table(["contender", *PATHS], path_rows(r)),
        "",
        "## Lock lifetime after a SIGKILLed worker",
        "",
        f"The job is running (its body sleeps) when the whole worker (main process and pool) "
        f"gets SIGKILL; the lock key is watched for {r.window:g} s. dedup_jobs runs with "
        f"`LEASE_SECONDS = {r.lease:g}` here (default 60): the lease is renewed every third of "
        f"it while the worker lives, so the lock is gone within that time after a crash. The "
        f"peers keep the lock for its full lifetime (60 s here; celery-singleton has no expiry "
        f"unless `singleton_lock_expiry` is set, celery-once defaults to one hour).",
        "",
        table(["contender", "after SIGKILL"], kill_rows(r)),
        "",
    ]
    parts += ["## Where the time goes", "", WHERE_THE_TIME_GOES, ""]
    if r.notes:
        parts += ["## Notes", "", *(f"- {note}" for note in r.notes), ""]
    parts += [
        "## Machine and versions",
        "",
        table(["", ""], machine(redis_info)),
        "",
        "## Rerun",
        "",
        "```sh",
        "uv sync --group bench",
        "redis-server --port 6390 --daemonize yes --save '' --appendonly no",
        "DEDUP_JOBS_BENCH_REDIS=redis://127.0.0.1:6390 uv run --group bench "
        "python -m benchmarks.peers",
        "```",
        "",
        "Use a Redis that nothing else talks to: command counts are server-wide, and the "
        "benchmark empties its databases 13-15 (broker, store, run records) as it goes. "
        "`--quick` runs fewer rounds; `--no-write` leaves the docs alone; `--help` lists the "
        "rest. Latency depends on the machine and its load; the ratios are the comparable "
        "part.",
        "",
    ]
    return "\n".join(parts)
