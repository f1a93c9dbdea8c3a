"""L1: a time option given as a method of the call — ``unique_for``, ``debounce_for``,
``max_wait`` — evaluated for one call, and checked: a value that cannot be a number of
seconds raises InvalidJobConfiguration naming the job, the method and the value, at
dispatch, before any store is asked. (``concurrency`` and ``throttle`` as methods:
:func:`dedup_jobs.engine.throttle.call_limits`.)

``None`` from such a method means what the option's ``None`` means as an attribute:
``unique_for``: the default fail-safe expiry (DEDUP_JOBS["DEFAULT_UNIQUE_FOR"]);
``max_wait``: no cap; ``debounce_for``: no debounce for this call (it is published at once,
outside any burst)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dedup_jobs.conf import is_seconds, not_finite
from dedup_jobs.exceptions import InvalidJobConfiguration

#: what None returned by each method means, for the error message
NONE_MEANS = {
    "unique_for": "the default expiry (DEFAULT_UNIQUE_FOR)",
    "debounce_for": "no debounce for this call",
    "max_wait": "no cap",
}


def seconds_of(job: str, name: str, value: Any, args: Sequence[Any] | None,
               kwargs: Mapping[str, Any] | None) -> float | None:
    """The seconds of option ``name`` for one call of ``job`` (None: not set). ``value`` is
    the option as the job has it: seconds, None, or a function of the call's arguments."""
    if not callable(value):
        return None if value is None else float(value)
    found = value(*(args or ()), **(kwargs or {}))
    if found is None:
        return None
    if callable(found) or not is_seconds(found) or found <= 0:
        shown = "a function" if callable(found) else repr(found)
        raise InvalidJobConfiguration(
            f"{job}: {name}() returned {shown} for this call: it must be a number of seconds "
            f"above 0{not_finite(found)}. Return seconds, or None for "
            f"{NONE_MEANS.get(name, 'no limit')}.")
    return float(found)


def debounce_times(job: str, debounce_for: Any, max_wait: Any, args: Sequence[Any] | None,
                   kwargs: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """``(debounce_for, max_wait)`` of one call of ``job`` (a method's answer for it);
    debounce_for None: this call is not debounced. A cap below the quiet period is refused."""
    quiet = seconds_of(job, "debounce_for", debounce_for, args, kwargs)
    cap = seconds_of(job, "max_wait", max_wait, args, kwargs)
    if quiet is not None and cap is not None and cap < quiet:
        raise InvalidJobConfiguration(
            f"{job}: max_wait = {cap!r} is less than debounce_for = {quiet!r} for this call: "
            f"the cap would cut the burst short. Return a max_wait >= debounce_for, or None "
            f"for no cap.")
    return quiet, cap


def seconds_at_worker(job: str, name: str, value: Any, args: Sequence[Any] | None,
                      kwargs: Mapping[str, Any] | None, default: float) -> float:
    """:func:`seconds_of` where a run is already under way (a requeue's lock, a release's
    retry window): a bad answer, or None, gives ``default`` instead of raising, so that it
    never replaces what the run itself raised or returned."""
    try:
        found = seconds_of(job, name, value, args, kwargs)
    except InvalidJobConfiguration:
        return float(default)
    return float(default) if found is None else found
