"""*Overview*: what the dedup layer decided over the last hour and day, across every process
(the history flushed by dedup_jobs/metrics/history.py; read by dedup_jobs/metrics/report.py).
It reads no store, so it is as fast at 100,000 held locks as at none."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from dedup_jobs import clock
from dedup_jobs.admin.common import PageAdmin, when
from dedup_jobs.conf import app_settings


class OverviewAdmin(PageAdmin):
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        from dedup_jobs.metrics import report

        now = clock.now()
        try:
            data = report.overview(now)
            problem = ""
        except DatabaseError as exc:  # the history tables are not migrated
            data, problem = {}, f"The history cannot be read ({exc}): run migrate."
        for store in data.get("stores", ()):
            store["error_when"] = when(store["error_at"])
        context = self.page_context(
            request, "Overview", problem=problem, metrics_on=app_settings.METRICS,
            flush_seconds=app_settings.METRICS_FLUSH_SECONDS, **data, **(extra_context or {}))
        return TemplateResponse(request, "admin/dedup_jobs/overview.html", context)
