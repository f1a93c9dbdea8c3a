"""The Celery app of the test suite (configured from tests.settings)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

# Workers in a subprocess get Celery's Django fixup, as a real project does (it closes DB
# connections around every task). In-process thread workers run without it: its worker_init
# would close the test thread's own database connections.
if os.environ.get("DEDUP_JOBS_TEST_FIXUP") == "1":
    app = Celery("tests")
else:
    import django

    django.setup()
    app = Celery("tests", fixups=[])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_default_queue=os.environ.get("DEDUP_JOBS_TEST_QUEUE", "dedup_tests"),
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
app.autodiscover_tasks(["tests", "tests.faults"], related_name="jobs")
# Threads (dispatching tests, in-process workers) resolve shared tasks through the default
# app, not this thread's current one.
app.set_default()
