"""*Throttles* (T5): the throttle keys of one store (job, throttle id, limit, running now,
starts in the current window, deferred messages waiting), searchable and paginated like
*Held locks*: one page of keys from the store's index (Redis) or table (database), then the
page's counts in one more read."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from dedup_jobs.admin.common import (
    PageAdmin,
    chosen_store,
    listed_jobs,
    listing,
    redirect_to,
)


class ThrottleAdmin(PageAdmin):
    own_view_permission = "dedup_jobs.view_throttlekey"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        jobs, aliases = listed_jobs()
        choice = chosen_store(request, aliases, "ThrottleKey")
        page, _now, shared = listing(request, kind="throttle", jobs=jobs, aliases=aliases,
                                     choice=choice, read="throttle_page")
        if (moved := redirect_to(shared)) is not None:
            return moved
        if choice.store is not None and not choice.store.can_throttle and not shared["error"]:
            shared["error"] = (f"store {choice.alias!r} cannot throttle (system check "
                               f"dedup_jobs.E014), so it holds no throttle keys.")
            shared["page"] = None
        context = self.page_context(request, "Throttles", rows=page.items if page else [],
                                    **shared, **(extra_context or {}))
        return TemplateResponse(request, "admin/dedup_jobs/throttles.html", context)
