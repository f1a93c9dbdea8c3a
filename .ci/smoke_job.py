"""Dispatch a UniqueJob from the installed wheel (eager Celery, database store): the lock is
taken, a duplicate dispatched from inside the run is deduplicated, the lock is released."""

import django

django.setup()

from celery import Celery  # noqa: E402

from dedup_jobs import UniqueJob, __version__  # noqa: E402
from dedup_jobs.stores.database.models import JobLock  # noqa: E402

app = Celery("package_check")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(base=UniqueJob, unique_for=60, name="package_check.job")
def job(n: int) -> tuple[int, bool, int]:
    again = job.delay(n)
    return n, again.deduplicated, JobLock.objects.count()


n, deduplicated, held = job.delay(1).get()
assert (n, deduplicated, held) == (1, True, 1), (n, deduplicated, held)
# a released lock's row stays a moment as its tombstone (S7: a release made again answers as
# the first did): nonce "released", expired; no row is a lock any more
assert JobLock.objects.exclude(nonce="released").count() == 0, "the lock was not released"
print(f"smoke job: ran once, duplicate deduplicated, lock released (dedup_jobs {__version__})")
