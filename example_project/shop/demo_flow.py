"""The demo's flow-control parts (SPEC R1, R2): ``on_duplicate = "replace"`` and
``without_overlapping``, printed from signals and the database like the other parts.

``python manage.py demo`` calls :func:`run_parts` after its own parts; each part prints what
the signals (``unique_job_replaced``, ``job_deferred``, Celery's publish/prerun/postrun) and
the database (``Product.price``/``reprice_runs``, the ``StockSync`` rows) say happened.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dedup_jobs.signals import job_deferred, unique_job_replaced
from example_project.shop import tasks
from example_project.shop.demo_timeline import (
    FINISHED,
    PUBLISHED,
    RELEASED,
    SKIPPED,
    STARTED,
    Event,
    describe,
    short,
)
from example_project.shop.models import Product, StockSync

#: part "replace": the prices the feed sends, and the countdown each dispatch waits
PRICES = ("12.90", "13.10", "12.75", "13.40", "13.25")
TICK = 0.5
#: part "without_overlapping": the warehouse, and triggers sent while the first sync runs
WAREHOUSE = "main"
TRIGGERS_DURING_RUN = 3

REPLACED = "replaced"
DEFERRED = "deferred"


@dataclass(frozen=True, kw_only=True)
class FlowEvent:
    at: float  # time.monotonic()
    kind: str  # REPLACED (task_id: the replaced one, detail: by whom) or DEFERRED
    task_name: str
    task_id: str
    detail: str = ""


class FlowSignals:
    """Records ``unique_job_replaced`` and ``job_deferred`` of the given task names."""

    def __init__(self, task_names: set[str]) -> None:
        self.task_names = task_names
        self.events: list[FlowEvent] = []
        self._lock = threading.Lock()

    def _add(self, kind: str, sender: Any, task_id: str, detail: str) -> None:
        if sender.name in self.task_names:
            with self._lock:
                self.events.append(FlowEvent(at=time.monotonic(), kind=kind,
                                             task_name=sender.name, task_id=task_id,
                                             detail=detail))

    def _on_replaced(self, sender: Any, replaced_id: str, by_id: str, **kwargs: Any) -> None:
        self._add(REPLACED, sender, replaced_id, by_id)

    def _on_deferred(self, sender: Any, task_id: str, until: float, **kwargs: Any) -> None:
        self._add(DEFERRED, sender, task_id, f"{max(0.0, until - time.time()):.1f}")

    def __enter__(self) -> FlowSignals:
        unique_job_replaced.connect(self._on_replaced, weak=False, dispatch_uid="demo.replaced")
        job_deferred.connect(self._on_deferred, weak=False, dispatch_uid="demo.deferred")
        return self

    def __exit__(self, *exc_info: object) -> None:
        unique_job_replaced.disconnect(dispatch_uid="demo.replaced")
        job_deferred.disconnect(dispatch_uid="demo.deferred")

    def of(self, task_name: str, since: float, kind: str) -> list[FlowEvent]:
        with self._lock:
            return [e for e in self.events
                    if e.task_name == task_name and e.at >= since and e.kind == kind]


def lines(events: list[Event], flow: list[FlowEvent], t0: float,
          names: dict[str, str]) -> list[str]:
    """The timeline of one part: Celery's and dedup_jobs' events, oldest first; ``names``
    labels task ids (e.g. "price 13.40")."""

    def label(task_id: str) -> str:
        return f"{short(task_id)} ({names[task_id]})" if task_id in names else short(task_id)

    deferrals = [item for item in flow if item.kind == DEFERRED]

    def deferred_at_once(started: Event) -> bool:
        """A worker took the message only to find a run of its key in progress."""
        return any(d.task_id == started.task_id and 0 <= d.at - started.at < 0.2
                   for d in deferrals)

    shown: list[tuple[float, str]] = []
    published: set[str] = set()
    for event in events:
        if event.kind == FINISHED and event.detail.startswith("IGNORED"):
            continue  # a message that waits or was replaced: its own line says so
        if event.kind == STARTED and deferred_at_once(event):
            continue  # the deferral's line says so
        if event.kind == SKIPPED:
            text = f"dispatch deduplicated onto the waiting task {label(event.task_id)}"
        elif event.kind == PUBLISHED and event.task_id in published:
            text = f"task {label(event.task_id)} re-published to wait (same task id)"
        else:
            text = describe(event).replace(short(event.task_id), label(event.task_id), 1)
        if event.kind == PUBLISHED:
            published.add(event.task_id)
        shown.append((event.at, text))
    for item in flow:
        if item.kind == REPLACED:
            text = (f"task {label(item.task_id)} replaced by task {label(item.detail)} "
                    f"(unique_job_replaced): its result REVOKED, it never runs")
        else:
            text = (f"task {label(item.task_id)} reached a worker during a run of its key: "
                    f"waits {item.detail}s (job_deferred, reason 'overlap'), keeps its lock")
        shown.append((item.at, text))
    return [f"+{at - t0:.3f}s  {text}" for at, text in sorted(shown, key=lambda s: s[0])]


def run_parts(command: Any, first_number: int) -> None:
    """The flow-control parts, numbered from ``first_number``, printed through ``command``
    (the demo: its ``say``/``figures``/``problems`` and its running ``timeline``)."""
    command.timeline.task_names |= {tasks.reprice_product.name, tasks.sync_stock.name}
    clear_leftovers(command)
    with FlowSignals({tasks.reprice_product.name, tasks.sync_stock.name}) as flow:
        part_replace(command, flow, first_number)
        part_without_overlapping(command, flow, first_number + 1)


def clear_leftovers(command: Any) -> None:
    """An interrupted earlier demo may have left a lock (or a running marker) behind."""
    from dedup_jobs.stores.base import running_key

    for task, args in ((tasks.reprice_product, (42, "")), (tasks.sync_stock, (WAREHOUSE,))):
        key = task.job_key(args, {})
        store = task.store()
        for held in (key, running_key(key)):
            info = store.get(held)
            if info is not None:
                store.release(held, info.owner)
                command.say(f"(released a lock left by an earlier run: {held.key})")


def part_replace(command: Any, flow: FlowSignals, number: int) -> None:
    task = tasks.reprice_product
    timeline = command.timeline
    product = Product.objects.get(pk=42)
    command.say(command.style.MIGRATE_HEADING(
        f"{number}. on_duplicate='replace': reprice_product(product_id={product.pk}, price) "
        f"- the latest price wins"))
    command.say(f"   A price feed sends {len(PRICES)} prices at once, each applied at the "
                f"next tick (countdown={TICK}s):")
    runs_before = product.reprice_runs
    t0 = time.monotonic()
    results = [task.apply_async((product.pk, price), countdown=TICK) for price in PRICES]
    names = {r.id: f"price {price}" for r, price in zip(results, PRICES, strict=True)}
    last = results[-1]
    if not timeline.wait(lambda: any(
            e.kind == FINISHED and e.task_id == last.id for e in timeline.of(task.name, t0)),
            timeout=20):
        command.problems.append("reprice_product: the last price's run was not seen in 20s")
    value = last.get(timeout=10)
    events = [e for e in timeline.of(task.name, t0) if e.kind in (PUBLISHED, STARTED, FINISHED)]
    for line in lines(events, flow.of(task.name, t0, REPLACED), t0, names):
        command.say(f"   {line}")
    product.refresh_from_db()
    replaced = flow.of(task.name, t0, REPLACED)
    revoked = sum(r.state == "REVOKED" for r in results[:-1])
    ran = product.reprice_runs - runs_before
    command.say("")
    command.figures(
        f"dispatched {len(results)}, replaced {len(replaced)} ({revoked} results REVOKED), "
        f"ran {ran}, with the latest price: {value!r}; price in the database: "
        f"{product.price}")
    if product.price != Decimal(PRICES[-1]) or ran != 1:
        command.problems.append(f"reprice_product: ran {ran}, price {product.price}")
    command.say("")


def part_without_overlapping(command: Any, flow: FlowSignals, number: int) -> None:
    task = tasks.sync_stock
    timeline = command.timeline
    command.say(command.style.MIGRATE_HEADING(
        f"{number}. without_overlapping: sync_stock(warehouse={WAREHOUSE!r}) never runs beside "
        f"itself; a trigger during a run runs after it"))
    command.say(f"   The worker runs 2 messages at once. Trigger 1, then {TRIGGERS_DURING_RUN} "
                f"more while sync 1 runs ({tasks.SYNCING_SECONDS:g}s):")
    StockSync.objects.filter(warehouse=WAREHOUSE).delete()
    t0 = time.monotonic()
    results = [task.delay(WAREHOUSE, trigger=1)]
    # The run has begun once the worker check released its until-processing lock.
    if not timeline.wait(lambda: bool(timeline.of(task.name, t0, RELEASED)), timeout=10):
        command.problems.append("sync_stock: trigger 1 did not start within 10s")
    for trigger in range(2, TRIGGERS_DURING_RUN + 2):
        results.append(task.delay(WAREHOUSE, trigger=trigger))
        time.sleep(0.1)
    published = {r.id for r in results if not r.deduplicated}
    if not timeline.wait(lambda: published <= {
            e.task_id for e in timeline.of(task.name, t0, FINISHED)
            if not e.detail.startswith("IGNORED")}, timeout=20):
        command.problems.append("sync_stock: the published triggers did not all run in 20s")
    names = {r.id: f"trigger {i}" for i, r in enumerate(results, 1) if not r.deduplicated}
    events = [e for e in timeline.of(task.name, t0)
              if e.kind in (PUBLISHED, STARTED, FINISHED, SKIPPED)]
    for line in lines(events, flow.of(task.name, t0, DEFERRED), t0, names):
        command.say(f"   {line}")
    runs = list(StockSync.objects.filter(warehouse=WAREHOUSE).order_by("started_at"))
    command.say("")
    command.say("   runs, from the StockSync table (each run writes its own interval):")
    for run in runs:
        base = runs[0].started_at
        start = (run.started_at - base).total_seconds()
        end = (run.finished_at - base).total_seconds()
        command.say(f"     trigger {run.trigger}: {start:+.3f}s .. {end:+.3f}s")
    overlapping = sum(a.finished_at > b.started_at for a, b in itertools.pairwise(runs))
    deferred = flow.of(task.name, t0, DEFERRED)
    command.say("")
    command.figures(
        f"dispatched {len(results)}, published {len(published)}, deduplicated "
        f"{sum(bool(r.deduplicated) for r in results)}, deferred {len(deferred)} times, "
        f"ran {len(runs)}, overlapping runs {overlapping}")
    if overlapping or len(runs) != len(published):
        command.problems.append(f"sync_stock: {len(runs)} runs, {overlapping} overlapping")
    command.say("")
