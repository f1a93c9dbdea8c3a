"""Django discovers the app's models here; they live beside the store that uses them."""

from dedup_jobs.stores.database.models import JobLock, PendingDebounce

__all__ = ["JobLock", "PendingDebounce"]
