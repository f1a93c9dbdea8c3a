"""*Debounced jobs*: the pending bursts of one store (job, debounce id, dispatches so far,
first/last dispatch, runs at, max-wait deadline, latest arguments)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from dedup_jobs.admin.common import (
    PageAdmin,
    chosen_store,
    duration,
    listed_jobs,
    listing,
    redirect_to,
    truncate,
    when,
)
from dedup_jobs.conf import app_settings
from dedup_jobs.stores.base import DebounceState


def call_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``(1, 'x', reason='late')`` as the run will receive them (the template escapes it)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return truncate("(" + ", ".join(parts) + ")")


def _row(state: DebounceState, now: float, show_args: bool) -> dict[str, Any]:
    return {
        "state": state,
        "first": when(state.first_dispatch_at),
        "last": when(state.last_dispatch_at),
        "runs_at": when(state.runs_at),
        "runs_in": f"in {duration(max(1.0, state.runs_at - now))}"
        if state.runs_at > now
        else "due now",
        "deadline": when(state.deadline),
        "args": call_text(state.args, state.kwargs) if show_args else "",
    }


class PendingDebounceAdmin(PageAdmin):
    own_view_permission = "dedup_jobs.view_pendingdebounce"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        jobs, aliases = listed_jobs()
        choice = chosen_store(request, aliases, "PendingDebounce")
        page, now, shared = listing(
            request,
            kind="debounce",
            jobs=jobs,
            aliases=aliases,
            choice=choice,
            read="debounce_page",
        )
        if (moved := redirect_to(shared)) is not None:
            return moved
        show_args = app_settings.SHOW_ARGS
        context = self.page_context(
            request,
            "Debounced jobs",
            rows=[_row(state, now, show_args) for state in page.items] if page else [],
            show_args=show_args,
            **shared,
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/dedup_jobs/debounced_jobs.html", context)
