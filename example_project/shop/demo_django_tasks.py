"""The demo's Django-task part (``python manage.py demo``, part 7): ``@unique`` over a
Django ``@task`` on django-tasks-db. 8 threads enqueue one product's render at once; the
task rows in the database say how many were written; a real ``db_worker`` (in this process,
``--batch``: it runs what is queued, then returns) runs it; an enqueue after that runs
again, because the run released the lock."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from django.core.management import call_command

from example_project.shop.django_tasks import render_product_page

THREADS = 8


def rows() -> Counter[str]:
    """The render's task rows, by status."""
    from django_tasks_db.models import DBTaskResult

    return Counter(DBTaskResult.objects.filter(task_path=render_product_page.module_path)
                   .values_list("status", flat=True))


def run_worker() -> None:
    call_command("db_worker", batch=True, startup_delay=False, interval=0.05, verbosity=0)


def part_django_tasks(command: Any, product_id: int) -> None:
    """Run the part; ``command`` is the demo command (say/figures/problems)."""
    command.say(command.style.MIGRATE_HEADING(
        "7. Django tasks: @unique over @task, on django-tasks-db (a row per task)"))
    from django_tasks_db.models import DBTaskResult

    DBTaskResult.objects.filter(task_path=render_product_page.module_path).delete()
    start = threading.Barrier(THREADS)
    results: list[Any] = []

    def enqueue() -> None:
        start.wait()
        results.append(render_product_page.enqueue(product_id))

    threads = [threading.Thread(target=enqueue) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = {result.id for result in results}
    duplicates = sum(1 for result in results if result.deduplicated)
    command.say(f"   {THREADS} threads enqueue render_product_page({product_id}) at once:")
    command.figures(f"enqueued {len(results)}, task rows written {sum(rows().values())}, "
                    f"deduplicated {duplicates} ({len(ids)} distinct result id)")
    run_worker()
    after_first = rows()
    again = render_product_page.enqueue(product_id)
    run_worker()
    after_second = rows()
    command.figures(f"db_worker ran it: {after_first['SUCCESSFUL']} successful row; the lock "
                    f"was released, so the next enqueue is new "
                    f"(deduplicated {again.deduplicated}) and runs too: "
                    f"{after_second['SUCCESSFUL']} successful rows")
    if (sum(after_first.values()), after_first["SUCCESSFUL"], duplicates) != (
            1, 1, THREADS - 1) or after_second["SUCCESSFUL"] != 2 or again.deduplicated:
        command.problems.append(
            f"Django tasks: expected 1 row run once and 7 duplicates, then a second run; got "
            f"rows {dict(after_first)} then {dict(after_second)}, duplicates {duplicates}")
