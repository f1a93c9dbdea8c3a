"""The parts of ``python -m benchmarks.table``: each runs the benchmark that owns a figure of
issue 26's table and returns its rows (figure | measured | target | met?). Every ratio is
computed from the two figures its row prints, rounded as printed."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402

from benchmarks.settings import QUEUE  # noqa: E402
from benchmarks.verdicts import FLOOR_TARGET, LOCK_FLOOR_TARGET, PEERS, PLAIN  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
Say = Callable[[str], None]

FUSED_TARGET = 1.05  # UniqueJob fused first dispatch ÷ plain Celery publish
DEBOUNCED_TARGET = 1.10  # DebouncedJob first dispatch ÷ the SET NX PX + plain reference
BULK_TARGET = 5.0  # dispatch_many's rate ÷ delay's
DRAIN_TARGET = 0.90  # a concurrency=2 drain ÷ the slots' full rate
PER_MESSAGE = 3.0  # store calls, and broker messages, per throttled message
KINDS = ("UniqueJob", "UniqueUntilProcessingJob", "DebouncedJob")


@dataclass(frozen=True)
class Row:
    figure: str
    measured: str
    target: str
    met: bool | None  # None: no target of its own (a peer, a reference)

    def markdown(self) -> str:
        met = "—" if self.met is None else ("yes" if self.met else "**no**")
        return f"| {self.figure} | {self.measured} | {self.target} | {met} |"


@dataclass(kw_only=True)
class Sizes:
    dispatch_rounds: int = 30
    dispatch_batch: int = 100
    fused_batch: int = 500
    fused_rounds: int = 7
    bulk_calls: int = 10_000
    bulk_batch: int = 500
    bulk_rounds: int = 5
    throughput_rounds: int = 5
    throughput_messages: int = 2000
    idle_messages: int = 8
    throttle_messages: int = 1000

    @classmethod
    def quick(cls) -> Sizes:
        return cls(dispatch_rounds=6, dispatch_batch=50, fused_batch=100, fused_rounds=3,
                   bulk_calls=2000, bulk_rounds=2, throughput_rounds=1,
                   throughput_messages=500, idle_messages=4, throttle_messages=200)

    def describe(self) -> str:
        return ", ".join(f"{f.name} {getattr(self, f.name):g}" for f in fields(self))


def frac(a: float, b: float, unit: str, digits: int = 0) -> tuple[str, float]:
    """"a unit / b unit = r", both rounded as printed, and r computed from them."""
    ra, rb = round(a, digits), round(b, digits)
    r = ra / rb if rb else float("nan")
    return f"{ra:,.{digits}f} {unit} / {rb:,.{digits}f} {unit} = {r:.2f}", r


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def dispatch_rows(sizes: Sizes, say: Say) -> list[Row]:
    from benchmarks.contenders import all_contenders, debounced_contender
    from benchmarks.timing import FLOOR, LOCK_FLOOR, time_dispatch

    by_name = {c.name: c for c in all_contenders()}
    debounced = debounced_contender()
    timed = [by_name[PLAIN], by_name["UniqueJob"], *([debounced] if debounced else [])]
    got = time_dispatch(timed, rounds=sizes.dispatch_rounds, batch=sizes.dispatch_batch,
                        progress=say)
    reference = _median(got[LOCK_FLOOR].first)
    text, r = frac(_median(got["UniqueJob"].first), reference, "µs")
    rows = [Row("UniqueJob first dispatch ÷ (SET NX PX + plain publish)", text,
                f"≤ {LOCK_FLOOR_TARGET:.2f} (unchanged or better)", r <= LOCK_FLOOR_TARGET)]
    if debounced is None:
        return [*rows, Row("DebouncedJob", "not measured: the class cannot be built", "", None)]
    text, r = frac(_median(got[debounced.name].first), reference, "µs")
    rows.append(Row("DebouncedJob first dispatch ÷ reference (SET NX PX + plain publish)",
                    text, f"≤ {DEBOUNCED_TARGET:.2f}", r <= DEBOUNCED_TARGET))
    text, r = frac(_median(got[FLOOR].duplicate), _median(got[debounced.name].duplicate), "µs")
    rows.append(Row("DebouncedJob absorbed dispatch, SET NX rate (SET NX ÷ absorbed)",
                    text, f"≥ {FLOOR_TARGET:.2f}", r >= FLOOR_TARGET))
    return rows


def fused_rows(sizes: Sizes, say: Say) -> list[Row]:
    from benchmarks import fused

    got = fused.measure(batch=sizes.fused_batch, rounds=sizes.fused_rounds)
    mid = got.micros
    text, r = frac(mid[fused.FUSED], mid[fused.PLAIN], "µs")
    commands = got.commands[fused.FUSED]
    two, _ = frac(mid[fused.TWO], mid[fused.PLAIN], "µs")
    return [
        Row("UniqueJob first dispatch ÷ plain Celery publish, fused (broker and store one "
            "Redis)", f"{text}; {commands:.2f} commands per dispatch (MONITOR)",
            f"≤ {FUSED_TARGET:.2f}, 1 command", r <= FUSED_TARGET and round(commands, 2) <= 1),
        Row("UniqueJob first dispatch ÷ plain Celery publish, two round trips (kombu's "
            "transport; reference)", two, "—", None),
    ]


def bulk_rows(sizes: Sizes, say: Say) -> list[Row]:
    from benchmarks import bulk

    got = bulk.measure(calls=sizes.bulk_calls, batch=sizes.bulk_batch, rounds=sizes.bulk_rounds)
    n = sizes.bulk_calls
    many = n / _median(got.seconds["UniqueJob, dispatch_many"])
    one = n / _median(got.seconds["UniqueJob, delay"])
    text, _ = frac(many, one, "dispatches/s")
    fused_many = n / _median(got.seconds[bulk.FUSED_MANY])
    fused_one = n / _median(got.seconds[bulk.FUSED_DELAY])
    fused_text, fused_r = frac(fused_many, fused_one, "dispatches/s")
    return [Row(f"{n:,} distinct-key dispatches, fused (one round trip each with `delay`): "
                f"`dispatch_many` (batches of {sizes.bulk_batch}) rate ÷ `delay` rate",
                fused_text, f"≥ {BULK_TARGET:g}", fused_r >= BULK_TARGET),
            Row(f"{n:,} distinct-key dispatches, kombu's own Redis transport (two round trips "
                f"each with `delay`): `dispatch_many` rate ÷ `delay` rate", text, "—", None)]


def throughput_rows(sizes: Sizes, say: Say) -> list[Row]:
    from benchmarks import throughput as tp

    found = tp.contenders()
    n = sizes.throughput_messages
    say(f"  throughput: {sizes.throughput_rounds} rounds x {len(found)} contenders x {n} "
        f"messages, end to end, prefork -c 2")
    got = tp.run_throughput(found, rounds=sizes.throughput_rounds, messages=n, say=say,
                            modes=("end to end",))["end to end"]
    rate = {name: n / _median(r.seconds) for name, r in got.items()}
    figure = f"worker throughput end to end, x plain ({n:,} tiny tasks)"
    peers = {p: frac(rate[p], rate[PLAIN], "tasks/s") for p in PEERS if p in rate}
    best = max(peers, key=lambda p: peers[p][1])
    rows = []
    for kind in KINDS:
        if kind in rate:
            text, r = frac(rate[kind], rate[PLAIN], "tasks/s")
            rows.append(Row(f"{figure}: {kind}", text,
                            f"≥ the best peer ({best} {peers[best][1]:.2f})", r >= peers[best][1]))
    rows += [Row(f"{figure}: peer {p}", text, "(peer)", None) for p, (text, _) in peers.items()]
    return rows


def idle_rows(sizes: Sizes, say: Say) -> list[Row]:
    from benchmarks import throttle_idle

    got = throttle_idle.measure(messages=sizes.idle_messages, say=say)
    gaps, n = got.gaps, got.messages
    if not gaps:
        return [Row("a freed slot (`concurrency=1`) idle while a waiter exists",
                    f"no gap: {len(got.runs)} runs (--quick needs >= 2 messages)", "", None)]
    low, high = min(r.end - r.start for r in got.runs), max(r.end - r.start for r in got.runs)
    measured = (f"median {_median(gaps):.2f} s, max {max(gaps):.2f} s over {len(gaps)} gaps "
                f"(runs of {low:.1f}-{high:.1f} s); {got.store_calls} / {n} = "
                f"{got.store_calls / n:.2f} store calls, {got.published} / {n} = "
                f"{got.published / n:.2f} broker messages per message")
    return [Row("a freed slot (`concurrency=1`) idle while a waiter exists", measured,
                f"≤ {throttle_idle.TARGET:g} s (max)", round(max(gaps), 2) <= throttle_idle.TARGET)]


def throttle_rows(sizes: Sizes, say: Say) -> list[Row]:
    """``benchmarks.throttle``'s ``concurrency=2`` drain, in a subprocess of its own (it runs
    on the tests' settings and Redis databases 9-12 of the same server)."""
    n = sizes.throttle_messages
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "DEDUP_JOBS_TEST_REDIS": settings.REDIS_URL,
           "DEDUP_JOBS_TEST_QUEUE": os.environ.get("DEDUP_JOBS_TEST_QUEUE") or f"{QUEUE}_throttle"}
    env.pop("DEDUP_JOBS_XDIST_REDIS", None)
    say(f"  throttle: concurrency=2 drain of {n} messages (python -m benchmarks.throttle)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "throttle.json"
        cmd = [sys.executable, "-m", "benchmarks.throttle", "--only", "concurrency,plain",
               "--messages", str(n), "--json", str(out)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            printed, _ = proc.communicate(timeout=300 + n * 0.1)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # its worker is stopped by its own finally
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            raise
        if proc.returncode:
            raise RuntimeError(f"benchmarks.throttle exited {proc.returncode}: {printed[-2000:]}")
        data = json.loads(out.read_text())
    row, plain = data["rows"][0], data["rows"][1]
    full = n * float(data["body"]) / 2  # two slots always busy
    text, r = frac(full, row["seconds"], "s", 2)
    plain_text, _ = frac(plain["seconds"], row["seconds"], "s", 2)
    text += f"; plain Celery -c 2 (the practical full rate): {plain_text}"
    calls = row["admissions"] + row["releases"] + row["renewals"] + row["other"]
    published = row["published"]
    return [
        Row(f"throttle `concurrency=2` drain ({n:,} messages of {data['body'] * 1000:g} ms), "
            f"x full rate (full-rate drain s ÷ drain s)", text, f"≥ {DRAIN_TARGET:.2f}",
            r >= DRAIN_TARGET),
        Row("throttle `concurrency=2` drain: store calls, broker messages per message",
            f"{calls:,} / {n:,} = {calls / n:.2f}; {published:,} / {n:,} = {published / n:.2f}",
            f"≤ {PER_MESSAGE:g} and ≤ {PER_MESSAGE:g}",
            round(calls / n, 2) <= PER_MESSAGE and round(published / n, 2) <= PER_MESSAGE),
    ]
