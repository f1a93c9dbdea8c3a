"""Template filters of the app's admin pages (docs/admin.md, Layout)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

#: where a task name, an option or an outcome may break: after '.', ':' and '_', the
#: boundaries of its words ("example_project.shop.tasks.recalculate_invoice")
_WORDS = re.compile(r"(?<=[.:_])")
#: a class name before an inner capital ("UniqueUntil|Processing|Job")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
#: a word (between two of those) longer than this (no real name has one; a test's
#: "tests.long_name_xxx…" of 300 x's does) also breaks every CHUNK characters, so that it
#: cannot widen its table past its box
LONGEST, CHUNK = 24, 12


def _pieces(text: str) -> Iterator[str]:
    for word in _WORDS.split(text):
        if len(word) <= LONGEST:
            yield word
        else:
            yield from (word[i:i + CHUNK] for i in range(0, len(word), CHUNK))


@register.filter
def breakable(value: object) -> SafeString:
    """``value`` escaped, with a ``<wbr>`` after each '.', ':' and '_' (not at the end): a
    long name wraps between its words, never inside one, and copies as it is. A word of
    more than LONGEST characters also breaks every CHUNK characters."""
    return mark_safe("<wbr>".join(str(escape(p)) for p in _pieces(str(value)) if p))


@register.filter
def breakable_class(value: object) -> SafeString:
    """A class name escaped, with a ``<wbr>`` before each inner capital."""
    return mark_safe(_CAMEL.sub("<wbr>", str(escape(value))))
