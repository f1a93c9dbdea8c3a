"""Template filters of the app's admin pages (docs/admin.md, Layout)."""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

#: where a task name, an option or an outcome may break: after '.', ':' and '_', the
#: boundaries of its words ("example_project.shop.tasks.recalculate_invoice")
_BREAK = re.compile(r"([.:_])(?=.)")
#: ... and a class name before an inner capital ("UniqueUntil|Processing|Job")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")


@register.filter
def breakable(value: object) -> SafeString:
    """``value`` escaped, with a ``<wbr>`` after each '.', ':' and '_' (not at the end): a
    long name wraps between its words, never inside one, and copies as it is."""
    return mark_safe(_BREAK.sub(r"\1<wbr>", str(escape(value))))


@register.filter
def breakable_class(value: object) -> SafeString:
    """A class name escaped, with a ``<wbr>`` before each inner capital."""
    return mark_safe(_CAMEL.sub("<wbr>", str(escape(value))))
