"""The example shop's Celery app, configured from Django's settings (``CELERY_*`` names).

Start a worker for it with ``celery -A example_project worker -l INFO`` (with
``DEDUP_JOBS_EXAMPLE_REDIS`` set: the default in-memory broker only reaches workers inside
the same process, as in ``python manage.py demo``).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
