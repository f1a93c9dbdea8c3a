"""Enqueue a task of tests/django_tasks_jobs.py from its own process (settings:
tests.settings_django_tasks), from ``--threads`` threads at once; prints one JSON line per
enqueue: {"id", "deduplicated"}.

    python -m tests.django_tasks_enqueue TASK JSON_ARGS [--threads N] [--count N]
        [--bypass] [--pause-after-lock]

``--bypass``: the backend's own enqueue, around the decorator (no lock taken).
``--pause-after-lock``: a task_enqueued receiver after the lock's prints "locked" and waits
(inside the enqueue's transaction) until the process is killed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings_django_tasks")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task")
    parser.add_argument("args")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--count", type=int, default=0,
                        help="enqueue COUNT times in a row, with 0..COUNT-1 appended")
    parser.add_argument("--bypass", action="store_true")
    parser.add_argument("--pause-after-lock", action="store_true")
    options = parser.parse_args()

    import django

    django.setup()
    from tests import django_tasks_jobs

    task = getattr(django_tasks_jobs, options.task)
    args = json.loads(options.args)
    if options.pause_after_lock:
        def pause(**kwargs: object) -> None:
            print("locked", flush=True)
            time.sleep(120)

        django_tasks_jobs.task_enqueued.connect(pause, weak=False)
    start = threading.Barrier(options.threads)
    lines: list[str] = []

    if options.count:
        for n in range(options.count):
            result = task.enqueue(*args, n)
            lines.append(json.dumps({"id": str(result.id), "deduplicated": result.deduplicated}))
        sys.stdout.write("".join(line + "\n" for line in lines))
        return

    def one() -> None:
        start.wait()
        if options.bypass:
            result = task.get_backend().enqueue(task, args, {})
            deduplicated = None
        else:
            result = task.enqueue(*args)
            deduplicated = result.deduplicated
        lines.append(json.dumps({"id": str(result.id), "deduplicated": deduplicated}))

    threads = [threading.Thread(target=one) for _ in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sys.stdout.write("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()
