"""``python -m benchmarks.table``: every figure of issue 26's table, measured in one run, side
by side with the peers, printed as ONE markdown table (figure | measured | target | met?).

Each part reuses the benchmark that owns the figure, on one Redis that is both broker and
store (``DEDUP_JOBS_BENCH_REDIS``; it flushes databases 9-15 of it):

- ``dispatch`` (``benchmarks.timing``): UniqueJob and DebouncedJob first dispatch against the
  *SET NX PX + plain Celery* reference, DebouncedJob's absorbed dispatch against a raw SET NX;
- ``fused`` (``benchmarks.fused``): UniqueJob's fused first dispatch against plain Celery's
  publish, with the commands MONITOR sees per fused dispatch;
- ``bulk`` (``benchmarks.bulk``): distinct-key dispatches, ``dispatch_many`` against ``delay``;
- ``throughput`` (``benchmarks.throughput``): tiny tasks end to end through a prefork worker,
  every kind and the peers (celery-once, celery-singleton) against plain Celery;
- ``idle`` (``benchmarks.throttle_idle``): a freed ``concurrency=1`` slot's idle time;
- ``throttle`` (``benchmarks.throttle``, in a subprocess: it runs on the tests' settings):
  the ``concurrency=2`` drain against the slots' full rate, store calls and broker messages.

Every ratio is computed from the two figures printed beside it, as printed (rounded first).
Workers are started and stopped by the parts (by process group); nothing is left running.

Run against a Redis of your own:
    DEDUP_JOBS_BENCH_REDIS=redis://127.0.0.1:<port> DEDUP_JOBS_BENCH_QUEUE=<queue> \\
        uv run --group bench python -m benchmarks.table [--quick] [--skip PART ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/table.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks.table_parts import (  # sets Django up
    ROOT,
    Row,
    Sizes,
    bulk_rows,
    dispatch_rows,
    fused_rows,
    idle_rows,
    throttle_rows,
    throughput_rows,
)

PARTS: dict[str, Callable[[Sizes, Callable[[str], None]], list[Row]]] = {
    "dispatch": dispatch_rows,
    "fused": fused_rows,
    "bulk": bulk_rows,
    "throughput": throughput_rows,
    "idle": idle_rows,
    "throttle": throttle_rows,
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true",
                        help="small sizes everywhere: a smoke test (figures are rough)")
    parser.add_argument("--skip", action="append", default=[], choices=list(PARTS),
                        help="leave a part out (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from django.conf import settings

    from benchmarks.redisutil import client

    args = _args(argv)
    sizes = Sizes.quick() if args.quick else Sizes()
    started, load = time.monotonic(), os.getloadavg()[0]

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    rows: list[Row] = []
    for name, part in PARTS.items():
        if name in args.skip:
            continue
        say(f"{name}: ...")
        began = time.monotonic()
        try:
            rows += part(sizes, say)
        except Exception as exc:  # one part failing leaves the others' figures
            say(traceback.format_exc())
            rows.append(Row(f"({name})", f"failed: {type(exc).__name__}: {exc}", "", None))
        say(f"{name}: {time.monotonic() - began:.0f} s")
    server = client(0).info("server")
    commit = _commit()
    print(f"`python -m benchmarks.table{' --quick' if args.quick else ''}"
          f"{''.join(f' --skip {s}' for s in args.skip)}` at {commit}, "
          f"{time.monotonic() - started:.0f} s; Redis {server['redis_version']} at "
          f"{settings.REDIS_URL} (broker and store); {os.cpu_count()} CPUs, load "
          f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
          f"sizes: {sizes.describe()}")
    print()
    print("| figure | measured | target | met? |")
    print("|---|---|---|---|")
    for row in rows:
        print(row.markdown())
    missed = [row for row in rows if row.met is False]
    return 1 if missed else 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
