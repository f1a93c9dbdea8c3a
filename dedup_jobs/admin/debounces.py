"""*Debounced jobs*: the pending bursts of one store (job, debounce id, dispatches so far,
first/last dispatch, runs at, max-wait deadline, latest arguments). A burst not run by its due
time plus LEASE_SECONDS is marked overdue (its message is taken as lost, D9) and can be
released: *Release selected overdue bursts* (POST, CSRF, a confirmation page, its own
permission), a compare-and-delete by the burst's message id."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import ngettext

from dedup_jobs import clock
from dedup_jobs.admin.actions import ActionPageAdmin
from dedup_jobs.admin.common import (
    chosen_store,
    duration,
    listed_jobs,
    listing,
    query,
    redirect_to,
    truncate,
    when,
)
from dedup_jobs.conf import app_settings
from dedup_jobs.jobs import bursts, registry
from dedup_jobs.jobs.debounced import DebouncedJob
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import BaseStore, DebounceState


def call_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``(1, 'x', reason='late')`` as the run will receive them (the template escapes it)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return truncate("(" + ", ".join(parts) + ")")


@dataclass(frozen=True, kw_only=True)
class Burst:
    """A burst ticked on the page: released only if it is still that message's, overdue."""

    key: str
    message_id: str
    task_name: str
    ident: str

    @classmethod
    def parse(cls, value: str) -> Burst | None:
        try:
            key, message_id, task_name, ident = json.loads(value)
        except (TypeError, ValueError):
            return None
        if not all(isinstance(v, str) for v in (key, message_id, task_name, ident)):
            return None
        return cls(key=key, message_id=message_id, task_name=task_name, ident=ident)

    @property
    def value(self) -> str:
        return json.dumps([self.key, self.message_id, self.task_name, self.ident])

    @property
    def job_key(self) -> JobKey:
        return JobKey(key=self.key, task_name=self.task_name, ident=self.ident)


def _row(state: DebounceState, now: float, show_args: bool) -> dict[str, Any]:
    overdue = state.overdue(now)
    return {
        "state": state,
        "overdue": overdue,
        "value": Burst(key=state.key, message_id=state.message_id, task_name=state.task_name,
                       ident=state.ident).value,
        "first": when(state.first_dispatch_at),
        "last": when(state.last_dispatch_at),
        "runs_at": when(state.runs_at),
        "runs_in": f"in {duration(max(1.0, state.runs_at - now))}"
        if state.runs_at > now
        else f"overdue by {duration(now - state.runs_at)}: its message is lost"
        if overdue
        else "due now",
        "deadline": when(state.deadline),
        "args": call_text(state.args, state.kwargs) if show_args else "",
    }


class PendingDebounceAdmin(ActionPageAdmin):
    own_view_permission = "dedup_jobs.view_pendingdebounce"
    actions = ["release_overdue"]

    def parse_selected(self, value: str) -> Burst | None:
        return Burst.parse(value)

    def has_release_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("dedup_jobs.release_pendingdebounce"))

    @admin.action(description="Release selected overdue bursts", permissions=["release"])
    def release_overdue(self, request: HttpRequest, selected: Any) -> HttpResponse | None:
        """Confirm first; on ``post=yes`` release each burst that is still overdue and still
        that message's: its state goes, its dispatches end REVOKED (the next dispatch of its
        id starts a new burst at once)."""
        store: BaseStore = selected.store
        now = clock.now()
        current = {item: store.get_debounce(item.job_key) for item in selected.items}
        if request.POST.get("post") != "yes":
            rows = [{"item": item, "current": state,
                     "status": _status(item, state, now)} for item, state in current.items()]
            context = self.page_context(
                request, "Release selected overdue bursts?", rows=rows,
                store_alias=store.alias, action=request.POST.get("action", ""),
                back=query(request), action_checkbox_name=helpers.ACTION_CHECKBOX_NAME)
            return TemplateResponse(
                request, "admin/dedup_jobs/release_bursts_confirmation.html", context)
        released = kept = 0
        for item, state in current.items():
            job = registry.job_named(item.task_name)
            if (_status(item, state, now) == "overdue" and isinstance(job, DebouncedJob)
                    and bursts.release(job, store, item.job_key, item.message_id,
                                       "debounce burst released from the admin: overdue")):
                released += 1
            else:
                kept += 1
        if released:
            self.message_user(request, ngettext(
                "Released %(count)d burst.", "Released %(count)d bursts.", released)
                % {"count": released}, messages.SUCCESS)
        if kept:
            self.message_user(request, ngettext(
                "%(count)d burst was not released: it ran, moved or is no longer overdue.",
                "%(count)d bursts were not released: they ran, moved or are no longer "
                "overdue.", kept) % {"count": kept}, messages.WARNING)
        return None

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        jobs, aliases = listed_jobs()
        choice = chosen_store(request, aliases, "PendingDebounce")
        if request.method == "POST":
            return self.post_action(request, choice.store)
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
        rows = [_row(state, now, show_args) for state in page.items] if page else []
        actions = self.get_action_choices(request) if page is not None else []
        context = self.page_context(
            request,
            "Debounced jobs",
            rows=rows,
            show_args=show_args,
            action_choices=actions if len(actions) > 1 and any(r["overdue"] for r in rows)
            else [],
            action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
            **shared,
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/dedup_jobs/debounced_jobs.html", context)


def _status(item: Burst, state: DebounceState | None, now: float) -> str:
    """"overdue" (releasable), or why not: "gone" (ran, released, or a newer burst holds
    the id) or "waiting" (not overdue: its message may still come)."""
    if state is None or state.message_id != item.message_id:
        return "gone"
    return "overdue" if state.overdue(now) else "waiting"
