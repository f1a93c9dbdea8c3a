from __future__ import annotations

from django.apps import AppConfig


class DedupJobsConfig(AppConfig):
    name = "dedup_jobs"
    verbose_name = "Dedup jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dedup_jobs import (
            checks,
            checks_capabilities,
            checks_database,
            checks_fused,
            handlers,
        )

        checks.register()
        checks_capabilities.register()
        checks_database.register()
        checks_fused.register()
        handlers.connect()
