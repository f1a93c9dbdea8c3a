"""Django discovers the app's models here. ``JobLock`` and ``PendingDebounce`` live beside
the store that uses them; ``JobClass`` has no table (``managed = False``): it only gives the
admin's *Job classes* page its place in the app's section (see docs/admin.md)."""

from django.db import models

from dedup_jobs.metrics.models import DecisionCount, KeyCount, StoreError, StoreLatency
from dedup_jobs.stores.database.models import (
    JobLock,
    PendingDebounce,
    ThrottleEntry,
    ThrottleKey,
)

__all__ = [
    "DecisionCount",
    "JobClass",
    "JobLock",
    "KeyCount",
    "Overview",
    "PendingDebounce",
    "StoreError",
    "StoreLatency",
    "ThrottleEntry",
    "ThrottleKey",
]


class Overview(models.Model):
    """Admin entry for the Overview page (decision history, dedup_jobs/metrics/); no table.
    Named "Activity overview" so that the admin, which sorts a section by name, lists it
    first."""

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = "activity overview"
        verbose_name_plural = "activity overview"

    def __str__(self) -> str:
        return "overview"


class JobClass(models.Model):
    """Admin entry for the registered dedup job classes (read from the Celery app)."""

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = "job class"
        verbose_name_plural = "job classes"

    def __str__(self) -> str:
        return "job class"
