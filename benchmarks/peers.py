"""``python -m benchmarks.peers``: dedup_jobs side by side with plain Celery, celery-once and
celery-singleton, against one real Redis (broker and store), in one run.

Prints the tables, writes docs/benchmarks.md and docs/img/benchmarks.png (unless --no-write)
and exits non-zero if an acceptance target is missed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("--rounds", type=int, default=30, help="timing rounds (default 30)")
    parser.add_argument("--batch", type=int, default=100, help="calls per batch (default 100)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="few rounds everywhere, for a smoke test (numbers are rough)",
    )
    parser.add_argument(
        "--no-write",
        action="store_true",
        help="print only; leave docs/benchmarks.md and the chart alone",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["timing", "commands", "contention", "paths", "sigkill"],
        help="leave a section out (repeatable)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    started = time.monotonic()
    # Imported here: benchmarks.app sets up Django (spawned processes import this module).
    from django.conf import settings

    from benchmarks import app as bench
    from benchmarks import report, verdicts
    from benchmarks.commands import count_operations
    from benchmarks.contenders import (
        all_contenders,
        debounced_contender,
        django_cache_contender,
    )
    from benchmarks.contention import DISPATCHES, PROCESSES, ROUNDS, run_contention
    from benchmarks.paths import run_paths
    from benchmarks.redisutil import clean, client
    from benchmarks.settings import REDIS_URL
    from benchmarks.sigkill import run_sigkill
    from benchmarks.timing import time_dispatch

    def say(text: str) -> None:
        print(text, flush=True)

    rounds, batch = (6, 50) if args.quick else (args.rounds, args.batch)
    lease = float(settings.DEDUP_JOBS["LEASE_SECONDS"])
    window = 3 * lease
    contenders = all_contenders()
    notes = []
    debounced = debounced_contender()
    if debounced is None:
        notes.append(
            f"DebouncedJob is not measured: this build refuses to create one "
            f"({bench.DEBOUNCED_MISSING}). It is measured (dispatch latency and store "
            f"commands) as soon as the class can be built."
        )
        say(f"DebouncedJob: NOT MEASURED ({bench.DEBOUNCED_MISSING})")
    else:
        notes.append(
            "DebouncedJob: *first dispatch* starts a burst (its debounce state and one delayed "
            "message); *duplicate* is a dispatch inside a running burst (supersedes the "
            "previous arguments, publishes nothing). Its worker side and D6 (10,000 "
            "dispatches, a bounded handful of messages) are measured by `python -m "
            "benchmarks.debounce`. It is left out of contention, entry paths and SIGKILL, "
            "which are about locks."
        )
    timed = [*contenders, django_cache_contender(), *([debounced] if debounced else [])]
    say(f"Redis {REDIS_URL} (broker db {settings.BROKER_DB}, store db {settings.STORE_DB})")
    client(0).ping()
    clean()

    results = report.Results(
        timing={},
        rounds=rounds,
        batch=batch,
        ops={},
        contention={},
        processes=PROCESSES,
        dispatches=DISPATCHES,
        paths={},
        kills={},
        lease=lease,
        window=window,
        notes=notes,
    )
    if "timing" not in args.skip:
        say(f"dispatch latency: {rounds} rounds x {batch} calls")
        results.timing = time_dispatch(timed, rounds=rounds, batch=batch, progress=say)
    if "commands" not in args.skip:
        say("store commands per operation")
        results.ops = count_operations(timed)
    if "contention" not in args.skip:
        c_rounds = 3 if args.quick else ROUNDS
        say(f"contention: {PROCESSES} processes x {DISPATCHES} dispatches x {c_rounds} rounds")
        results.contention = run_contention(
            [c.name for c in contenders], rounds=c_rounds, progress=say
        )
    if "paths" not in args.skip:
        say("worker entry paths")
        results.paths = run_paths(contenders, progress=say)
    if "sigkill" not in args.skip:
        say(f"lock lifetime after SIGKILL (LEASE_SECONDS={lease:g}, watched {window:g} s)")
        results.kills = run_sigkill(contenders, lease=lease, window=window, progress=say)
    if results.timing and debounced is not None:
        lines = verdicts.peer_lines(results)
        if debounced.name in lines:
            leads, figures = lines[debounced.name]
            notes.append(
                f"DebouncedJob against the peers ({figures}): "
                + (
                    "it leads both."
                    if leads
                    else "a debounced first dispatch stores the call's arguments, schedules "
                    "its message with a countdown (Celery computes an eta) and keeps a burst "
                    "record for the admin, where a peer sets one string key; it is compared "
                    "here for scale, not as the same operation."
                )
            )
    results.seconds = time.monotonic() - started
    return _finish(results, args, client(0).info("server"))


def _finish(results: object, args: argparse.Namespace, redis_info: dict[str, object]) -> int:
    from benchmarks import chart, report, verdicts

    r: report.Results = results  # type: ignore[assignment]
    complete = not args.skip
    command = "python -m benchmarks.peers" + (" --quick" if args.quick else "")
    if complete:
        text = report.render(r, redis_info, command)
        print("\n" + text)
        failed = [t for t, ok, _ in verdicts.verdicts(r) if not ok]
    else:
        if r.timing:
            print("\n" + report.table(verdicts.LATENCY_HEADER, verdicts.latency_rows(r)))
            for target, ok, measured in verdicts.verdicts(r):
                print(f"- {'yes' if ok else 'NO '} {target}: {measured}")
        if r.ops:
            print("\n" + report.table(["contender", *report.OPS, "messages"], report.ops_rows(r)))
        print("(sections skipped: no acceptance verdict, nothing written)")
        failed = []
    if complete and not args.no_write:
        (report.ROOT / "docs").mkdir(exist_ok=True)
        page = report.ROOT / "docs" / "benchmarks.md"
        # the hand-written sections of the other benchmarks, below the marker, are kept
        old = page.read_text() if page.exists() else ""
        kept = old[old.index(report.KEEP_BELOW):] if report.KEEP_BELOW in old else ""
        page.write_text(text.rstrip("\n") + "\n\n" + (kept or report.KEEP_BELOW + "\n"))
        chart.draw(r, report.ROOT / "docs" / "img" / "benchmarks.png")
        print("wrote docs/benchmarks.md and docs/img/benchmarks.png")
    for target in failed:
        print(f"MISSED: {target}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
