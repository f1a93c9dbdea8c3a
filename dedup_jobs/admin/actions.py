"""The action form of a page that lists store entries (*Held locks*, *Debounced jobs*): POST
with CSRF (checked by the middleware), a chosen action the user has the permission for, the
ticked entries parsed from their values, then the action, which confirms first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from dedup_jobs.admin.common import PageAdmin
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores.base import BaseStore


@dataclass(frozen=True, kw_only=True)
class Selection:
    """What an action receives instead of a queryset: the store and the ticked entries."""

    store: BaseStore
    items: list[Any]


class ActionPageAdmin(PageAdmin):
    """A page whose rows can be ticked and acted on."""

    def parse_selected(self, value: str) -> Any:
        """The entry a ticked checkbox's ``value`` names, or None if it names none."""
        raise NotImplementedError

    def post_action(self, request: HttpRequest, store: BaseStore | None) -> HttpResponse:
        """The action form: run the chosen action on the ticked entries."""
        back = HttpResponseRedirect(request.get_full_path())
        actions = self.get_actions(request)
        name = request.POST.get("action", "")
        if name not in actions:
            if name:
                raise PermissionDenied
            self.message_user(request, "No action selected.", messages.WARNING)
            return back
        items = [
            s
            for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            if (s := self.parse_selected(v)) is not None
        ]
        if not items:
            self.message_user(
                request,
                "Items must be selected in order to perform actions "
                "on them. No items have been changed.",
                messages.WARNING,
            )
            return back
        if store is None or not store.can_list:
            raise PermissionDenied
        func: Any = actions[name][0]  # type: ignore[index]
        try:
            response: HttpResponse | None = func(self, request, Selection(store=store, items=items))
        except StoreUnavailable as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return back
        return response or back
