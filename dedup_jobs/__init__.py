"""Unique, unique-until-processing, debounced and throttled Celery jobs for Django."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("dedup-jobs")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

if TYPE_CHECKING:
    from dedup_jobs.jobs.debounced import DebouncedJob
    from dedup_jobs.jobs.throttled import ThrottledJob
    from dedup_jobs.jobs.unique import UniqueJob, UniqueUntilProcessingJob

__all__ = ["DebouncedJob", "ThrottledJob", "UniqueJob", "UniqueUntilProcessingJob",
           "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so that "dedup_jobs" can sit in INSTALLED_APPS without importing Celery
    # task machinery before the app registry is ready.
    if name in ("UniqueJob", "UniqueUntilProcessingJob"):
        from dedup_jobs.jobs import unique

        return getattr(unique, name)
    if name == "DebouncedJob":
        from dedup_jobs.jobs import debounced

        return debounced.DebouncedJob
    if name == "ThrottledJob":
        from dedup_jobs.jobs import throttled

        return throttled.ThrottledJob
    raise AttributeError(f"module 'dedup_jobs' has no attribute {name!r}")
