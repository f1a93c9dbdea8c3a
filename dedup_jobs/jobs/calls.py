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


def check_limits(job: Any, args: Any, kwargs: Any) -> None:
    """L1: raise for a limit method's bad value for this call (what a dispatch of it raises
    before anything is published); nothing to do for static limits."""
    if callable(getattr(job, "concurrency", None)) or callable(getattr(job, "throttle", None)):
        job.limits_for(args, kwargs)


def check_each(job: Any, calls: list[Call]) -> None:
    """L3 on the one-by-one path: raise what a dispatch of any call would raise for its
    arguments (its key, its lifetime, its limits: L1) before the first call is dispatched,
    so a bad call late in a batch leaves nothing of it behind. In eager mode nothing is
    checked: each call runs at once, as ``apply_async`` runs it."""
    if job.app.conf.task_always_eager:
        return
    debounce_times = getattr(job, "debounce_times", None)
    lock_ttl = getattr(job, "lock_ttl", None)
    for args, kwargs in calls:
        if debounce_times is not None and debounce_times(args, kwargs)[0] is None:
            continue  # L1: this call is not debounced: published as it is
        if job.dedup_kind in ("unique", "debounce"):
            job.job_key(args, kwargs)
        if lock_ttl is not None:
            lock_ttl(args, kwargs)
        if job.dedup_kind == "throttle" and getattr(job, "throttle_id", None) is not None:
            job.throttle_key(args, kwargs)
        check_limits(job, args, kwargs)
