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
from benchmarks.timing import FLOOR, LOCK_FLOOR, Samples, paired_ratio

ROOT = Path(__file__).resolve().parent.parent
PLAIN = "plain Celery"
PEERS = ("celery-once", "celery-singleton")
FIRST_TARGET = 1.30  # UniqueJob first dispatch at most this many times plain Celery
FLOOR_TARGET = 0.85  # UniqueJob duplicate at least this fraction of the SET NX rate


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


def latency_rows(r: Results) -> list[list[Any]]:
    plain, floor = r.timing[PLAIN], r.timing[FLOOR]
    rows = []
    for name, s in r.timing.items():
        if name in (FLOOR, LOCK_FLOOR):
            continue
        first_ratio = paired_ratio(s.first, plain.first)
        rate = paired_ratio(floor.duplicate, s.duplicate)
        rows.append(
            [
                name,
                _us(Samples.median(s.first)),
                f"{first_ratio:.2f}x",
                _us(Samples.median(s.duplicate)),
                "publishes again" if name == PLAIN else f"{rate:.2f}x",
            ]
        )
    if LOCK_FLOOR in r.timing:
        lock_floor = r.timing[LOCK_FLOOR]
        rows.append(
            [
                f"*reference: {LOCK_FLOOR}*",
                _us(Samples.median(lock_floor.first)),
                f"{paired_ratio(lock_floor.first, plain.first):.2f}x",
                "—",
                "—",
            ]
        )
    rows.append(
        [
            f"*reference: {FLOOR}*",
            _us(Samples.median(floor.first)),
            "—",
            _us(Samples.median(floor.duplicate)),
            "1.00x",
        ]
    )
    return rows


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


def peer_lines(r: Results) -> dict[str, tuple[bool, str]]:
    """Per dedup_jobs contender: does it beat the best peer on both timing lines, and the
    figures (ratios from the same rounds)."""
    plain, floor = r.timing[PLAIN], r.timing[FLOOR]
    peers = [name for name in r.timing if name in PEERS]
    if not peers:
        return {}
    best_first = min(paired_ratio(r.timing[p].first, plain.first) for p in peers)
    best_rate = max(paired_ratio(floor.duplicate, r.timing[p].duplicate) for p in peers)
    lines = {}
    for name, s in r.timing.items():
        if not name.startswith(("Unique", "Debounced")):
            continue
        first = paired_ratio(s.first, plain.first)
        rate = paired_ratio(floor.duplicate, s.duplicate)
        lines[name] = (
            first < best_first and rate > best_rate,
            f"first {first:.2f}x (best peer {best_first:.2f}x), "
            f"duplicate {rate:.2f}x (best peer {best_rate:.2f}x)",
        )
    return lines


def verdicts(r: Results) -> list[tuple[str, bool, str]]:
    """(target, met, measured) for every acceptance line."""
    unique, plain, floor = r.timing["UniqueJob"], r.timing[PLAIN], r.timing[FLOOR]
    first = paired_ratio(unique.first, plain.first)
    rate = paired_ratio(floor.duplicate, unique.duplicate)
    out = [
        (
            f"UniqueJob first dispatch <= {FIRST_TARGET:.2f}x plain Celery",
            first <= FIRST_TARGET,
            f"{first:.2f}x"
            + (
                f" (a bare SET NX PX before the same publish: "
                f"{paired_ratio(r.timing[LOCK_FLOOR].first, plain.first):.2f}x)"
                if LOCK_FLOOR in r.timing
                else ""
            ),
        ),
        (
            f"UniqueJob duplicate >= {FLOOR_TARGET:.2f}x the SET NX rate",
            rate >= FLOOR_TARGET,
            f"{rate:.2f}x ({_us(Samples.median(unique.duplicate))} µs vs "
            f"{_us(Samples.median(floor.duplicate))} µs)",
        ),
    ]
    for name, line in peer_lines(r).items():
        if name.startswith("Unique"):
            out.append((f"{name}: leads every peer on first and duplicate dispatch", *line))
    for name, ops in r.ops.items():
        if not name.startswith(("Unique", "Debounced")):
            continue
        trips = {op: ops[op].round_trips for op in OPS if op in ops}
        budget_ok = all(t <= 1 for t in trips.values())
        out.append(
            (
                f"{name}: <= 1 store round trip per decision (SPEC 8)",
                budget_ok,
                ", ".join(f"{op} {t:g}" for op, t in trips.items()),
            )
        )
        published = ops["dispatch"].published, ops["duplicate"].published
        if name.startswith("Unique"):
            out.append(
                (
                    f"{name}: 1 message per dispatch, 0 per duplicate (SPEC 8)",
                    published == (1, 0),
                    f"{published[0]:g} / {published[1]:g}",
                )
            )
    for name, c in r.contention.items():
        if name.startswith("Unique"):
            dupes = sum(max(0, p - 1) for p in c.published)
            out.append(
                (
                    f"{name}: 0 duplicates under contention",
                    dupes == 0 and all(p == 1 for p in c.published),
                    f"{dupes} duplicates",
                )
            )
    for name, per in r.paths.items():
        if name.startswith("Unique"):
            ok = all(v == 1 for v in per.values())
            out.append(
                (
                    f"{name}: 1 execution on every entry path",
                    ok,
                    ", ".join(f"{k} {v}" for k, v in per.items()),
                )
            )
    for name, life in r.kills.items():
        if name == "UniqueJob":
            ok = life.gone_after is not None and life.gone_after <= r.lease + 0.5
            out.append(
                (
                    f"{name}: lock gone within LEASE_SECONDS ({r.lease:g} s) of a SIGKILL",
                    ok,
                    life.describe(r.window),
                )
            )
    return out


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
        "contenders (and the floor) take turns inside each round, in an order that rotates "
        "from round to round, and ratios are medians of the per-round ratios. *First "
        "dispatch*: a key nobody holds (takes the lock and publishes). The reference row "
        f"*{LOCK_FLOOR}* is one raw `SET NX PX` and then plain Celery's publish: no lock "
        "that decides before publishing can be cheaper. *Duplicate*: the key "
        "is held (publishes nothing; plain Celery publishes again). The floor is one "
        "`SET key token NX PX 60000` on the store's own redis-py connection: a lock decision "
        "cannot take less than that round trip. *Rate vs SET NX* is floor µs ÷ duplicate µs.",
        "",
        table(
            ["contender", "first dispatch µs", "x plain Celery", "duplicate µs", "rate vs SET NX"],
            latency_rows(r),
        ),
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
