"""System check E015: every job's store implements the protocols the job uses (issue 23).

The stores of the package have what their kind needs, or another check says why not (E014:
a throttled job on a store that cannot throttle). A store of your own, named in
``DEDUP_JOBS["STORES"]``, is checked here, protocol by protocol
(:mod:`dedup_jobs.stores.protocols`), so that a missing method is a clear error at
``manage.py check`` instead of a ``NotImplementedError`` at the first dispatch.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from dedup_jobs.checks import _error, registered_jobs


def needed(task: Any) -> dict[str, list[str]]:
    """What ``task`` uses: {store alias: [capability, ...]}."""
    from dedup_jobs.jobs.debounced import DebouncedJob
    from dedup_jobs.jobs.unique import UniqueJob

    uses: dict[str, list[str]] = {}
    if isinstance(task, DebouncedJob):
        uses.setdefault(task.store_alias(), []).append("debounce")
    elif isinstance(task, UniqueJob):
        lock = uses.setdefault(task.store_alias(), [])
        lock.append("locks")
        if task.on_duplicate in ("replace", "cancel_running"):
            lock.append("replace")
        if task.on_duplicate == "cancel_running":
            lock.append("cancel")
        if ((task.without_overlapping and task.release_on_start)
                or task.on_duplicate == "cancel_running"):
            lock.append("overlap")
    if task.throttled():
        uses.setdefault(task.throttle_alias(), []).append("throttle")
    return uses


def check_capabilities(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E015: a job whose store (one of DEDUP_JOBS["STORES"]) lacks a protocol it uses."""
    from dedup_jobs.conf import app_settings
    from dedup_jobs.stores import store_class_for
    from dedup_jobs.stores.protocols import CAPABILITIES, missing

    plugged = app_settings.STORES
    messages: list[checks.CheckMessage] = []
    for task in registered_jobs():
        try:
            uses = needed(task)
        except Exception:  # a via() method that fails is reported by the job check
            continue
        for alias, capabilities in sorted(uses.items()):
            if alias not in plugged:
                continue
            try:
                cls = store_class_for(alias)
            except Exception:  # a path that does not import: E004
                continue
            for capability in capabilities:
                absent = missing(cls, capability)
                if absent:
                    protocol = CAPABILITIES[capability].__name__
                    messages.append(_error(
                        15, f"{task.name}: its store {alias!r} ({plugged[alias]}) lacks the "
                            f"{capability!r} capability it uses: {protocol} needs "
                            f"{', '.join(absent)}.",
                        f"Implement {', '.join(absent)} on {cls.__name__} (see "
                        f"dedup_jobs.stores.protocols.{protocol}), or point {task.name} at a "
                        f"store that has them."))
    return messages


def register() -> None:
    checks.register(check_capabilities, "dedup_jobs")
