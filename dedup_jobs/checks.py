"""System checks (``dedup_jobs.E0xx`` / ``W0xx``); every id is listed in docs/checks.md."""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core import checks

from dedup_jobs.conf import (
    DEFAULTS,
    LIMITS_ON_STORE_ERROR_CHOICES,
    ON_STORE_ERROR_CHOICES,
    is_seconds,
    not_finite,
)
from dedup_jobs.exceptions import InvalidJobConfiguration

DOCS = "See docs/checks.md."


def _error(id_: int, msg: str, hint: str) -> checks.CheckMessage:
    return checks.Error(msg, hint=f"{hint} {DOCS}", id=f"dedup_jobs.E{id_:03d}")


def _warning(id_: int, msg: str, hint: str) -> checks.CheckMessage:
    return checks.Warning(msg, hint=f"{hint} {DOCS}", id=f"dedup_jobs.W{id_:03d}")


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    raw = getattr(settings, "DEDUP_JOBS", {})
    if not isinstance(raw, dict):
        return [_error(1, f"DEDUP_JOBS must be a dict, not {type(raw).__name__} ({raw!r}).",
                       "Set DEDUP_JOBS = {'STORE': 'default', ...} or remove it.")]
    errors: list[checks.CheckMessage] = []
    for name in sorted(set(raw) - set(DEFAULTS), key=repr):
        errors.append(_error(2, f"DEDUP_JOBS has an unknown key {name!r}.",
                             f"Known keys: {', '.join(sorted(DEFAULTS))}."))
    for name in SECONDS_SETTINGS:
        value = raw.get(name, DEFAULTS[name])
        if not is_seconds(value) or value <= 0:
            errors.append(_error(3, f"DEDUP_JOBS[{name!r}] = {value!r} is not a number of "
                                    f"seconds above 0{not_finite(value)}.",
                                 f"Set it to e.g. {DEFAULTS[name]}."))
    value = raw.get("ON_STORE_ERROR", DEFAULTS["ON_STORE_ERROR"])
    if value not in ON_STORE_ERROR_CHOICES:
        errors.append(_error(3, f"DEDUP_JOBS['ON_STORE_ERROR'] = {value!r} is not one of "
                                f"{ON_STORE_ERROR_CHOICES!r}.", "Use 'raise' or 'enqueue'."))
    value = raw.get("LIMITS_ON_STORE_ERROR", DEFAULTS["LIMITS_ON_STORE_ERROR"])
    if value not in LIMITS_ON_STORE_ERROR_CHOICES:
        errors.append(_error(3, f"DEDUP_JOBS['LIMITS_ON_STORE_ERROR'] = {value!r} is not one "
                                f"of {LIMITS_ON_STORE_ERROR_CHOICES!r}.",
                             "Use 'defer' (the default: a limit is never exceeded) or 'run'."))
    for name in ("KEY_PREFIX", "STORE", "DATABASE_ALIAS"):
        value = raw.get(name, DEFAULTS[name])
        if not isinstance(value, str) or not value:
            errors.append(_error(3, f"DEDUP_JOBS[{name!r}] = {value!r} must be a non-empty "
                                    f"string.", f"Default: {DEFAULTS[name]!r}."))
    stores = raw.get("STORES", DEFAULTS["STORES"])
    if not isinstance(stores, dict) or not all(
            isinstance(alias, str) and alias and isinstance(path, str)
            for alias, path in stores.items()):
        errors.append(_error(3, f"DEDUP_JOBS['STORES'] = {stores!r} must map store aliases to "
                                f"dotted paths (strings).",
                             "Use e.g. {'locks': 'myapp.stores.MyStore'}, or leave it out."))
    for name in ("SHOW_ARGS", "OBSERVE_ONLY", "METRICS"):
        value = raw.get(name, DEFAULTS[name])
        if not isinstance(value, bool):
            errors.append(_error(3, f"DEDUP_JOBS[{name!r}] = {value!r} must be True or False.",
                                 "Use a boolean."))
    value = raw.get("METRICS_FLUSH_SECONDS", DEFAULTS["METRICS_FLUSH_SECONDS"])
    if not is_seconds(value) or not 0 <= value <= 60:
        errors.append(_error(3, f"DEDUP_JOBS['METRICS_FLUSH_SECONDS'] = {value!r} is not a "
                                f"number of seconds from 0 to 60.",
                             "Set it to e.g. 30 (the Overview shows every process within it), "
                             "or 0 to keep no history."))
    problem = task_url_problem(raw.get("TASK_URL", DEFAULTS["TASK_URL"]))
    if problem:
        errors.append(_error(3, f"DEDUP_JOBS['TASK_URL'] = {raw.get('TASK_URL')!r} {problem}",
                             "Use e.g. 'http://flower:5555/task/{id}', or '' for no link."))
    return errors


#: the DEDUP_JOBS settings that are a finite number of seconds above 0 (A3, A4: NaN and the
#: infinities are E003 like 0 is); METRICS_FLUSH_SECONDS has a range of its own
SECONDS_SETTINGS = ("DEFAULT_UNIQUE_FOR", "LEASE_SECONDS", "STORE_TIMEOUT")


def task_url_problem(value: Any) -> str | None:
    """Why ``value`` cannot be the owner-link template of Held locks (None: it can)."""
    if value == "":
        return None
    if not isinstance(value, str):
        return "must be a string."
    if "{id}" not in value:
        return "has no {id} placeholder for the task id."
    try:
        value.format(id="x")
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        return f"is not a valid template ({exc!r}): only {{id}} may stand in braces."
    return None


def _store_aliases() -> dict[str, list[str]]:
    """Every store alias in use: the default one and each registered job's, with users."""
    from dedup_jobs.conf import app_settings

    used: dict[str, list[str]] = {}
    if isinstance(getattr(settings, "DEDUP_JOBS", {}), dict):
        used.setdefault(app_settings.STORE, []).append("DEDUP_JOBS['STORE']")
    for task in registered_jobs():
        try:
            used.setdefault(task.store_alias(), []).append(task.name)
            if task.throttled():  # T1: its limits' store (throttle_via) is in use too
                used.setdefault(task.throttle_alias(), []).append(task.name)
        except Exception:  # a via() method that fails is reported by the job check
            continue
    return used


def registered_jobs() -> list[Any]:
    """Every dedup job registered with the current Celery app (without finalizing it)."""
    from celery import current_app

    from dedup_jobs.jobs.base import DedupJob

    tasks = current_app.tasks if getattr(current_app, "finalized", False) else {}
    return sorted((t for t in tasks.values() if isinstance(t, DedupJob)), key=lambda t: t.name)


def check_stores(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from dedup_jobs.stores import redis_fallback, store_class_for
    from dedup_jobs.stores.cache import LOCAL_BACKEND, MEMCACHED_BACKEND, NON_ATOMIC_BACKENDS
    from dedup_jobs.stores.redis.adapters import FALLBACK_HINT, adapter_for, fallback_message

    messages: list[checks.CheckMessage] = []
    caches = getattr(settings, "CACHES", {})
    for alias, users in sorted(_store_aliases().items()):
        who = ", ".join(users)
        try:
            store_class_for(alias)
        except InvalidJobConfiguration as exc:
            messages.append(_error(4, f"Unsupported dedup_jobs store {alias!r} (used by "
                                      f"{who}): {exc}", "Use a django-redis cache, another "
                                      "real cache, or 'database'."))
            continue
        backend = caches.get(alias, {}).get("BACKEND", "")
        adapter = adapter_for(backend) if alias in caches else None
        if backend in NON_ATOMIC_BACKENDS:
            messages.append(_warning(1, f"dedup_jobs store {alias!r} ({backend}, used by {who}) "
                                        f"is not atomic: two dispatches racing for one key can "
                                        f"both publish.", "Use django-redis or the 'database' "
                                        "store for locks that must hold under concurrency."))
        elif adapter is not None:
            problem = redis_fallback(alias, adapter.backend)
            if problem is not None:
                messages.append(_warning(6, f"{fallback_message(alias, problem)} (used by "
                                            f"{who})", FALLBACK_HINT))
            timeout = adapter.socket_timeout(caches[alias].get("OPTIONS") or {})
            messages.extend(_check_socket_timeout(alias, timeout, adapter.backend, who))
        elif backend == MEMCACHED_BACKEND:
            messages.extend(_check_memcached_timeout(alias, caches[alias], who))
        elif backend == LOCAL_BACKEND:
            messages.append(_warning(2, f"dedup_jobs store {alias!r} (LocMemCache, used by "
                                        f"{who}) keeps locks inside one process: workers and "
                                        f"web processes do not see each other's locks.",
                                     "Use django-redis or the 'database' store in production."))
    return messages


def _check_socket_timeout(alias: str, timeout: Any, backend: str, who: str) -> list[Any]:
    """W005 (S8): the cache's own operations can wait longer than a dedup_jobs decision may.
    The store bounds its own calls by STORE_TIMEOUT whatever the cache says. ``timeout``: the
    socket timeout the cache's OPTIONS set (``SOCKET_TIMEOUT`` on django-redis and
    django-valkey, ``socket_timeout`` on Django's own RedisCache)."""
    from dedup_jobs.conf import app_settings
    from dedup_jobs.stores.redis.adapters import DJANGO_BUILTIN

    names = (("socket_timeout", "socket_connect_timeout") if backend == DJANGO_BUILTIN
             else ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT"))
    limit = app_settings.STORE_TIMEOUT
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout <= limit:
        return []
    said = f"sets no {names[0]}" if timeout is None else f"sets {names[0]} = {timeout!r}"
    return [_warning(5, f"CACHES[{alias!r}] (used by {who}) {said}: its own cache calls can "
                        f"wait longer than DEDUP_JOBS['STORE_TIMEOUT'] = {limit!r} s. dedup_jobs "
                        f"bounds its decisions by STORE_TIMEOUT on a connection of its own.",
                     f"Set CACHES[{alias!r}]['OPTIONS'][{names[0]!r}] (and {names[1]}) to at "
                     f"most {limit!r}, so that the cache's own calls fail as fast.")]


def _check_memcached_timeout(alias: str, cache: dict[str, Any], who: str) -> list[Any]:
    """W005 (S8) for PyMemcacheCache: pymemcache waits forever unless the cache's OPTIONS set
    ``timeout`` and ``connect_timeout`` (Django sets neither). The store bounds its own."""
    from dedup_jobs.conf import app_settings

    options = cache.get("OPTIONS") or {}
    limit = app_settings.STORE_TIMEOUT
    loose = []
    for name in ("timeout", "connect_timeout"):
        value = options.get(name)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                and 0 < value <= limit):
            loose.append(f"no {name!r}" if value is None else f"{name!r} = {value!r}")
    if not loose:
        return []
    return [_warning(5, f"CACHES[{alias!r}] (PyMemcacheCache, used by {who}) sets "
                        f"{' and '.join(loose)} in OPTIONS: its own cache calls can wait "
                        f"longer than DEDUP_JOBS['STORE_TIMEOUT'] = {limit!r} s (pymemcache "
                        f"waits forever by default). dedup_jobs bounds its decisions by "
                        f"STORE_TIMEOUT on connections of its own.",
                     f"Set CACHES[{alias!r}]['OPTIONS']['timeout'] and ['connect_timeout'] to "
                     f"at most {limit!r}, so that the cache's own calls fail as fast.")]


def check_jobs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for task in registered_jobs():
        try:
            type(task).validate_options()
        except InvalidJobConfiguration as exc:
            messages.append(_error(5, str(exc), f"Fix the options of {task.name}."))
    return messages


def check_debounce(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A3: the debounce options each registered DebouncedJob really has (Celery's
    task_annotations or code can change them after the class was validated)."""
    from dedup_jobs.jobs.debounced import DebouncedJob, debounce_problem

    messages: list[checks.CheckMessage] = []
    for task in registered_jobs():
        if not isinstance(task, DebouncedJob):
            continue
        try:
            type(task).validate_options()
        except InvalidJobConfiguration:
            continue  # the class itself is wrong: reported as E005
        debounce_for, max_wait = task.debounce_for, task.max_wait
        problem = debounce_problem(debounce_for, max_wait)
        if problem is None:
            continue
        if problem.startswith("max_wait"):
            messages.append(_error(8, f"{task.name}: {problem}",
                                   f"Set {task.name}.max_wait to at least {debounce_for!r}."))
        else:
            messages.append(_error(7, f"{task.name}: {problem}",
                                   f"Set {task.name}.debounce_for to a number of seconds."))
    return messages


FLOW_OPTIONS = ("without_overlapping", "observe_only", "cancel_terminates")


def check_flow(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """R1-R3 options each registered job really has (task_annotations or code can change
    them after the class was validated): E009 flow-control options on a DebouncedJob, E010 a
    bad on_duplicate, E011 a without_overlapping / observe_only that is not a bool, W007
    without_overlapping on a UniqueJob (no effect there), W008 replace without a result to
    mark REVOKED, W009 DEDUP_JOBS["OBSERVE_ONLY"] beside DebouncedJobs (they still debounce)."""
    from dedup_jobs.conf import app_settings
    from dedup_jobs.jobs.debounced import DebouncedJob
    from dedup_jobs.jobs.unique import ON_DUPLICATE_CHOICES, UniqueJob

    messages: list[checks.CheckMessage] = []
    jobs = registered_jobs()
    debounced = [task.name for task in jobs if isinstance(task, DebouncedJob)]
    if debounced and app_settings.OBSERVE_ONLY:
        messages.append(_warning(9, f"DEDUP_JOBS['OBSERVE_ONLY'] = True does not reach "
                                    f"{', '.join(debounced)}: observe-only mode is for the "
                                    f"unique kinds, a DebouncedJob still merges a burst into "
                                    f"one run.", "Roll a DebouncedJob out by dispatching it "
                                    "as a plain task first, or accept that it debounces."))
    for task in jobs:
        if isinstance(task, DebouncedJob):
            for name in (*FLOW_OPTIONS, "on_duplicate"):
                value = getattr(task, name, None)
                if value not in (None, False):
                    messages.append(_error(
                        9, f"{task.name}: {name} = {value!r} has no meaning on a "
                           f"DebouncedJob (a burst already runs once, after its last "
                           f"dispatch).", f"Remove {name} from {task.name}, or make it a "
                           f"UniqueUntilProcessingJob."))
            continue
        if not isinstance(task, UniqueJob):
            continue
        if task.on_duplicate not in ON_DUPLICATE_CHOICES:
            messages.append(_error(10, f"{task.name}: on_duplicate = {task.on_duplicate!r} is "
                                       f"not one of {ON_DUPLICATE_CHOICES!r}.",
                                   f"Set {task.name}.on_duplicate to one of them."))
        for name in FLOW_OPTIONS:
            value = getattr(task, name)
            if not (isinstance(value, bool) or (name == "observe_only" and value is None)):
                messages.append(_error(11, f"{task.name}: {name} = {value!r} is not True or "
                                           f"False.", f"Set {task.name}.{name} to True or "
                                           f"False."))
        if task.on_duplicate in ("replace", "cancel_running") and _no_result(task):
            messages.append(_warning(8, f"{task.name}: on_duplicate = "
                                        f"{task.on_duplicate!r} without a "
                                        f"result to mark REVOKED ({_no_result(task)}): a "
                                        f"replaced message that reaches a worker after the "
                                        f"lock is free again runs.", "Keep a result backend "
                                        f"and ignore_result = False on {task.name}, or use "
                                        f"on_duplicate = 'return'."))
        if task.without_overlapping and not task.release_on_start:
            messages.append(_warning(7, f"{task.name}: without_overlapping = True on a "
                                        f"UniqueJob changes nothing: its lock is held while "
                                        f"it runs, so no second run can start beside it.",
                                     "Use UniqueUntilProcessingJob for 'one queued and one "
                                     "running', or drop the option."))
    return messages


def _no_result(task: Any) -> str:
    """Why the worker cannot see that ``task``'s message was replaced (R1): "" if it can."""
    from celery.backends.base import DisabledBackend

    if task.ignore_result:
        return "ignore_result = True"
    if isinstance(task.backend, DisabledBackend):
        return "no result backend is configured"
    return ""


def check_throttle(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """T1-T3 options each registered job really has (task_annotations or code can change
    them after the class was validated): E012 a bad concurrency, E013 a rate that does not
    parse, E014 a throttled job on a store that cannot throttle."""
    from dedup_jobs.engine.throttle import concurrency_problem, rate_problem
    from dedup_jobs.stores import get_store

    messages: list[checks.CheckMessage] = []
    for task in registered_jobs():
        problem = concurrency_problem(getattr(task, "concurrency", None))
        if problem:
            messages.append(_error(12, f"{task.name}: {problem}",
                                   f"Set {task.name}.concurrency to 1 or more, or None."))
        problem = rate_problem(getattr(task, "throttle", None))
        if problem:
            messages.append(_error(13, f"{task.name}: {problem}",
                                   f"Set {task.name}.throttle to e.g. \"10/s\", or None."))
        if not task.throttled():
            continue
        try:
            alias = task.throttle_alias()
            store = get_store(alias)
        except Exception:
            continue  # an unknown store: reported as E004
        if not store.can_throttle:
            messages.append(_error(
                14, f"{task.name}: its throttle store {alias!r} ({type(store).__name__}) "
                    f"cannot throttle: only the Redis-family stores and the database store "
                    f"take a throttle decision in one atomic round trip.",
                f"Set {task.name}.throttle_via to a Redis cache alias or \"database\"."))
    return messages


def check_django_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """K3: unique and debounced Django tasks whose backend cannot run them (E016) or whose
    worker cannot run the worker-side check (W010) (only
    when a module of this process made one: Django tasks are not discovered like Celery's)."""
    if "dedup_jobs.django_tasks.tasks" not in sys.modules:
        return []
    from dedup_jobs.django_tasks.checks import check_backends

    return check_backends(_error, _warning)


def register() -> None:
    checks.register(check_settings, "dedup_jobs")
    checks.register(check_django_tasks, "dedup_jobs")
    checks.register(check_stores, "dedup_jobs")
    checks.register(check_jobs, "dedup_jobs")
    checks.register(check_debounce, "dedup_jobs")
    checks.register(check_flow, "dedup_jobs")
    checks.register(check_throttle, "dedup_jobs")
