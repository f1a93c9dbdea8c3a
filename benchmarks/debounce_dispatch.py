"""``python -m benchmarks.debounce_dispatch``: the cost of a DebouncedJob dispatch (issue 26
item 3), beside the floors it is judged by. Prints a table (not a timed test).

Contenders, against one real Redis (broker db 13, store db 14 of DEDUP_JOBS_TEST_REDIS):

- *bare SET NX*: redis-py's ``SET key token NX PX 60000`` on a held key, on the store's own
  django-redis connection (the floor of any one-round-trip decision);
- *reference*: that ``SET NX PX`` on a fresh key, then plain Celery's publish of the same job
  body with ``countdown`` (what a first debounced dispatch does at the least: decide, then
  publish a delayed message);
- *DebouncedJob first dispatch*: a fresh debounce id (starts a burst: one EVALSHA, one
  publish with a countdown);
- *DebouncedJob absorbed*: the held id (a duplicate inside the burst: one EVALSHA, no
  publish).

ROUNDS rounds; in each, BATCH calls of every contender, one of each in turn (each call timed
alone with ``perf_counter``, the turn's order rotating from round to round, the garbage
collector off), then the queue and the store emptied; µs per call is the median over rounds
of each round's median. Ratios: absorbed rate ÷ SET NX rate = SET NX µs ÷ absorbed µs;
first ÷ reference = first µs ÷ reference µs (each also taken round by round: its range and
median; on a shared 2-core machine a round's round trip can be twice another's).
Commands: what the server ran per dispatch (``INFO commandstats`` deltas over 200 calls,
commands inside a script under their own names, the broker's LPUSH included).
``--profile first|absorbed``: cProfile of 20,000 such dispatches instead, top functions by
own time.

Run:
    DEDUP_JOBS_TEST_REDIS=redis://127.0.0.1:6379 uv run python -m benchmarks.debounce_dispatch
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django

django.setup()

from django_redis import get_redis_connection  # noqa: E402

from benchmarks import app as bench  # noqa: E402
from benchmarks.redisutil import client  # noqa: E402
from benchmarks.settings import BROKER_DB, REDIS_URL, STORE_DB  # noqa: E402

#: the countdown of the reference's publish: the debounced job's own debounce_for
COUNTDOWN = 2.0
HELD = 1  # the absorbed dispatches' debounce id (and the held SET NX key)
fresh = count(10_000_000)

SETNX, REFERENCE = "bare SET NX", "reference: SET NX PX + publish with countdown"
FIRST, ABSORBED = "DebouncedJob first dispatch", "DebouncedJob absorbed"


def _contenders() -> dict[str, Callable[[], Any]]:
    store = get_redis_connection("default")
    task, plain = bench.debounced, bench.plain

    def setnx() -> Any:
        return store.set("bench:setnx:held", "owner-token", nx=True, px=60_000)

    def reference() -> Any:
        item = next(fresh)
        store.set(f"bench:setnx:{item}", "owner-token", nx=True, px=60_000)
        return plain.apply_async((item,), countdown=COUNTDOWN)

    return {
        SETNX: setnx,
        REFERENCE: reference,
        FIRST: lambda: task.delay(next(fresh)),
        ABSORBED: lambda: task.delay(HELD),
    }


def _empty() -> None:
    client(BROKER_DB).flushdb()
    client(STORE_DB).flushdb()


def _hold(contenders: dict[str, Callable[[], Any]]) -> None:
    """The held SET NX key and the absorbed dispatches' burst, started afresh."""
    contenders[SETNX]()
    contenders[ABSORBED]()


def _round(contenders: dict[str, Callable[[], Any]], n: int, offset: int) -> dict[str, float]:
    names = list(contenders)
    order = names[offset % len(names):] + names[:offset % len(names)]
    calls = [(name, contenders[name]) for name in order]
    timed: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    gc.disable()
    try:
        for _ in range(n):
            for name, call in calls:
                started = clock()
                call()
                timed[name].append((clock() - started) * 1e6)
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in timed.items()}


def _commands(call: Callable[[], Any], n: int = 200) -> str:
    """Commands the server ran per call (INFO commandstats deltas, our INFO left out)."""
    def stats() -> Counter[str]:
        return Counter({k.removeprefix("cmdstat_"): int(v["calls"])
                        for k, v in client(0).info("commandstats").items()})

    before = stats()
    for _ in range(n):
        call()
    delta = stats() - before
    delta["info"] -= 1
    return ", ".join(f"{k} {v / n:g}" for k, v in sorted(delta.items()) if v >= n / 20)


def _profile(contenders: dict[str, Callable[[], Any]], which: str, n: int) -> None:
    import cProfile
    import pstats

    call = contenders[FIRST if which == "first" else ABSORBED]
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(n):
        call()
        if which == "first" and i % 2000 == 1999:
            client(BROKER_DB).flushdb()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=500, help="calls per round (500)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (9)")
    parser.add_argument("--profile", choices=["first", "absorbed"])
    args = parser.parse_args(argv)
    if bench.debounced is None:
        print(f"DebouncedJob cannot be built: {bench.DEBOUNCED_MISSING}")
        return 1
    contenders = _contenders()
    _empty()
    for call in contenders.values():  # scripts loaded, connections made, caches warm
        call()
    _empty()
    if args.profile:
        _hold(contenders)
        _profile(contenders, args.profile, 20_000)
        _empty()
        return 0
    micros: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        _hold(contenders)
        for name, value in _round(contenders, args.batch, r).items():
            micros[name].append(value)
        _empty()
    _hold(contenders)
    commands = {name: _commands(call) for name, call in contenders.items()}
    _empty()
    mid = {name: statistics.median(values) for name, values in micros.items()}
    print(f"Redis {REDIS_URL} (broker db {BROKER_DB}, store db {STORE_DB}); {args.batch} "
          f"calls of each contender per round, in turns, each timed alone; median of "
          f"{args.rounds} rounds' medians")
    print()
    print("| contender | µs per call | min-max of rounds | server commands per call |")
    print("|---|---|---|---|")
    for name, values in micros.items():
        print(f"| {name} | {mid[name]:.1f} | {min(values):.1f}-{max(values):.1f} | "
              f"{commands[name]} |")
    print()
    rate = mid[SETNX] / mid[ABSORBED]
    rounds = [s / a for s, a in zip(micros[SETNX], micros[ABSORBED], strict=True)]
    print(f"absorbed rate / SET NX rate = SET NX µs / absorbed µs = {mid[SETNX]:.1f} / "
          f"{mid[ABSORBED]:.1f} = {rate:.2f} (round by round {min(rounds):.2f}-{max(rounds):.2f}, "
          f"median {statistics.median(rounds):.2f}; target >= 0.90)")
    first = mid[FIRST] / mid[REFERENCE]
    rounds = [f / r for f, r in zip(micros[FIRST], micros[REFERENCE], strict=True)]
    print(f"first / reference = {mid[FIRST]:.1f} / {mid[REFERENCE]:.1f} = {first:.2f} "
          f"(round by round {min(rounds):.2f}-{max(rounds):.2f}, median "
          f"{statistics.median(rounds):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
