"""The demo's throttling part (``python manage.py demo``, part 6): a ThrottledJob limited to
2 starts per second per supplier, 6 calls for one supplier and 1 for another, all at once.
It prints what it observed: each run's start (Celery's task_prerun of the delivery that
ran) and each deferral (dedup_jobs' job_deferred, with the time the store gave it)."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery.signals import task_prerun

from dedup_jobs.signals import job_deferred
from example_project.shop import tasks

CALLS = 6


def part_throttle(command: Any) -> None:
    """Run the part; ``command`` is the demo command (say/figures/problems)."""
    task = tasks.sync_supplier_stock
    command.say(command.style.MIGRATE_HEADING(
        f"6. ThrottledJob: sync_supplier_stock starts at most {task.throttle} per supplier"))
    command.say(f"   {CALLS} calls of sync_supplier_stock('acme', ...) and 1 of "
                f"sync_supplier_stock('globex'), all at once:")
    lock = threading.Lock()
    started: dict[str, float] = {}
    deferred: dict[str, float] = {}

    def on_start(task_id: str = "", sender: Any = None, **_kw: Any) -> None:
        if getattr(sender, "name", "") == task.name:
            with lock:  # a deferred delivery starts too (then ends at once): keep the last
                started[task_id] = time.monotonic()

    def on_deferred(task_id: str = "", until: float = 0.0, **_kw: Any) -> None:
        with lock:
            deferred[task_id] = until - time.time()

    task_prerun.connect(on_start, weak=False, dispatch_uid="demo-throttle-start")
    job_deferred.connect(on_deferred, weak=False, dispatch_uid="demo-throttle-deferred")
    try:
        t0 = time.monotonic()
        acme = [task.delay("acme", sku=f"MUG-{n}") for n in range(1, CALLS + 1)]
        globex = task.delay("globex", sku="MUG-1")
        done = [r.get(timeout=30) for r in [*acme, globex]]
    except Exception as exc:
        command.problems.append(f"sync_supplier_stock did not finish: {exc!r}")
        return
    finally:
        task_prerun.disconnect(dispatch_uid="demo-throttle-start")
        job_deferred.disconnect(dispatch_uid="demo-throttle-deferred")
    rows = sorted((started[r.id] - t0, supplier, r.id) for r, supplier in
                  [*((r, "acme") for r in acme), (globex, "globex")] if r.id in started)
    for at, supplier, task_id in rows:
        note = (f" (deferred once, {deferred[task_id]:.2f}s)" if task_id in deferred
                else "")
        command.say(f"   +{at:.3f}s  {supplier:<6} run started, task {task_id[:8]}{note}")
    acme_starts = sorted(at for at, supplier, _ in rows if supplier == "acme")
    busiest = max(sum(1 for s in acme_starts if first <= s < first + 1.0)
                  for first in acme_starts)
    command.say("")
    command.figures(f"dispatched {len(done)}, ran {len(rows)}, deferred {len(deferred)} "
                    f"(published again, same task id), most acme starts in any 1 s: {busiest}")
    if busiest > 2 or len(rows) != len(done):
        command.problems.append(f"sync_supplier_stock: {busiest} starts in 1 s, "
                                f"{len(rows)} of {len(done)} ran")
    command.say("")


def part_limits_per_call(command: Any) -> None:
    """Part 6b (L1): ExportReport's concurrency() returns 1 for a "free" account and None (no
    limit) for a "vip" one. 3 exports of the vip account at once run side by side (as far as
    the worker's 2 threads allow), none waiting for a slot; then 3 exports of the free
    account at once run one at a time, the others waiting (deferred, never dropped)."""
    task = tasks.export_report
    command.say(command.style.MIGRATE_HEADING(
        "6b. Limits per call: export_report's concurrency() is 1 on the free plan, None "
        "(no limit) on vip"))
    command.say("   3 exports for account 'bob' (vip) at once, then 3 for 'ada' (free) at once:")
    deferred: set[str] = set()

    def on_deferred(task_id: str = "", **_kw: Any) -> None:
        deferred.add(task_id)

    job_deferred.connect(on_deferred, weak=False, dispatch_uid="demo-per-plan-deferred")
    t0 = time.time()
    runs: list[tuple[str, str, float, float]] = []
    try:
        for account, plan in (("bob", "vip"), ("ada", "free")):
            calls = [task.delay(account, plan, n) for n in range(3)]
            runs += [(plan, r.id, *r.get(timeout=60)) for r in calls]
    except Exception as exc:
        command.problems.append(f"export_report did not finish: {exc!r}")
        return
    finally:
        job_deferred.disconnect(dispatch_uid="demo-per-plan-deferred")
    for plan, task_id, start, end in sorted(runs, key=lambda run: run[2]):  # by start
        note = " (waited for the free slot)" if task_id in deferred else ""
        command.say(f"   +{start - t0:.2f}s to +{end - t0:.2f}s  {plan:<4} export, task "
                    f"{task_id[:8]}{note}")
    # the most runs of a plan under way at one moment (at some run's start)
    most = {plan: max(sum(1 for p, _i, s, e in runs if p == plan and s <= start < e)
                      for p0, _i0, start, _end in runs if p0 == plan)
            for plan in ("free", "vip")}
    waited = {plan: sum(1 for p, task_id, *_ in runs if p == plan and task_id in deferred)
              for plan in ("free", "vip")}
    command.say("")
    command.figures(f"vip: most at once {most['vip']}, waited for a slot {waited['vip']}; "
                    f"free: most at once {most['free']}, waited for a slot {waited['free']}")
    if most["vip"] < 2 or waited["vip"] or most["free"] != 1 or not waited["free"]:
        command.problems.append(f"export_report: vip at once {most['vip']}, waited "
                                f"{waited['vip']}; free at once {most['free']}, waited "
                                f"{waited['free']}")
    command.say("")
