"""What the admin pages share: view permission, one URL per page, the stores to list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode

from dedup_jobs import clock
from dedup_jobs.django_tasks import registry as django_tasks
from dedup_jobs.exceptions import DedupError, StoreUnavailable
from dedup_jobs.jobs import registry
from dedup_jobs.stores import DATABASE, get_store
from dedup_jobs.stores.base import BaseStore, Page

#: rows per page on the held-locks and debounced-jobs pages
PER_PAGE = 100
#: page numbers above this are read as this one (past any real last page) so that the
#: offset stays one every store can take; the view then redirects to the last page
MAX_PAGE = 10**9
#: characters of arguments shown before "…"
ARGS_LIMIT = 200

BACKEND_NAMES = {
    "django_redis.cache.RedisCache": "django-redis",
    "django.core.cache.backends.redis.RedisCache": "Django's RedisCache",
    "django_valkey.cache.ValkeyCache": "django-valkey",
}

PAGES = (
    ("overview", "Overview"),
    ("joblock", "Held locks"),
    ("pendingdebounce", "Debounced jobs"),
    ("throttlekey", "Throttles"),
    ("jobclass", "Job classes"),
)


def can_view(request: HttpRequest) -> bool:
    """One permission opens every page of the section: view (or change) on held locks."""
    user: Any = request.user
    return bool(
        user.is_active
        and user.is_staff
        and (user.has_perm("dedup_jobs.view_joblock") or user.has_perm("dedup_jobs.change_joblock"))
    )


class PageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A read-only page of the app's section: one URL (the changelist), no add/change/delete."""

    #: a permission of the page's own (e.g. "dedup_jobs.view_pendingdebounce") that also
    #: lets a staff user view it, beside the section's (:func:`can_view`)
    own_view_permission: str | None = None

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user: Any = request.user
        own = self.own_view_permission
        return can_view(request) or bool(own and user.is_staff and user.has_perm(own))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def page_context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        tabs = [
            {
                "title": label,
                "url": reverse(f"admin:dedup_jobs_{model}_changelist"),
                "current": model == self.opts.model_name,
            }
            for model, label in PAGES
        ]
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "tabs": tabs,
            "media": self.media,
            **extra,
        }


@dataclass(frozen=True, kw_only=True)
class StoreChoice:
    alias: str
    label: str
    store: BaseStore | None
    problem: str  # why this store cannot be listed ("" when it can)


def store_choice(alias: str, model: str = "JobLock") -> StoreChoice:
    """The store ``alias``, labelled; ``model``: the database store's model the page lists
    (JobLock, PendingDebounce, ThrottleKey)."""
    if alias == DATABASE:
        label = f"database ({model} model)"
    else:
        backend = getattr(settings, "CACHES", {}).get(alias, {}).get("BACKEND", "?")
        label = f"{alias} ({BACKEND_NAMES.get(backend, backend.rsplit('.', 1)[-1])})"
    try:
        store = get_store(alias)
    except DedupError as exc:
        return StoreChoice(alias=alias, label=label, store=None, problem=str(exc))
    problem = (
        ""
        if store.can_list
        else (store.cannot_list_reason or f"store {alias!r} cannot list what it holds")
    )
    return StoreChoice(alias=alias, label=label, store=store, problem=problem)


def query(request: HttpRequest, **changes: Any) -> str:
    """The current query string with ``changes`` (None removes a parameter)."""
    params: dict[str, str] = {k: str(v) for k, v in request.GET.items()}
    for name, value in changes.items():
        if value is None or value == "":
            params.pop(name, None)
        else:
            params[name] = str(value)
    return "?" + urlencode(params) if params else "?"


def page_number(request: HttpRequest) -> int:
    """The ``?p=`` page number (1 when absent); anything that is not a page number at all
    (not a whole number, zero, negative) is a 404 (A4)."""
    raw = request.GET.get("p", "").strip() or "1"
    try:
        number = int(raw)
    except ValueError:  # also a number too long to convert
        number = 0
    if number < 1:
        shown = raw if len(raw) <= 40 else raw[:39] + "…"
        raise Http404(f"Page {shown!r} is not a page number: pages are counted from 1.")
    return number


def when(timestamp: float | None) -> datetime | None:
    return None if timestamp is None else clock.to_datetime(timestamp)


def duration(seconds: float | None) -> str:
    """ "45 s", "4 min 10 s", "2 h 5 min", "3 d 4 h"; "expired" at or below zero."""
    if seconds is None:
        return "unknown"
    if seconds <= 0:
        return "expired"
    whole = round(seconds)
    for size, unit, sub_size, sub_unit in (
        (86400, "d", 3600, "h"),
        (3600, "h", 60, "min"),
        (60, "min", 1, "s"),
    ):
        if whole >= size:
            rest = (whole % size) // sub_size
            return f"{whole // size} {unit}" + (f" {rest} {sub_unit}" if rest else "")
    return f"{whole} s"


def truncate(text: str, limit: int = ARGS_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def chosen_store(request: HttpRequest, aliases: list[str], model: str = "JobLock") -> StoreChoice:
    """The store named by ``?store=`` (one of ``aliases``), else the first (``model``: see
    :func:`store_choice`)."""
    alias = request.GET.get("store") or aliases[0]
    if alias not in aliases:
        messages.error(request, f"Unknown store {alias!r}; showing {aliases[0]!r}.")
        alias = aliases[0]
    return store_choice(alias, model)


def listing(
    request: HttpRequest,
    *,
    kind: str,
    jobs: list[Any],
    aliases: list[str],
    choice: StoreChoice,
    read: str,
    more_names: tuple[str, ...] = (),
) -> tuple[Page[Any] | None, float, dict[str, Any]]:
    """Read one page (``read`` names the store's ``lock_page``/``debounce_page``) for the
    query's job, search and page number; returns it, the time used, and the context shared by
    the store pages (filters, search, paginator). A page past the last one returns only
    ``{"redirect": url of the last page}`` (see :func:`redirect_to`); a page number that is
    not one raises Http404."""
    job = request.GET.get("job", "")
    search = request.GET.get("q", "").strip()
    number = page_number(request)
    page, error, now = None, "", clock.now()
    if choice.store is not None and not choice.problem:
        try:
            page = getattr(choice.store, read)(
                offset=(min(number, MAX_PAGE) - 1) * PER_PAGE,
                limit=PER_PAGE,
                task_name=job,
                search=search,
                now=now,
            )
        except StoreUnavailable as exc:
            error = str(exc)
        except NotImplementedError as exc:
            error = f"store {choice.alias!r} cannot list this: {exc}"
    if page is not None and not page.items and number > 1:
        # Past the last page (or a number no store can offset by): show the last page. (An
        # empty page within the count, e.g. index entries whose locks were evicted, shows.)
        if page.total is None:
            raise Http404(f"Page {number} is past the last page.")
        last = max(1, -(-page.total // PER_PAGE))
        if last < number:
            url = request.path + query(request, p=last if last > 1 else None)
            return page, now, {"redirect": url}
    jobs_of_kind = [j.name for j in jobs
                    if j.dedup_kind == kind or (kind == "throttle" and j.throttled())]
    jobs_of_kind += more_names  # K4: unique Django tasks, by module path
    context = {
        "store": choice,
        "job": job,
        "search": search,
        "error": error,
        "page": page,
        "number": number,
        "store_links": [
            {"alias": a, "url": query(request, store=a, p=None), "selected": a == choice.alias}
            for a in aliases
        ],
        "job_links": [
            {
                "name": name,
                "url": query(request, job=value, p=None),
                "selected": value == (job or None),
            }
            for name, value in [("All", None), *((n, n) for n in jobs_of_kind)]
        ],
        "previous_url": query(request, p=number - 1) if number > 1 else "",
        "next_url": query(request, p=number + 1) if page and page.has_more else "",
        "pages": None if not page or page.total is None else max(1, -(-page.total // PER_PAGE)),
    }
    return page, now, context


def redirect_to(shared: dict[str, Any]) -> HttpResponse | None:
    """The redirect :func:`listing` asked for, if any."""
    url = shared.get("redirect")
    return HttpResponseRedirect(url) if url else None


def listed_jobs() -> tuple[list[Any], list[str]]:
    """The registered Celery dedup jobs, and the stores to list: theirs and those of the
    unique Django tasks made in this process (K4)."""
    jobs = registry.dedup_jobs()
    extra = [task.dedup.store_alias() for task in django_tasks.unique_tasks()]
    return jobs, list(dict.fromkeys([*registry.store_aliases(jobs), *extra]))
