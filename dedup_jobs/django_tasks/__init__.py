"""Unique, debounced and throttled Django tasks (SPEC §11): ``@unique(...)``,
``@unique_until_processing(...)``, ``@debounced(...)`` and ``@throttled(...)`` over a task
made by ``@task`` of
``django.tasks`` (Django 6.0+) or the ``django-tasks`` backport.

A thin front-end over the engine (``dedup_jobs/engine``), beside the Celery one
(``dedup_jobs/jobs``); neither imports the other. Where each decision is made:

- ``enqueue.py``: the lock taken at ``enqueue``, with the result id as owner;
- ``run.py``: the worker's check when the task starts, its lease, its release;
- ``debounce.py``: a debounced task's burst, taken at enqueue and claimed at the worker;
- ``throttle.py``: a throttled task's admission at the worker, its slot, its deferral;
- ``tasks.py``: the task class that routes ``enqueue`` and ``call`` through them;
- ``options.py``: the options, checked, and the key of a call;
- ``results.py``: the ``TaskResult`` marked ``deduplicated``;
- ``compat.py``: ``django.tasks`` and the backport side by side.
"""

from __future__ import annotations

from dedup_jobs.django_tasks import compat
from dedup_jobs.django_tasks.decorators import (
    debounced,
    throttled,
    unique,
    unique_until_processing,
)
from dedup_jobs.django_tasks.enqueue import on_enqueued
from dedup_jobs.django_tasks.run import on_started

__all__ = ["debounced", "throttled", "unique", "unique_until_processing"]

for _enqueued, _started in compat.signals():
    _enqueued.connect(on_enqueued, dispatch_uid="dedup_jobs.django_tasks.enqueued")
    _started.connect(on_started, dispatch_uid="dedup_jobs.django_tasks.started")
