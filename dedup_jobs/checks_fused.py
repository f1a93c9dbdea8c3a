"""System check I001 (issue 26): where the fused dispatch is switched on (the Celery broker's
transport is ``dedup_jobs.transport:Transport``), which path each unique job's dispatch takes:
fused (the lock and the message in one round trip) or two round trips, and why. Silent when
the transport is not named: then every dispatch takes two round trips, as it always did.

The check reads the configuration only (it connects to nothing): broker and store are taken
for one server when their host and port (or socket path) are equal. At the first dispatch the
channel compares the servers' own ids (INFO's run_id) and falls back to two round trips if
they differ (logged once per job)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from dedup_jobs.checks import DOCS, registered_jobs

LOCAL = {"localhost": "127.0.0.1", "::1": "127.0.0.1"}


def _where(kwargs: dict[str, Any]) -> tuple[str, ...]:
    if kwargs.get("path"):
        return ("unix", str(kwargs["path"]))
    host = str(kwargs.get("host") or "127.0.0.1")
    return (LOCAL.get(host, host), str(kwargs.get("port") or 6379))


def _broker(app: Any) -> tuple[str, ...]:
    from kombu.utils.url import parse_url

    url = app.conf.broker_url or ""
    if url.startswith(("unix://", "redis+socket://")):
        return ("unix", url.split("://", 1)[1].split("?", 1)[0])
    parts = parse_url(url)
    return _where({"host": parts.get("hostname"), "port": parts.get("port")})


def path_of(task: Any) -> str:
    """"" when ``task``'s dispatches are fused, else why they take two round trips."""
    from dedup_jobs.jobs.fused import why_not_fused_job

    store = task.store(task.store_alias())
    why = why_not_fused_job(task, store)
    if why:
        return why
    kwargs = store.client.connection_pool.connection_kwargs
    broker, mine = _broker(task.app), _where(kwargs)
    if broker != mine:
        return (f"the broker ({':'.join(broker)}) and its store {store.alias!r} "
                f"({':'.join(mine)}) are different Redis servers")
    return ""


def check_fused(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """I001: the path of each unique job's dispatch, when the fused transport is named."""
    from dedup_jobs.jobs.fused import fused_transport
    from dedup_jobs.jobs.unique import UniqueJob

    jobs = [t for t in registered_jobs() if isinstance(t, UniqueJob)]
    if not jobs or not fused_transport(jobs[0].app):
        return []
    messages: list[checks.CheckMessage] = []
    for task in jobs:
        try:
            why = path_of(task)
        except Exception as exc:  # a store that cannot be made: its own check says why
            why = f"its store could not be read ({exc})"
        what = ("fused: the lock and the message in one round trip" if not why
                else f"two round trips per dispatch: {why}")
        if not why and task.on_duplicate == "return":
            what += "; dispatch_many: one round trip per batch"
        messages.append(checks.Info(
            f"{task.name}: {what}.",
            hint=f"The broker's transport is dedup_jobs.transport:Transport. {DOCS}",
            id="dedup_jobs.I001"))
    return messages


def register() -> None:
    checks.register(check_fused, "dedup_jobs")
