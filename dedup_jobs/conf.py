"""The ``DEDUP_JOBS`` setting, read once and read again whenever Django reports it changed
(``setting_changed``: ``override_settings`` and ``settings`` fixtures), so the dispatch path
does not look it up on every call."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    # Store used by jobs that name none: a CACHES alias, or "database" for the JobLock model.
    "STORE": "default",
    # First part of every key: {KEY_PREFIX}:unique:{task}:{id}.
    "KEY_PREFIX": "dedup_jobs",
    # Lock lifetime (seconds) of a job that names no unique_for: the fail-safe expiry.
    "DEFAULT_UNIQUE_FOR": 3600,
    # A running job's lock lives this long and is renewed every third of it while the worker
    # process is alive; a killed worker's lock is gone within this time.
    "LEASE_SECONDS": 60,
    # "raise": a dispatch while the store is down raises StoreUnavailable.
    # "enqueue": it publishes without a lock and logs a warning.
    "ON_STORE_ERROR": "raise",
    # W7: a concurrency, throttle or without_overlapping admission that cannot reach the
    # store: "defer" re-publishes the message (a limit is never exceeded because the store
    # blinked); "run" runs it (logged), beside the limit if need be.
    "LIMITS_ON_STORE_ERROR": "defer",
    # Seconds a store call may take in all (S8), also when the cache sets no socket timeout:
    # past it the call is StoreUnavailable, and whatever it may have left is cleaned up.
    "STORE_TIMEOUT": 5.0,
    # Stores of your own: {alias: dotted path of a dedup_jobs.stores.BaseStore subclass}. An
    # alias named here wins over a CACHES alias of that name and over "database".
    "STORES": {},
    # The database alias the "database" store writes to.
    "DATABASE_ALIAS": "default",
    # Show job arguments in the admin (escaped and truncated).
    "SHOW_ARGS": True,
    # R3: every job's decisions are taken and reported (signals with observed=True, logs) but
    # nothing is dropped, deferred, replaced or raised. A job's own observe_only wins.
    "OBSERVE_ONLY": False,
    # A5: count every decision in-process (no store round trip) and export the counts through
    # prometheus_client / OpenTelemetry when installed; the admin Overview reads them too.
    "METRICS": True,
    # Seconds between two flushes of a process's counts into the admin Overview's history
    # (a daemon thread, off the decision path); 0: no flush thread (no history kept).
    "METRICS_FLUSH_SECONDS": 30.0,
    # Held locks link an owner task id to this URL ("{id}" is replaced by the task id), e.g.
    # "http://flower:5555/task/{id}". Empty: django_celery_results' admin page when that app
    # is installed, else no link.
    "TASK_URL": "",
}

ON_STORE_ERROR_CHOICES = ("raise", "enqueue")
LIMITS_ON_STORE_ERROR_CHOICES = ("defer", "run")


class AppSettings:
    """Typed view of ``settings.DEDUP_JOBS``; every key is optional."""

    def __init__(self) -> None:
        self._raw: dict[str, Any] | None = None

    @property
    def raw(self) -> dict[str, Any]:
        raw = self._raw
        if raw is None:
            value = getattr(settings, "DEDUP_JOBS", None)
            raw = self._raw = value if isinstance(value, dict) else {}
        return raw

    def reload(self) -> None:
        """Read ``settings.DEDUP_JOBS`` again on next use (after changing it in place)."""
        self._raw = None

    def _get(self, name: str) -> Any:
        return self.raw.get(name, DEFAULTS[name])

    @property
    def STORE(self) -> str:
        return str(self._get("STORE"))

    @property
    def KEY_PREFIX(self) -> str:
        return str(self._get("KEY_PREFIX"))

    @property
    def DEFAULT_UNIQUE_FOR(self) -> float:
        return float(self._get("DEFAULT_UNIQUE_FOR"))

    @property
    def LEASE_SECONDS(self) -> float:
        return float(self._get("LEASE_SECONDS"))

    @property
    def ON_STORE_ERROR(self) -> str:
        return str(self._get("ON_STORE_ERROR"))

    @property
    def LIMITS_ON_STORE_ERROR(self) -> str:
        return str(self._get("LIMITS_ON_STORE_ERROR"))

    @property
    def STORE_TIMEOUT(self) -> float:
        return float(self._get("STORE_TIMEOUT"))

    @property
    def STORES(self) -> dict[str, Any]:
        value = self._get("STORES")
        return value if isinstance(value, dict) else {}

    @property
    def DATABASE_ALIAS(self) -> str:
        return str(self._get("DATABASE_ALIAS"))

    @property
    def SHOW_ARGS(self) -> bool:
        return bool(self._get("SHOW_ARGS"))

    @property
    def OBSERVE_ONLY(self) -> bool:
        return bool(self._get("OBSERVE_ONLY"))

    @property
    def METRICS(self) -> bool:
        return bool(self._get("METRICS"))

    @property
    def METRICS_FLUSH_SECONDS(self) -> float:
        return float(self._get("METRICS_FLUSH_SECONDS"))

    @property
    def TASK_URL(self) -> str:
        return str(self._get("TASK_URL") or "")


app_settings = AppSettings()


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "DEDUP_JOBS":
        app_settings.reload()


setting_changed.connect(_reload, weak=False, dispatch_uid="dedup_jobs.conf.reload")


#: the most seconds an option or setting may be: 100 years. A lock or a burst must fit every
#: store (Redis counts its lifetime in ms from now, the database store keeps a datetime); a
#: longer one would fail at the store as an error that reads like an outage.
MAX_SECONDS = 100 * 365 * 24 * 3600


def is_seconds(value: Any) -> bool:
    """Whether ``value`` is a finite number, an int or a float (a bool, NaN or an infinity is
    not), of at most MAX_SECONDS: what every option and setting in seconds must be (A4)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value <= MAX_SECONDS)


def not_finite(value: Any) -> str:
    """Words to add to an error about ``value`` when it is NaN, an infinity or more than
    MAX_SECONDS, else ""."""
    if isinstance(value, float) and not math.isfinite(value):
        return " (NaN and the infinities are not: they fail at the first dispatch)"
    if (not isinstance(value, bool) and isinstance(value, (int, float))
            and value > MAX_SECONDS):
        return f" and at most {MAX_SECONDS} (100 years: no store keeps a key longer)"
    return ""
