"""``python manage.py demo``: dedup_jobs at work against a real Celery worker, in one process.

It migrates the SQLite database, starts a Celery worker in a thread, fires bursts of duplicate
dispatches and prints what really happened, from signals and from the database.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from argparse import ArgumentTypeError
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from django.conf import settings
from django.core import mail
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from dedup_jobs.jobs import bursts
from example_project.celery import app
from example_project.shop import demo_flow, tasks
from example_project.shop.demo_django_tasks import part_django_tasks
from example_project.shop.demo_throttle import part_limits_per_call, part_throttle
from example_project.shop.demo_timeline import (
    FINISHED,
    PUBLISHED,
    RELEASED,
    SUPERSEDED,
    Event,
    Timeline,
    render,
    short,
)
from example_project.shop.models import Order, Product, ProductFeed

#: seconds the until-processing job waits in the queue (its countdown) in part 2
QUEUED_FOR = 0.5
#: part 3: product edits in the burst, and the seconds between two of them
EDITS = 20
EDIT_EVERY = 0.025


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ArgumentTypeError(f"{value!r} must be a whole number of at least 1")
    return number


def positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise ArgumentTypeError(f"{value!r} must be a number of seconds above 0")
    return number


@contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """The demo never hangs: past ``seconds`` it says so and exits with status 3."""

    def expire() -> None:
        sys.stderr.write(f"\ndemo: gave up after {seconds:g}s (--timeout); something is stuck.\n")
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class Command(BaseCommand):
    help = (
        "Show dedup_jobs at work: bursts of duplicate dispatches against a real Celery "
        "worker running in this process. Needs no server."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--threads",
            type=positive_int,
            default=8,
            help="dispatching threads in the burst (default 8)",
        )
        parser.add_argument(
            "--per-thread", type=positive_int, default=25, help="dispatches per thread (default 25)"
        )
        parser.add_argument(
            "--timeout",
            type=positive_float,
            default=60.0,
            help="give up (exit status 3) after this many seconds (default 60)",
        )

    def handle(
        self, *, threads: int, per_thread: int, timeout: float, verbosity: int, **options: Any
    ) -> None:
        self.problems: list[str] = []
        with watchdog(timeout):
            started = time.monotonic()
            call_command("migrate", interactive=False, verbosity=0)
            product, order = self.shop_data()
            self.header()
            names = {
                tasks.update_search_index.name,
                tasks.send_order_confirmation.name,
                tasks.rebuild_product_feed.name,
            }
            with Timeline(names) as timeline:
                self.timeline = timeline
                self.clear_leftovers(product, order)
                loglevel = "INFO" if verbosity >= 2 else "ERROR"
                # Two threads: two messages can run at once, which part 5's
                # without_overlapping must (and does) keep apart.
                with start_worker(
                    app,
                    pool="threads",
                    concurrency=2,
                    perform_ping_check=False,
                    shutdown_timeout=10,
                    loglevel=loglevel,
                    timer_precision=0.1,
                ) as worker:
                    try:
                        self.part_unique(product, threads, per_thread)
                        self.part_until_processing(order)
                        self.part_debounce()
                        demo_flow.run_parts(self, first_number=4)
                        part_throttle(self)
                        part_limits_per_call(self)
                    finally:
                        # A warm shutdown through the broker: the worker stops at once
                        # instead of finishing its current 2-second broker poll.
                        app.control.shutdown(destination=[worker.hostname])
            part_django_tasks(self, product.id)
            connections.close_all()
            self.footer(time.monotonic() - started)
        if self.problems:
            raise CommandError("the demo did not go as expected:\n  " + "\n  ".join(self.problems))

    # -- setup --------------------------------------------------------------------------

    def shop_data(self) -> tuple[Product, Order]:
        product, _ = Product.objects.update_or_create(
            pk=42,
            defaults={
                "sku": "MUG-042",
                "name": "Enamel mug",
                "price": "12.50",
                "description": "A speckled blue enamel mug, 350 ml.",
            },
        )
        order, _ = Order.objects.update_or_create(
            pk=7, defaults={"customer_email": "ada@example.com", "product": product, "quantity": 2}
        )
        return product, order

    def clear_leftovers(self, product: Product, order: Order) -> None:
        """An earlier demo, or a dispatch from a shell whose in-memory broker ended with it,
        may have left a lock or a debounce burst behind: release them (part 4's and 5's
        locks are released by demo_flow)."""
        app.control.purge()
        feed = tasks.rebuild_product_feed
        if bursts.release_pending(feed, ("mugs",), reason="the demo starts afresh"):
            self.say("(released a debounce burst left by an earlier run: "
                     f"{feed.job_key(('mugs',), {}).key})")
        for task, args in (
            (tasks.update_search_index, (product.pk,)),
            (tasks.send_order_confirmation, (order.pk,)),
        ):
            key = task.job_key(args, {})
            store = task.store()
            info = store.get(key)
            if info is not None:
                store.release(key, info.owner)
                self.say(f"(released a lock left by an earlier run: {key.key})")

    def header(self) -> None:
        store = settings.DEDUP_JOBS.get("STORE", "default")
        if store == "database":
            where = f"the JobLock table of SQLite {settings.DATABASES['default']['NAME']}"
        else:
            where = f"cache {store!r} at {settings.CACHES[store]['LOCATION']}"
        self.say(
            self.style.MIGRATE_HEADING("dedup_jobs demo") + ": Celery jobs that do not pile up"
        )
        self.say(f"  locks:  {where}")
        self.say(f"  broker: {app.conf.broker_url}, results: {app.conf.result_backend}")
        self.say("  worker: a real Celery worker (2 threads) in a thread of this process")
        self.say("")

    # -- part 1: UniqueJob ----------------------------------------------------------------

    def part_unique(self, product: Product, threads: int, per_thread: int) -> None:
        task = tasks.update_search_index
        total = threads * per_thread
        self.say(
            self.style.MIGRATE_HEADING(
                f"1. UniqueJob: one update_search_index(product_id={product.pk}) queued or "
                f"running, never more"
            )
        )
        self.say(
            f"   {threads} threads x {per_thread} dispatches of "
            f"update_search_index.delay({product.pk}), all at once:"
        )
        runs_before = Product.objects.get(pk=product.pk).index_runs
        results: list[AsyncResult] = []
        errors: list[str] = []
        barrier = threading.Barrier(threads)

        def dispatcher() -> None:
            try:
                barrier.wait(timeout=10)
                for _ in range(per_thread):
                    try:
                        results.append(task.delay(product.pk))
                    except Exception as exc:  # shown below, never swallowed
                        errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                connections.close_all()

        workers = [
            threading.Thread(target=dispatcher, name=f"dispatcher-{i}") for i in range(threads)
        ]
        t0 = time.monotonic()
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join(timeout=30)
        burst_end = time.monotonic()
        if not self.timeline.wait(self.timeline.settled(task.name, t0), timeout=20):
            self.problems.append(
                "update_search_index: the run or its lock release was not seen within 20s"
            )
        events = self.timeline.of(task.name, t0)
        self.print_events(events, t0, burst=(burst_end, total))
        published = [e for e in events if e.kind == PUBLISHED]
        deduplicated = sum(bool(r.deduplicated) for r in results)
        ran = Product.objects.get(pk=product.pk).index_runs - runs_before
        released = task.store().get(task.job_key((product.pk,), {})) is None
        self.say("")
        self.figures(
            f"dispatched {len(results) + len(errors)}, published {len(published)}, "
            f"deduplicated {deduplicated}, ran {ran}, "
            f"{'lock released' if released else 'LOCK STILL HELD'}"
        )
        for error in sorted(set(errors)):
            self.problems.append(f"update_search_index dispatch failed: {error}")
        holders = {r.id for r in results}
        duplicate = next((r for r in results if r.deduplicated), None)
        if duplicate is not None and len(published) == 1:
            value = duplicate.get(timeout=10)
            self.say(
                f"   all {len(results)} dispatches returned AsyncResult("
                f"{short(published[0].task_id)}) ({len(holders)} distinct id); .get() on "
                f"a duplicate returned {value!r}"
            )
        self.say("")

    # -- part 2: UniqueUntilProcessingJob -------------------------------------------------

    def part_until_processing(self, order: Order) -> None:
        task = tasks.send_order_confirmation
        self.say(
            self.style.MIGRATE_HEADING(
                f"2. UniqueUntilProcessingJob: send_order_confirmation(order_id={order.pk}) is "
                f"unique while queued"
            )
        )
        self.say(
            "   Its lock is released as the worker starts it, so a later request is "
            "queued, not lost."
        )
        self.say(
            f"   Dispatched with countdown={QUEUED_FOR}s, 4 more clicks while it waits, "
            f"1 more once it runs:"
        )
        sent_before = Order.objects.get(pk=order.pk).confirmations_sent
        outbox_before = len(getattr(mail, "outbox", []))
        t0 = time.monotonic()
        first = task.apply_async((order.pk,), countdown=QUEUED_FOR)
        clicks = [task.delay(order.pk) for _ in range(4)]
        started = self.timeline.wait(
            lambda: any(
                e.kind == RELEASED and e.task_id == first.id
                for e in self.timeline.of(task.name, t0)
            ),
            timeout=10,
        )
        if not started:
            self.problems.append("send_order_confirmation did not start within 10s")
        during_at = time.monotonic()
        during = task.delay(order.pk)
        if not self.timeline.wait(self.timeline.settled(task.name, t0), timeout=20):
            self.problems.append("send_order_confirmation: runs or releases not seen within 20s")
        events = self.timeline.of(task.name, t0)
        first_done = min(
            (e.at for e in events if e.kind == FINISHED and e.task_id == first.id), default=None
        )
        when = "during processing" if first_done and during_at < first_done else "afterwards"
        dispatched = [first, *clicks, during]
        # The two published dispatches by their number, so that their lines (ids that can
        # look alike) are told apart at a glance.
        names = {r.id: f"dispatch {n}" for n, r in enumerate(dispatched, 1)
                 if not r.deduplicated}
        self.print_events(events, t0, names=names)
        published = [e for e in events if e.kind == PUBLISHED]
        ran = Order.objects.get(pk=order.pk).confirmations_sent - sent_before
        emails = len(getattr(mail, "outbox", [])) - outbox_before
        self.say("")
        self.figures(
            f"dispatched {len(dispatched)}, published {len(published)}, "
            f"deduplicated {sum(bool(r.deduplicated) for r in dispatched)}, "
            f"ran {ran} ({emails} emails sent); the dispatch {when} was "
            f"{'deduplicated' if during.deduplicated else 'published'}"
        )
        self.say("")

    # -- part 3: DebouncedJob -------------------------------------------------------------

    def part_debounce(self) -> None:
        task = tasks.rebuild_product_feed
        self.say(
            self.style.MIGRATE_HEADING(
                f"3. DebouncedJob: rebuild_product_feed runs once per burst, "
                f"{task.debounce_for:g}s after its last dispatch (max_wait={task.max_wait:g}s)"
            )
        )
        self.say(
            f"   {EDITS} product edits in {EDITS * EDIT_EVERY:g}s, each asking for "
            f"rebuild_product_feed('mugs', edit=n):"
        )
        feed, _ = ProductFeed.objects.get_or_create(category="mugs")
        rebuilds_before = feed.rebuilds
        t0 = time.monotonic()
        results = []
        for edit in range(1, EDITS + 1):
            results.append(task.delay("mugs", edit=edit))
            time.sleep(EDIT_EVERY)
        ran_ok = self.timeline.wait(
            lambda: any(
                e.kind == FINISHED and e.detail.startswith("SUCCESS")
                for e in self.timeline.of(task.name, t0)
            ),
            timeout=20,
        )
        if not ran_ok:
            self.problems.append("rebuild_product_feed did not run within 20s")
        values = {r.get(timeout=10) for r in results} if ran_ok else set()
        events = self.timeline.of(task.name, t0)
        self.print_events(events, t0)
        feed.refresh_from_db()
        published = [e for e in events if e.kind == PUBLISHED]
        superseded = [e for e in events if e.kind == SUPERSEDED]
        self.say("")
        self.figures(
            f"dispatched {len(results)}, superseded {len(superseded)}, "
            f"messages published {len(published)}, ran {feed.rebuilds - rebuilds_before}, "
            f"with the last arguments (edit={feed.last_edit})"
        )
        if len(values) == 1:
            self.say(
                f"   all {len(results)} dispatches' AsyncResults resolved to the one run: "
                f"{next(iter(values))!r}"
            )
        self.say("")

    # -- output ---------------------------------------------------------------------------

    def print_events(
        self, events: list[Event], t0: float, burst: tuple[float, int] | None = None,
        names: dict[str, str] | None = None,
    ) -> None:
        for line in render(events, t0, burst=burst, names=names):
            self.say(f"   {line}")

    def figures(self, text: str) -> None:
        self.say("   " + self.style.SUCCESS(text))

    def say(self, text: str) -> None:
        self.stdout.write(text)

    def footer(self, elapsed: float) -> None:
        self.say(
            f"Done in {elapsed:.1f}s. Every figure above was observed (signals, the "
            f"database), not assumed."
        )
        self.say(
            "Next: `uv run pytest` runs the test suite; example_project/shop/tasks.py has "
            "the jobs; README.md and docs/ explain the rest."
        )
