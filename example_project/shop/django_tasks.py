"""The shop's Django task (``django.tasks`` on Django 6, the ``django-tasks`` backport on
5.2), on django-tasks-db's DatabaseBackend (``TASKS`` in the settings).

- ``render_product_page``: ``@unique`` over ``@task``. A product's public page is rendered
  again after each edit; one render queued or running per product is enough, because it
  reads the product's latest state. The lock's owner is the task's result id; with the
  database store it is written in the same transaction as the task's row.

Not named ``tasks.py``: Celery's autodiscovery imports ``<app>.tasks`` for its jobs.
"""

from __future__ import annotations

from dedup_jobs.django_tasks import unique

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@unique(unique_for=600)
@task()
def render_product_page(product_id: int) -> str:
    return f"rendered product {product_id}"
