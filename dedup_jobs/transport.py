"""The kombu transport of the fused dispatch: ``CELERY_BROKER_TRANSPORT =
"dedup_jobs.transport:Transport"`` (docs/semantics.md#fused)."""

from dedup_jobs.jobs.transport import Transport

__all__ = ["Transport"]
