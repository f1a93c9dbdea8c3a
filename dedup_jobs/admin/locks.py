"""*Held locks*: the locks of one store, searchable, filterable by job, paginated, with the
*Release selected locks* action (POST, CSRF, a confirmation page, its own permission)."""

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
from dedup_jobs.admin import flow, owners
from dedup_jobs.admin.actions import ActionPageAdmin
from dedup_jobs.admin.common import (
    chosen_store,
    duration,
    listed_jobs,
    listing,
    query,
    redirect_to,
    when,
)
from dedup_jobs.django_tasks import registry as django_tasks
from dedup_jobs.jobs import registry
from dedup_jobs.jobs.base import DedupJob
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import lock_released, notify
from dedup_jobs.stores.base import RUNNING, BaseStore, LockInfo


@dataclass(frozen=True, kw_only=True)
class Selected:
    """A lock ticked on the page: released only if ``owner`` still holds ``key``."""

    key: str
    owner: str
    task_name: str
    ident: str

    @classmethod
    def of(cls, lock: LockInfo) -> Selected:
        return cls(key=lock.key, owner=lock.owner, task_name=lock.task_name, ident=lock.ident)

    @classmethod
    def parse(cls, value: str) -> Selected | None:
        try:
            key, owner, task_name, ident = json.loads(value)
        except (TypeError, ValueError):
            return None
        if not all(isinstance(v, str) for v in (key, owner, task_name, ident)) or not owner:
            return None
        return cls(key=key, owner=owner, task_name=task_name, ident=ident)

    @property
    def value(self) -> str:
        return json.dumps([self.key, self.owner, self.task_name, self.ident])

    @property
    def job_key(self) -> JobKey:
        return JobKey(key=self.key, task_name=self.task_name, ident=self.ident)


def _row(
    lock: LockInfo, now: float, jobs: dict[str, DedupJob], owner_links: dict[str, str]
) -> dict[str, Any]:
    job = jobs.get(lock.task_name)
    return {
        "lock": lock,
        "badges": flow.badges(job) if job is not None else flow.framework_badges(lock.task_name),
        # R2: the running marker of an until-processing job (its lock went as the run began)
        "marker": lock.state == RUNNING and lock.key.endswith(":run")
        and job is not None and flow.overlap_guarded(job),
        "owner_short": owners.short(lock.owner),
        "owner_url": owner_links.get(lock.owner),
        "value": Selected.of(lock).value,
        "acquired": when(lock.acquired_at),
        "expires": when(lock.expires_at),
        "expires_in": duration(None if lock.expires_at is None else lock.expires_at - now),
    }


def _rows(
    locks: list[LockInfo], now: float, jobs: dict[str, DedupJob]
) -> list[dict[str, Any]]:
    owner_links = owners.links(lock.owner for lock in locks)
    return [_row(lock, now, jobs, owner_links) for lock in locks]


class JobLockAdmin(ActionPageAdmin):
    actions = ["release_selected"]

    def parse_selected(self, value: str) -> Selected | None:
        return Selected.parse(value)

    def has_release_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("dedup_jobs.release_joblock"))

    @admin.action(description="Release selected locks", permissions=["release"])
    def release_selected(self, request: HttpRequest, selected: Any) -> HttpResponse | None:
        """Confirm first; on ``post=yes`` compare-and-delete each lock by its owner token
        and send ``lock_released`` (reason "admin") for each one actually released."""
        store: BaseStore = selected.store
        if request.POST.get("post") != "yes":
            return self._confirmation(request, selected)
        released = gone = 0
        for item in selected.items:
            if store.release(item.job_key, item.owner):
                released += 1
                job = registry.job_named(item.task_name)
                notify(  # send_robust: a raising receiver stops no release
                    lock_released,
                    # K4: a Django task is its own sender
                    type(job) if job is not None
                    else django_tasks.find(item.task_name) or DedupJob,
                    key=item.key,
                    owner=item.owner,
                    store=store.alias,
                    reason="admin",
                )
            else:
                gone += 1
        if released:
            self.message_user(
                request,
                ngettext("Released %(count)d lock.", "Released %(count)d locks.", released)
                % {"count": released},
                messages.SUCCESS,
            )
        if gone:
            self.message_user(
                request,
                ngettext(
                    "%(count)d lock was not released: it is gone or now held by another task.",
                    "%(count)d locks were not released: they are gone or now held by another task.",
                    gone,
                )
                % {"count": gone},
                messages.WARNING,
            )
        return None

    def _confirmation(self, request: HttpRequest, selected: Any) -> TemplateResponse:
        store: BaseStore = selected.store
        now = clock.now()
        rows = []
        for item in selected.items:
            current = store.get(item.job_key)
            status = "held" if current is not None and current.owner == item.owner else "gone"
            rows.append(
                {
                    "item": item,
                    "current": current,
                    "status": status,
                    "running": status == "held"
                    and current is not None
                    and current.state == RUNNING,
                    "expires_in": duration(current.expires_at - now)
                    if current is not None and current.expires_at
                    else "",
                }
            )
        context = self.page_context(
            request,
            "Release selected locks?",
            rows=rows,
            store_alias=store.alias,
            action=request.POST.get("action", ""),
            back=query(request),
            action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
        )
        return TemplateResponse(request, "admin/dedup_jobs/release_confirmation.html", context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        jobs, aliases = listed_jobs()
        choice = chosen_store(request, aliases)
        if request.method == "POST":
            return self.post_action(request, choice.store)
        page, now, shared = listing(
            request,
            kind="unique",
            jobs=jobs,
            aliases=aliases,
            choice=choice,
            read="lock_page",
            more_names=tuple(t.dedup.label for t in django_tasks.unique_tasks()),
        )
        if (moved := redirect_to(shared)) is not None:
            return moved
        actions = self.get_action_choices(request) if page is not None else []
        by_name = {str(job.name): job for job in jobs}
        context = self.page_context(
            request,
            "Held locks",
            rows=_rows(page.items, now, by_name) if page else [],
            action_choices=actions if len(actions) > 1 else [],
            action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
            **shared,
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/dedup_jobs/held_locks.html", context)
