"""The calls of a bulk dispatch (L3, ``Job.dispatch_many``), checked before anything is
dispatched: a bad batch raises and loses nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Call = tuple[tuple[Any, ...], dict[str, Any]]

#: options that name one message, or hang a canvas on it: a batch takes none of them
ONE_MESSAGE_OPTIONS = ("task_id", "link", "link_error", "chain", "group_id", "chord")


def checked_calls(job: Any, calls: Iterable[Any]) -> list[Call]:
    """``calls`` as ``(args, kwargs)`` pairs; TypeError naming the first that is not one."""
    checked: list[Call] = []
    for index, call in enumerate(calls):
        if (not isinstance(call, (tuple, list)) or len(call) != 2
                or not isinstance(call[0], (tuple, list, type(None)))
                or not isinstance(call[1], (Mapping, type(None)))):
            raise TypeError(
                f"{job.name}.dispatch_many: call {index} is {call!r}; each call is a pair "
                f"(args, kwargs), e.g. ((42,), {{}}) or ([], {{'item': 42}}). Nothing of the "
                f"batch was dispatched.")
        checked.append((tuple(call[0] or ()), dict(call[1] or {})))
    return checked


def refuse_one_message_options(job: Any, options: dict[str, Any]) -> None:
    given = [name for name in ONE_MESSAGE_OPTIONS if options.get(name) is not None]
    if given:
        raise TypeError(
            f"{job.name}.dispatch_many: {', '.join(given)} name one message (or hang a "
            f"canvas on it), not a batch. Dispatch those calls with apply_async.")
