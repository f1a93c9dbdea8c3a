"""Django discovers the app's models here. ``JobLock`` and ``PendingDebounce`` live beside
the store that uses them; ``JobClass`` has no table (``managed = False``): it only gives the
admin's *Job classes* page its place in the app's section (see docs/admin.md)."""

from django.db import models

from dedup_jobs.stores.database.models import (
    JobLock,
    PendingDebounce,
    ThrottleEntry,
    ThrottleKey,
)

__all__ = ["JobClass", "JobLock", "PendingDebounce", "ThrottleEntry", "ThrottleKey"]


class JobClass(models.Model):
    """Admin entry for the registered dedup job classes (read from the Celery app)."""

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = "job class"
        verbose_name_plural = "job classes"

    def __str__(self) -> str:
        return "job class"
